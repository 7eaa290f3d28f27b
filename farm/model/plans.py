"""Plan specs and the collection the tuner measures (hipDNN autotuning RFC §6.2).

A plan spec is (engine id, knob settings): one candidate. The collection is
additive and deduplicated by that pair (knob order and default-valued knobs do
not make a new candidate). Single calls raise on bad input; batch calls
(variants, sweeps) skip bad entries with a warning. The benchmarking knob is
the tuner's to set, so it is stripped from user input with a warning.

Deselection does not delete: a deselected candidate still gets one result row
("barred by deselect"). Engine deselections accumulate; the workspace ceiling
is the last one given and applies to a compiled plan's real workspace.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from farm.errors import InputError, UnknownNameError, UsageError
from farm.model.engine import (
    Engine,
    EngineConfig,
    EngineRegistry,
    KnobAware,
    PlanListing,
    Support,
    engine_id,
    settings_to_resolved,
    user_knobs,
)
from farm.model.ids import engine_name_to_id
from farm.model.knobs import BENCHMARKING_KNOB, KnobSettings, KnobValue, candidate_label, normalize_settings

if TYPE_CHECKING:
    from farm.devices.device import Device
    from farm.model.problem import Problem

log = logging.getLogger("farm.model.plans")

SWEEP_ERROR_LIMIT = 10_000
SWEEP_WARN_LIMIT = 1_000


@dataclass(frozen=True)
class PlanSpec:
    """One candidate: an engine and its non-default knob settings."""

    engine_id: int
    knobs: KnobSettings = ()

    def describe(self, registry: EngineRegistry | None = None) -> str:
        name = str(self.engine_id)
        if registry is not None and self.engine_id in registry:
            name = registry.get(self.engine_id).name
        return candidate_label(name, self.knobs)

    @property
    def key(self) -> str:
        """The candidate key: ``<engine id>:<knobs as JSON pairs>``, stable across runs (the results' resume key)."""
        return candidate_key(self.engine_id, self.knobs)


def candidate_key(engine_id: int, knobs: KnobSettings) -> str:
    """``<engine id>:<knobs as JSON pairs>``: a plan spec's identity, stable across runs."""
    return f"{engine_id}:" + json.dumps([[k, v] for k, v in sorted(knobs)], separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def spec_of(key: str) -> PlanSpec:
    """The plan spec a candidate key names (inverse of candidate_key)."""
    engine, knobs = key.split(":", 1)
    return PlanSpec(int(engine), tuple(sorted((k, v) for k, v in json.loads(knobs))))


@dataclass(frozen=True)
class EngineVariant:
    """An engine (name or id) with explicit knob settings."""

    engine: int | str
    knobs: Mapping[str, KnobValue] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineSweep:
    """A Cartesian sweep: every combination of ``axes`` values, each merged with ``fixed``."""

    engine: int | str
    axes: Mapping[str, Sequence[KnobValue]] = field(default_factory=dict)
    fixed: Mapping[str, KnobValue] = field(default_factory=dict)


def cartesian_product(axes: Mapping[str, Sequence[Any]] | Sequence[tuple[str, Sequence[Any]]],
                      *, limit: int = SWEEP_ERROR_LIMIT) -> list[dict[str, Any]]:
    """Every combination of axis values, first axis slowest; InputError above ``limit``."""
    items = list(axes.items()) if isinstance(axes, Mapping) else list(axes)
    count = 1
    for name, values in items:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise InputError("a sweep axis needs a list of values", field=f"axes.{name}", value=values)
        count *= len(values)
    if count > limit:
        raise InputError(f"the sweep expands to {count} plan specs, above the limit of {limit}",
                         field="axes", value={n: len(v) for n, v in items})
    if not items:
        return [{}]
    names = [n for n, _ in items]
    return [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in items))]


