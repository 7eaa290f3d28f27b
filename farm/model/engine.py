"""The engine contract, engine configs, and the engine registry.

An engine implements one or more op kinds. The tuner never asks an engine to
time itself: it compiles a plan from (problem, knobs, device) and times
``plan.run`` with its own timer.

Engines are found in three places, in this order:
1. built-in modules of this checkout (``engines.cpu``...), importable with
   ``PYTHONPATH=.`` and no install;
2. entry points in group ``farm.engines`` of installed distributions (an entry
   point names an engine object or an iterable of them);
3. engines registered by hand with :meth:`EngineRegistry.register`.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from farm.errors import UnknownNameError
from farm.model.ids import engine_name_to_id
from farm.model.knobs import BENCHMARKING_KNOB, Knob, KnobSettings, KnobValue, resolve

if TYPE_CHECKING:
    from farm.devices.device import Device
    from farm.model.problem import Problem

log = logging.getLogger("farm.model.engine")

ENTRY_POINT_GROUP = "farm.engines"
# Built-in engine modules; each exposes ENGINES (an iterable of engine objects).
BUILTIN_ENGINE_MODULES: tuple[str, ...] = ("engines.cpu", "engines.gpu", "engines.sim")


@dataclass(frozen=True)
class Support:
    """Whether an engine applies to a problem on a device, and if not, why."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    @staticmethod
    def yes() -> "Support":
        return Support(True)

    @staticmethod
    def no(reason: str) -> "Support":
        return Support(False, reason)


@runtime_checkable
class Plan(Protocol):
    """A compiled plan spec, ready to execute."""

    workspace_size: int

    def run(self, tensors: Mapping[str, Any], workspace: Any, stream: Any) -> None:
        """Compute the outputs in ``tensors`` from its inputs; may use ``workspace``."""


@runtime_checkable
class Engine(Protocol):
    """What an engine plugin provides (README "Writing an engine"; plugins import it from farm.plugin)."""

    name: str
    ops: frozenset[str]
    knobs: tuple[Knob, ...]
    supports_exhaustive: bool

    def applicable(self, problem: "Problem", device: "Device") -> Support: ...

    def estimate_workspace(self, problem: "Problem", knobs: Mapping[str, KnobValue]) -> int: ...

    def compile(self, problem: "Problem", knobs: Mapping[str, KnobValue], device: "Device") -> Plan: ...



# -- optional capabilities: an engine has one when it has the method (or attribute) ----------------
@runtime_checkable
class KnobAware(Protocol):
    """Says whether these knob values apply here (e.g. an attention backend); sweeps and variants leave
    out those that do not."""

    def knob_support(self, problem: "Problem", device: "Device", knobs: Mapping[str, KnobValue]) -> Support: ...


@runtime_checkable
class CompileKeyed(Protocol):
    """Names the artifact a compile leaves in a cache shared by a host's processes (Triton's disk cache),
    so workers on one host compile it once (farm.tuner.compile_claims); None: nothing shared."""

    def compile_key(self, problem: "Problem", knobs: Mapping[str, KnobValue], device: "Device") -> str | None: ...


@runtime_checkable
class Preparable(Protocol):
    """Starts what helps its compiles in a tuning process (a compile pool); ``device_kind`` is "gpu",
    "cpu" or "sim". Called again for every task: it must be idempotent."""

    def prepare(self, device_kind: str) -> None: ...


@runtime_checkable
class PlanListing(Protocol):
    """An engine whose library lists its own plans for a problem (cuDNN's execution plans, cuBLASLt's
    algorithms): each listed knob setting is a candidate beside the engine's defaults. Runs where the
    device is; the list must be the same for the same problem, device and library (resume relies on it)."""

    def list_plans(self, problem: "Problem", device: "Device") -> Sequence[Mapping[str, KnobValue]]: ...


@dataclass(frozen=True)
class DirectCall:
    """The library call a user makes for a problem without the farm: ``fn(*tensors, *args, **kwargs)``, the
    problem's tensors named in ``tensors`` (``torch.matmul(A, B)``, ``F.conv2d(X, W, None, stride, padding,
    dilation, groups)``, ``np.matmul(A, B)``). The confirmation stage times it as the default's calls, and
    ``farm verify`` compares every replayed decision with it: a winner must beat the plain call, not the farm's
    own wrapper of it."""

    fn: Any
    tensors: tuple[str, ...]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""  # how a person would write it: "torch.matmul(A, B)"

    def bind(self, tensors: Mapping[str, Any]) -> Any:
        """The call on these tensors as a function of no arguments."""
        return functools.partial(self.fn, *[tensors[t] for t in self.tensors], *self.args, **self.kwargs)


@runtime_checkable
class DirectCallable(Protocol):
    """Knows the plain library call a user makes for a problem (usually the default engine of its op: the
    call the farm's default wraps); None where there is none to make (a batched matmul with a bias)."""

    def direct_call(self, problem: "Problem", device: "Device") -> DirectCall | None: ...


