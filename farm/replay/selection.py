"""Selection policies and the loop that runs them (hipDNN heuristics RFC, in Python).

A policy orders the candidate engines for a problem, or declines:

    class MyPolicy:
        name = "MyCompany::Fastest"          # canonical name
        id = policy_name_to_id(name)          # FNV-1a-64, signed
        api_version = (1, 0)                   # the major must be POLICY_API_VERSION's
        def session(self, device_properties: bytes) -> Session: ...   # once per device (FlatBuffer bytes)

    class Session:
        def order(self, candidates: Sequence[int], problem: bytes) -> Sequence[int] | Choice | None: ...

``order`` receives the candidate engine ids and the serialized problem
(FlatBuffer bytes) and returns a permutation or subset of the candidates (or a
``Choice`` that also carries knobs), or ``None`` to decline. Output that is not
a permutation or subset of the input is rejected by the host (logged, and
treated as a decline).

The loop tries policies in order; every policy starts from the original
candidates; the first that does not decline wins; when all decline, a clear
error (no hidden fallback). The order comes from FARM_HEUR_POLICY_ORDER
(comma-separated names or signed int64 ids), else the caller, else
``[SelectionHeuristic::Config, SelectionHeuristic::StaticOrdering]``. A
preferred engine, when given, moves to the front afterwards.

Policies are found like engines: built-ins of this checkout first, then entry
points of group ``farm.policies``. A plugin with another API major, an id that
is not the hash of its name, or a duplicate id is rejected at load with a
logged reason.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from farm.devices.fb import encode_device_properties, encode_problem
from farm.devices.properties import DeviceProperties
from farm.errors import FarmError
from farm.model.ids import policy_name_to_id
from farm.model.knobs import KnobSettings
from farm.model.problem import Problem

log = logging.getLogger("farm.replay.selection")

POLICY_API_VERSION = (1, 0)
ENTRY_POINT_GROUP = "farm.policies"
BUILTIN_POLICY_MODULES: tuple[str, ...] = ("policies.config", "policies.static")
NATIVE_POLICY_MODULE = "policies.native"  # loads C ABI heuristic plugins (shared libraries)
ORDER_ENV = "FARM_HEUR_POLICY_ORDER"
HIPDNN_ORDER_ENV = "HIPDNN_HEUR_POLICY_ORDER"  # hipDNN's own name: read when ours says nothing
ORDER_ENVS = (ORDER_ENV, HIPDNN_ORDER_ENV)
_DECIMAL_ID = re.compile(r"[+-]?[0-9]+")
CONFIG = "SelectionHeuristic::Config"
STATIC_ORDERING = "SelectionHeuristic::StaticOrdering"
DEFAULT_ORDER = (CONFIG, STATIC_ORDERING)


@dataclass(frozen=True)
class Choice:
    """A policy's answer: an order of candidates, and the knobs to use for some of them."""

    order: tuple[int, ...]
    knobs: Mapping[int, KnobSettings] = field(default_factory=dict)


@runtime_checkable
class Session(Protocol):
    def order(self, candidates: Sequence[int], problem: bytes) -> Sequence[int] | Choice | None: ...


@runtime_checkable
class Policy(Protocol):
    name: str
    id: int
    api_version: tuple[int, int]

    def session(self, device_properties: bytes) -> Session: ...


class NoSelection(FarmError, RuntimeError):
    """Every policy declined (or was rejected): there is no engine to run."""


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    id: int
    api_version: tuple[int, int]
    origin: str  # "built-in" or "plugin <entry point> (<value>)"