class PlanSpecCollection:
    """The candidates of one problem on one device, with deselections."""

    def __init__(self, problem: "Problem", device: "Device", registry: EngineRegistry) -> None:
        self.problem = problem
        self.device = device
        self.registry = registry
        self._specs: list[PlanSpec] = []
        self._seen: set[PlanSpec] = set()
        self._barred_ids: set[int] = set()
        self._workspace_ceiling: int | None = None
        self._locked = False
        self.dropped: list[tuple[str, str]] = []  # (candidate, reason): engines or knob values that do not apply
        self._engine_support: dict[int, EngineConfig] = {}
        self._warned: set[int] = set()

    # -- state -------------------------------------------------------------------
    def lock(self, reason: str) -> None:
        """No more additions (plans were built)."""
        self._locked = True
        self._lock_reason = reason

    def _check_unlocked(self) -> None:
        if self._locked:
            raise UsageError(f"cannot add plan specs: {self._lock_reason}")

    @property
    def specs(self) -> tuple[PlanSpec, ...]:
        return tuple(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    # -- adding ------------------------------------------------------------------
    def _engine_for(self, key: int | str, *, where: str) -> Engine:
        try:
            engine = self.registry.get(key)
        except UnknownNameError as exc:
            raise InputError(str(exc), field=where, value=key) from None
        if self.problem.op not in engine.ops:
            raise InputError(f"engine {engine.name} does not implement {self.problem.op}", field=where, value=key)
        return engine

    def _normalize(self, engine: Engine, knobs: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> KnobSettings:
        items = dict(knobs.items() if isinstance(knobs, Mapping) else (knobs or ()))
        if BENCHMARKING_KNOB in items:
            log.warning("autotune: knob %s on engine %s stripped: the tuner sets it in EXHAUSTIVE mode",
                        BENCHMARKING_KNOB, engine.name)
            items.pop(BENCHMARKING_KNOB)
        return normalize_settings(user_knobs(engine), items, engine=engine.name)

    def _applies(self, engine: Engine, spec: PlanSpec) -> bool:
        """Batch additions skip engines that do not apply here, and knob settings the engine says do not."""
        key = engine_id(engine)
        if key not in self._engine_support:
            self._engine_support[key] = self.registry.config_for(engine, self.problem, self.device)
        cfg = self._engine_support[key]
        if not cfg.applicable:
            if key not in self._warned:
                self._warned.add(key)
                self.dropped.append((f"{engine.name}[*]", cfg.reason))
                log.warning("autotune: %s skipped: it does not apply here (%s)", engine.name, cfg.reason)
            return False
        if not isinstance(engine, KnobAware):
            return True
        try:
            support = engine.knob_support(self.problem, self.device, dict(spec.knobs))
        except Exception as exc:
            support = Support.no(f"knob check failed: {type(exc).__name__}: {exc}")
        if not support:
            label = spec.describe(self.registry)
            self.dropped.append((label, support.reason))
            log.info("autotune: %s left out: %s", label, support.reason)
        return bool(support)

    def _store(self, spec: PlanSpec) -> bool:
        if spec in self._seen:
            return False
        self._seen.add(spec)
        self._specs.append(spec)
        return True

    def add_engine(self, engine: int | str, knobs: Mapping[str, KnobValue] | None = None) -> PlanSpec:
        """One candidate; raises on an unknown engine, unknown knob or bad value."""
        self._check_unlocked()
        eng = self._engine_for(engine, where="engine")
        spec = PlanSpec(engine_id(eng), self._normalize(eng, knobs))
        self._store(spec)
        return spec

    def add_engines(self, engines: Sequence[int | str]) -> int:
        """Default-knob candidates for each engine (each checked like add_engine)."""
        if not engines:
            raise InputError("no engines given", field="engines", value=list(engines))
        before = len(self._specs)
        for e in engines:
            self.add_engine(e)
        return len(self._specs) - before

    def add_engine_configs(self, configs: Sequence[EngineConfig]) -> int:
        """Default-knob candidates from discovery; ids are trusted here and checked at compile time."""
        self._check_unlocked()
        if not configs:
            raise InputError("no engine configs given", field="configs", value=[])
        added = 0
        for cfg in configs:
            added += self._store(PlanSpec(cfg.engine_id, ()))
            engine = self.registry.get(cfg.engine_id)
            if isinstance(engine, PlanListing):
                added += self._add_listed(engine)
        return added

    def _add_listed(self, engine: PlanListing) -> int:
        """The plans the engine's library lists for this problem; a listing that fails costs only them."""
        try:
            listed = list(engine.list_plans(self.problem, self.device))
        except Exception as exc:  # the library said no: the engine's default candidate still runs
            reason = f"{type(exc).__name__}: {exc}"
            self.dropped.append((f"{engine.name}[listed]", reason))
            log.warning("autotune: %s lists no plans here: %s", engine.name, reason)
            return 0
        added = 0
        for knobs in listed:
            added += self._store(PlanSpec(engine_id(engine), self._normalize(engine, knobs)))
        log.info("autotune: %s lists %d plans for %s", engine.name, len(listed), self.problem.label())
        return added

    def _available(self, key: int | str, where: str) -> Engine | None:
        """The engine of a variant or sweep, or None: an engine that is not available here (unknown to this
        process, or not serving the op) is skipped with a warning, as the autotuning RFC's §6.2.7 has it."""
        try:
            return self._engine_for(key, where=where)
        except InputError as exc:
            self.dropped.append((f"{key}[*]", exc.reason))
            log.warning("autotune: %s: engine %r skipped: %s", where, key, exc.reason)
            return None

    def add_engine_variants(self, variants: Sequence[EngineVariant]) -> int:
        """Explicit (engine, knobs) candidates. An engine that is not available is skipped with a warning; an
        unknown knob or a value out of range is an InputError naming the first bad variant (those before it are
        kept); one that does not apply here is left out (logged)."""
        added = 0
        for i, v, eng in self._available_each(variants, "variants"):
            try:
                spec = PlanSpec(engine_id(eng), self._normalize(eng, v.knobs))
            except InputError as exc:
                raise exc.within(prefix=f"variants[{i}]") from None
            if self._applies(eng, spec):
                added += self._store(spec)
        return added

    def add_engine_sweep(self, sweeps: Sequence[EngineSweep]) -> int:
        """Cartesian sweeps; a sweep above 10,000 specs is an error, above 1,000 a warning; a sweep of an engine
        that is not available is skipped with a warning."""
        added = 0
        for i, sw, eng in self._available_each(sweeps, "sweeps"):
            combos = cartesian_product(self._sweep_axes(eng, sw.axes, i))  # raises above the limit
            if len(combos) > SWEEP_WARN_LIMIT:
                log.warning("autotune: sweep %d on %s expands to %d plan specs", i, sw.engine, len(combos))
            for combo in combos:
                merged = {**dict(sw.fixed), **combo}
                try:
                    spec = PlanSpec(engine_id(eng), self._normalize(eng, merged))
                except InputError as exc:  # the first bad entry stops the sweep: a typo must not pass as tuned
                    raise exc.within(prefix=f"sweeps[{i}] entry {combo}") from None
                if self._applies(eng, spec):
                    added += self._store(spec)
        return added

    def _available_each(self, items: Sequence[Any], field: str) -> Iterator[tuple[int, Any, Engine]]:
        """(index, item, its engine) of each item whose engine is available here (the others skipped with a
        warning); none given is an InputError naming ``field``."""
        self._check_unlocked()
        if not items:
            raise InputError(f"no {field} given", field=field, value=[])
        for i, item in enumerate(items):
            eng = self._available(item.engine, f"{field}[{i}].engine")
            if eng is not None:
                yield i, item, eng

    def _sweep_axes(self, engine: Engine, axes: Mapping[str, Sequence[Any]], index: int) -> dict[str, Sequence[Any]]:
        """The axes to multiply: the benchmarking knob stripped (the tuner sets it) and empty axes dropped,
        each with one warning, before the product (so neither counts toward the sweep limit)."""
        out = {}
        for name, values in dict(axes).items():
            if name == BENCHMARKING_KNOB:
                log.warning("autotune: sweep %d: knob %s on engine %s stripped: the tuner sets it in EXHAUSTIVE mode",
                            index, name, engine.name)
            elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)) and len(values) == 0:
                log.warning("autotune: sweep %d: axis %s on engine %s has no values; dropped", index, name, engine.name)
            else:
                out[name] = values
        return out

    def add_all_engines(self) -> int:
        configs = self.registry.discover(self.problem, self.device)
        if not configs:
            raise InputError(f"no engine applies to {self.problem.label()} on {self.device.properties.name}",
                             field="engines", value=[c.engine_name for c in self.registry.explain(self.problem, self.device)])
        return self.add_engine_configs(configs)

    # -- deselection ---------------------------------------------------------------
    def deselect_engines(self, engines: Iterable[int | str]) -> None:
        """Bar engines by name or id (accumulates across calls; unknown names are ignored)."""
        for key in engines:
            if isinstance(key, str):
                self._barred_ids.add(engine_name_to_id(key))
            else:
                self._barred_ids.add(int(key))

    def deselect_workspace_greater_than(self, nbytes: int) -> None:
        """Bar candidates whose compiled plan needs more than ``nbytes`` of workspace (last call wins)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InputError("must be an integer >= 0 (bytes)", field="workspace", value=nbytes)
        self._workspace_ceiling = int(nbytes)

    def barred_reason(self, spec: PlanSpec) -> str | None:
        """Why ``spec`` is deselected before compile (its engine is), or None."""
        if spec.engine_id in self._barred_ids:
            return "engine deselected"
        return None

    def ceiling_reason(self, workspace: int) -> str | None:
        """Why a compiled plan needing ``workspace`` bytes is deselected, or None."""
        if self._workspace_ceiling is not None and workspace > self._workspace_ceiling:
            return f"workspace {workspace} B exceeds the deselect ceiling {self._workspace_ceiling} B"
        return None

    # -- queries -------------------------------------------------------------------
    def estimated_workspace(self, spec: PlanSpec) -> int | None:
        try:
            eng = self.registry.get(spec.engine_id)
            return int(eng.estimate_workspace(self.problem, settings_to_resolved(eng, spec.knobs)))
        except Exception:
            return None

    def estimated_max_workspace(self) -> int:
        """Largest pre-compile workspace estimate over the candidates not barred."""
        if not self._specs:
            raise UsageError("no plan specs yet: add engines, variants or sweeps first")
        best = 0
        for spec in self._specs:
            if self.barred_reason(spec) is None:
                best = max(best, self.estimated_workspace(spec) or 0)
        return best