@runtime_checkable
class Prioritized(Protocol):
    """A static preference, lower first (StaticOrdering); engines without one count as 100."""

    priority: int


def engine_id(engine: Engine) -> int:
    return engine_name_to_id(engine.name)


def engine_priority(engine: Engine) -> int:
    """Static preference (lower first) an engine may declare; 100 when it declares none."""
    return int(engine.priority) if isinstance(engine, Prioritized) else 100


def engine_knobs(engine: Engine) -> tuple[Knob, ...]:
    """The engine's knobs, with the benchmarking knob for exhaustive-capable engines."""
    knobs = tuple(engine.knobs)
    if engine.supports_exhaustive and not any(k.name == BENCHMARKING_KNOB for k in knobs):
        knobs += (Knob.int(BENCHMARKING_KNOB, 0, choices=(0, 1), doc="prime engine caches (EXHAUSTIVE mode)"),)
    return knobs


def user_knobs(engine: Engine) -> tuple[Knob, ...]:
    """Knobs a user may set (everything but the benchmarking knob)."""
    return tuple(k for k in engine.knobs if k.name != BENCHMARKING_KNOB)


@dataclass(frozen=True)
class EngineConfig:
    """Read-only snapshot of an engine for one problem on one device (the RFC's EngineConfigInfo)."""

    engine_id: int
    engine_name: str
    knobs: tuple[Knob, ...]
    supports_exhaustive: bool
    estimated_workspace: int
    applicable: bool = True
    reason: str = ""


class EngineRegistry:
    """An explicit registry of engines, looked up by name or id."""

    def __init__(self, engines: Iterable[Engine] = ()) -> None:
        self._by_id: dict[int, Engine] = {}
        self._origin: dict[int, str] = {}
        for engine in engines:
            self.register(engine)

    # -- building ---------------------------------------------------------------
    @classmethod
    def default(cls, *, entry_points: bool = True) -> "EngineRegistry":
        """Built-in engines, then installed plugins."""
        reg = cls()
        for module in BUILTIN_ENGINE_MODULES:
            reg.load_module(module, origin="built-in")
        if entry_points:
            reg.load_entry_points()
        return reg

    def register(self, engine: Engine, *, origin: str = "registered") -> None:
        _check_engine(engine)
        eid = engine_id(engine)
        existing = self._by_id.get(eid)
        if existing is not None:
            if existing is engine or type(existing) is type(engine) and existing.name == engine.name:
                return  # the same engine reached twice (built-in and entry point)
            raise ValueError(
                f"engine {engine.name!r} from {origin} has the id of {existing.name!r} "
                f"from {self._origin[eid]}; engine names must be unique"
            )
        self._by_id[eid] = engine
        self._origin[eid] = origin

    def load_module(self, module: str, *, origin: str | None = None) -> None:
        mod = importlib.import_module(module)
        for engine in _as_engines(getattr(mod, "ENGINES"), module):
            self.register(engine, origin=origin or module)

    def load_entry_points(self) -> None:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.value.split(":")[0] in BUILTIN_ENGINE_MODULES:
                continue  # already loaded from the checkout
            try:
                obj = ep.load()
                for engine in _as_engines(obj, ep.value):
                    self.register(engine, origin=f"plugin {ep.name} ({ep.value})")
            except Exception as exc:  # a broken plugin must not take the others down
                log.warning("engine plugin %s (%s) not loaded: %s: %s", ep.name, ep.value, type(exc).__name__, exc)

    # -- lookup -----------------------------------------------------------------
    def __iter__(self) -> Iterator[Engine]:
        return iter(sorted(self._by_id.values(), key=lambda e: (engine_priority(e), e.name)))

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, key: object) -> bool:
        try:
            self.get(key)  # type: ignore[arg-type]
        except UnknownNameError:
            return False
        return True

    def get(self, key: int | str) -> Engine:
        """Engine by id or by name."""
        if isinstance(key, str):
            engine = self._by_id.get(engine_name_to_id(key)) if key else None
        else:
            engine = self._by_id.get(int(key))
        if engine is None:
            import difflib

            names = [e.name for e in self]
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise UnknownNameError(f"unknown engine {key!r}; {hint}known engines: {', '.join(names)}")
        return engine

    def origin(self, engine: Engine) -> str:
        return self._origin.get(engine_id(engine), "?")

    def for_op(self, op: str) -> list[Engine]:
        return [e for e in self if op in e.ops]

    # -- discovery --------------------------------------------------------------
    def config_for(self, engine: Engine, problem: "Problem", device: "Device") -> EngineConfig:
        """The engine's config for this problem, applicable or not (with the reason)."""
        if problem.op not in engine.ops:
            support = Support.no(f"does not implement {problem.op}")
        else:
            try:
                support = engine.applicable(problem, device)
            except Exception as exc:
                support = Support.no(f"applicability check failed: {type(exc).__name__}: {exc}")
        workspace = 0
        if support:
            try:
                workspace = int(engine.estimate_workspace(problem, resolve(engine_knobs(engine), ())))
            except Exception as exc:
                support = Support.no(f"workspace estimate failed: {type(exc).__name__}: {exc}")
        return EngineConfig(
            engine_id=engine_id(engine),
            engine_name=engine.name,
            knobs=user_knobs(engine),
            supports_exhaustive=bool(engine.supports_exhaustive),
            estimated_workspace=workspace,
            applicable=bool(support),
            reason=support.reason,
        )

    def explain(self, problem: "Problem", device: "Device") -> list[EngineConfig]:
        """Every engine serving the op, applicable or not; for a problem that stands for one library's call
        (``Problem.library``), that library's engines first (its default is what the caller runs already)."""
        engines = self.for_op(problem.op)
        if problem.library:
            engines.sort(key=lambda e: getattr(e, "library", "") != problem.library)  # stable: priority kept
        return [self.config_for(e, problem, device) for e in engines]

    def prepare(self, engine_names: Iterable[str], device_kind: str) -> None:
        """Call ``prepare(device_kind)`` of the named engines that have one ("gpu", "cpu" or "sim"): a tuning
        process lets them start what their compiles want (Triton's compile pool). Replay never calls this."""
        for name in sorted(set(engine_names)):
            engine = self.get(name)
            prepare = engine.prepare if isinstance(engine, Preparable) else None
            if prepare is not None:
                try:
                    prepare(device_kind)
                except Exception as exc:  # preparing is an optimisation; compiles work without it
                    log.warning("autotune: preparing %s failed: %s", name, exc)

    def discover(self, problem: "Problem", device: "Device") -> list[EngineConfig]:
        """Applicable engines for the problem on the device, in static preference order."""
        return [c for c in self.explain(problem, device) if c.applicable]