class PolicyRegistry:
    """Loaded policies by id, in load order (built-ins first)."""

    def __init__(self) -> None:
        self._by_id: dict[int, Policy] = {}
        self._info: dict[int, PolicyInfo] = {}
        self.rejected: list[tuple[str, str]] = []  # (where, why)

    @classmethod
    def default(cls, *, entry_points: bool = True) -> "PolicyRegistry":
        reg = cls()
        for module in BUILTIN_POLICY_MODULES:
            for policy in importlib.import_module(module).POLICIES:
                reg.register(policy, origin="built-in", strict=True)
        if entry_points:
            reg.load_entry_points()
        # shared libraries with the heuristics RFC's C ABI (FARM_HEUR_PLUGIN_PATH, HIPDNN_HEURISTIC_PLUGIN_DIR)
        importlib.import_module(NATIVE_POLICY_MODULE).load_plugins(reg)
        return reg

    def register(self, policy: Any, *, origin: str = "registered", strict: bool = False) -> bool:
        """Add a policy; a wrong one is rejected with a logged reason (raised when ``strict``)."""
        reason = self._problem_with(policy)
        if reason:
            where = f"{getattr(policy, 'name', policy)!r} from {origin}"
            if strict:
                raise ValueError(f"policy {where} rejected: {reason}")
            log.warning("policy %s rejected: %s", where, reason)
            self.rejected.append((where, reason))
            return False
        self._by_id[policy.id] = policy
        self._info[policy.id] = PolicyInfo(policy.name, policy.id, tuple(policy.api_version), origin)
        return True

    def _problem_with(self, policy: Any) -> str:
        for attr in ("name", "id", "api_version", "session"):
            if not hasattr(policy, attr):
                return f"missing {attr}"
        if not isinstance(policy.name, str) or not policy.name:
            return "the name must be a non-empty string"
        major = tuple(policy.api_version)[0] if policy.api_version else None
        if major != POLICY_API_VERSION[0]:
            return f"API version {tuple(policy.api_version)} has major {major}; this host speaks {POLICY_API_VERSION[0]}.x"
        if getattr(policy, "named", True) and policy.id != policy_name_to_id(policy.name):
            return f"id {policy.id} is not policy_name_to_id({policy.name!r}) = {policy_name_to_id(policy.name)}"
        if policy.id in self._by_id:
            return f"duplicate id {policy.id} (already loaded: {self._info[policy.id].name} from {self._info[policy.id].origin})"
        return ""

    def load_entry_points(self) -> None:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.value.split(":")[0] in BUILTIN_POLICY_MODULES:
                continue
            origin = f"plugin {ep.name} ({ep.value})"
            try:
                obj = ep.load()
                policies = obj if isinstance(obj, (list, tuple)) else [obj() if isinstance(obj, type) else obj]
            except Exception as exc:
                log.warning("policy plugin %s not loaded: %s: %s", origin, type(exc).__name__, exc)
                self.rejected.append((origin, f"{type(exc).__name__}: {exc}"))
                continue
            for policy in policies:
                self.register(policy, origin=origin)

    def __iter__(self) -> Iterable[Policy]:
        return iter(self._by_id.values())

    def info(self) -> list[PolicyInfo]:
        return list(self._info.values())

    def find(self, token: str | int) -> Policy | None:
        """A policy by name or id; a string is an id only when it is a whole signed decimal int64
        (``-42``, ``+7``; not ``1_0``, ``0x10`` or other scripts' digits: those are names)."""
        if isinstance(token, int):
            return self._by_id.get(token)
        text = token.strip()
        if _DECIMAL_ID.fullmatch(text) and -2**63 <= int(text) < 2**63:
            return self._by_id.get(int(text))
        return self._by_id.get(policy_name_to_id(text)) if text else None


@functools.lru_cache(maxsize=1)
def default_policy_registry() -> PolicyRegistry:
    return PolicyRegistry.default()


def resolve_order(registry: PolicyRegistry, order: Sequence[str | int] | None = None) -> list[Policy]:
    """Env FARM_HEUR_POLICY_ORDER, else HIPDNN_HEUR_POLICY_ORDER > ``order`` > the default; unknown names or ids
    are skipped (logged)."""
    tokens: Sequence[str | int] = []
    source = ""
    for name in ORDER_ENVS:  # a value of blanks and separators only says nothing: the next source answers
        tokens = [t for t in os.environ.get(name, "").split(",") if t.strip()]
        if tokens:
            source = name
            break
    if not tokens and order:
        tokens, source = order, "the caller's order"
    elif not tokens:
        tokens, source = DEFAULT_ORDER, "the default order"
    out: list[Policy] = []
    for tok in tokens:
        policy = registry.find(tok)
        if policy is None:
            log.warning("selection: %r in %s names no loaded policy; skipped", tok, source)
        elif policy not in out:  # a policy asked again would answer as it did the first time
            out.append(policy)
    return out