def _as_engines(obj: Any, where: str) -> list[Engine]:
    if callable(obj) and not isinstance(obj, Engine):
        obj = obj()
    if isinstance(obj, Engine):
        return [obj]
    if isinstance(obj, (list, tuple, Sequence)) or hasattr(obj, "__iter__"):
        return list(obj)
    raise TypeError(f"{where} is neither an engine nor an iterable of engines")


def _check_engine(engine: Any) -> None:
    missing = [a for a in ("name", "ops", "knobs", "supports_exhaustive", "applicable", "estimate_workspace", "compile")
               if not hasattr(engine, a)]
    if missing:
        raise TypeError(f"{engine!r} is not an engine: missing {', '.join(missing)}")


def file_knobs(engine: Engine, knobs: Iterable[tuple[str, Any]], *, source: str) -> KnobSettings:
    """Knob settings read from a file (override entry, replay results), validated exactly like a workload's.

    Raises InputError naming the source, engine, knob and value; the benchmarking knob is never
    taken from a file (the tuner alone sets it).
    """
    from farm.errors import InputError
    from farm.model.knobs import normalize_settings

    items = list(knobs)
    if any(name == BENCHMARKING_KNOB for name, _ in items):
        raise InputError(f"{BENCHMARKING_KNOB} is set by the tuner, not by a file",
                         field=f"engine {engine.name} knob {BENCHMARKING_KNOB}", source=source)
    try:
        return normalize_settings(user_knobs(engine), items, engine=engine.name)
    except InputError as exc:
        raise exc.within(source=source) from None


def known_file_knobs(engine: Engine, knobs: Iterable[tuple[str, Any]], *, source: str) -> tuple[KnobSettings, tuple[str, ...]]:
    """The knobs of a file an engine has, validated as ``file_knobs`` does, and the names it ignored: knobs the
    engine does not have (hipDNN records ``SPLIT_K``, ``global.workspace_size_limit``: information there) and the
    benchmarking knob (the tuner's alone). A bad value of a knob it has is still an InputError."""
    names = {k.name for k in user_knobs(engine)}
    items = list(knobs)
    ignored = tuple(name for name, _ in items if name not in names)
    return file_knobs(engine, [(n, v) for n, v in items if n in names], source=source), ignored


def settings_to_resolved(engine: Engine, settings: KnobSettings, *, benchmarking: bool = False) -> dict[str, KnobValue]:
    """Full knob values for compile: defaults + settings (+ the benchmarking knob when priming)."""
    values = resolve(engine_knobs(engine), settings)
    if engine.supports_exhaustive:
        values[BENCHMARKING_KNOB] = 1 if benchmarking else 0
    return values


@functools.lru_cache(maxsize=1)
def default_engine_registry() -> EngineRegistry:
    """The process-wide registry of built-in and installed engines (loaded once)."""
    return EngineRegistry.default()