@dataclass(frozen=True)
class Selection:
    order: tuple[int, ...]
    policy: str  # the name of the policy that answered
    knobs: Mapping[int, KnobSettings] = field(default_factory=dict)

    @property
    def engine_id(self) -> int:
        return self.order[0]


class Selector:
    """The outer loop for one device: policies in order, first success wins."""

    def __init__(self, properties: DeviceProperties, *, order: Sequence[str | int] | None = None,
                 registry: PolicyRegistry | None = None, preferred_engine_id: int | None = None) -> None:
        self.registry = registry or default_policy_registry()
        self.policies = resolve_order(self.registry, order)
        self.preferred_engine_id = preferred_engine_id
        self._props_fb = encode_device_properties(properties)
        self._sessions: dict[int, Session] = {}
        self._problem_fb: dict[str, bytes] = {}

    def _session(self, policy: Policy) -> Session:
        s = self._sessions.get(policy.id)
        if s is None:
            s = policy.session(self._props_fb)
            self._sessions[policy.id] = s
        return s

    def problem_bytes(self, problem: Problem) -> bytes:
        b = self._problem_fb.get(problem.key)
        if b is None:
            b = self._problem_fb[problem.key] = encode_problem(problem)
        return b

    def select(self, problem: Problem | bytes, candidates: Sequence[int]) -> Selection:
        if not candidates:
            raise NoSelection("no candidate engines to select from")
        fb = problem if isinstance(problem, bytes) else self.problem_bytes(problem)
        original = tuple(candidates)
        reasons = []
        for policy in self.policies:
            try:
                answer = self._session(policy).order(original, fb)
            except Exception as exc:
                reasons.append(f"{policy.name}: raised {type(exc).__name__}: {exc}")
                log.warning("selection: policy %s raised %s: %s", policy.name, type(exc).__name__, exc)
                continue
            if answer is None:
                reasons.append(f"{policy.name}: declined")
                continue
            choice = answer if isinstance(answer, Choice) else Choice(tuple(answer))
            bad = _invalid(choice.order, original)
            if bad:
                reasons.append(f"{policy.name}: output rejected ({bad})")
                log.error("selection: policy %s returned %s: %s; output rejected", policy.name, list(choice.order), bad)
                continue
            chosen = list(choice.order)
            if self.preferred_engine_id is not None and self.preferred_engine_id in chosen:
                chosen.remove(self.preferred_engine_id)
                chosen.insert(0, self.preferred_engine_id)
            return Selection(tuple(chosen), policy.name, dict(choice.knobs))
        if not self.policies:
            raise NoSelection("no selection policy is loaded in the requested order "
                              f"({os.environ.get(ORDER_ENV) or os.environ.get(HIPDNN_ORDER_ENV) or 'default'})")
        raise NoSelection("every selection policy declined: " + "; ".join(reasons))


    def select_for_call(self, problem: Problem | bytes, candidates: Sequence[int], call: str) -> Selection | None:
        """A decision recorded for production calls of kind ``call`` ("graph"), from the first policy in order
        that has one (a policy opts in with ``order_for_call(candidates, problem, call)``); None when none does:
        the caller uses what :meth:`select` chose."""
        if not candidates:
            return None
        fb = problem if isinstance(problem, bytes) else self.problem_bytes(problem)
        original = tuple(candidates)
        for policy in self.policies:
            ask = getattr(self._session(policy), "order_for_call", None)
            if ask is None:
                continue
            try:
                answer = ask(original, fb, call)
            except Exception as exc:
                log.warning("selection: policy %s raised %s: %s", policy.name, type(exc).__name__, exc)
                continue
            if answer is None:
                continue
            choice = answer if isinstance(answer, Choice) else Choice(tuple(answer))
            if _invalid(choice.order, original):
                continue
            return Selection(tuple(choice.order), policy.name, dict(choice.knobs))
        return None


def _invalid(order: Sequence[int], candidates: Sequence[int]) -> str:
    if not order:
        return "empty"
    allowed = set(candidates)
    extra = [x for x in order if x not in allowed]
    if extra:
        return f"engine ids not among the candidates: {extra}"
    if len(set(order)) != len(order):
        return "an engine id appears twice"
    return ""
