"""The in-process autotuner (hipDNN autotuning RFC §6.3, §6.4; TunableOp budgets).

    tuner = Autotuner(problem, device)          # device defaults to the host CPU
    tuner.add_all_engines()                     # or add_engine / variants / sweeps
    results = tuner.autotune(config=AutotuneConfig(strategy="fixed_average"))
    tuner.execute(tensors)                      # runs the winner

Every candidate gets exactly one AutotuneResult. Failures are results with a
disposition, never exceptions escaping the loop; failed and skipped candidates
follow the successful ones with rank -1. The same tuner runs inside a Ray
device actor and in user code.

The benchmark loop, per candidate (the contract strategies plug into):
    device synchronize
    untimed runs: ``warmup_iterations`` (at least one when results are checked;
                  the first one's outputs are checked, outputs poisoned before)
    device synchronize
    timed runs: one timer measurement each (optional L2 flush before each,
                outside the measurement) until the strategy's stop rule or a
                budget says stop
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from farm.devices.arrays import make_tensors
from farm.devices.device import Device, cpu_device
from farm.errors import AutotuneError, InputError, UsageError
from farm.model.engine import (
    CompileKeyed,
    Engine,
    EngineConfig,
    EngineRegistry,
    Plan,
    default_engine_registry,
    settings_to_resolved,
)
from farm.model.knobs import KnobValue, candidate_label
from farm.model.plans import EngineSweep, EngineVariant, PlanSpec, PlanSpecCollection
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig, AutotuneResult, ResultCheck, TuneMode
from farm.tuner.candidate import _Candidate, _close_plan, _err
from farm.tuner.ranking import _rank
from farm.tuner.session import _Run

log = logging.getLogger("farm.tuner.autotuner")


class Autotuner:
    """Tunes one problem on one device: discover, collect plan specs, autotune, execute."""

    def __init__(self, problem: Problem, device: Device | None = None, *, registry: EngineRegistry | None = None) -> None:
        self.problem = problem
        self.device = device or cpu_device()
        self.registry = registry or default_engine_registry()
        self._collection = PlanSpecCollection(problem, self.device, self.registry)
        self._built: list[tuple[PlanSpec, Engine, Plan]] | None = None  # compiled-plan path
        self._active: tuple[PlanSpec, Engine, Plan] | None = None
        self._workspace: Any = None
        self._workspace_size = 0
        self.results: list[AutotuneResult] = []
        # plan spec -> time.monotonic() its compile or measurement began: what a hang watch looks at
        self.in_flight: dict[PlanSpec, float] = {}

    # -- discovery and plan specs (delegated to the collection) ----------------------
    def engine_configs(self) -> list[EngineConfig]:
        """Applicable engines for this problem on this device."""
        return self.registry.discover(self.problem, self.device)

    def add_all_engines(self) -> int:
        self._guard_add()
        return self._collection.add_all_engines()

    def add_engine_configs(self, configs: Sequence[EngineConfig]) -> int:
        self._guard_add()
        return self._collection.add_engine_configs(configs)

    def add_engines(self, engines: Sequence[int | str]) -> int:
        self._guard_add()
        return self._collection.add_engines(engines)

    def add_engine(self, engine: int | str, knobs: Mapping[str, KnobValue] | None = None) -> PlanSpec:
        self._guard_add()
        return self._collection.add_engine(engine, knobs)

    def add_engine_variants(self, variants: Sequence[EngineVariant]) -> int:
        self._guard_add()
        return self._collection.add_engine_variants(variants)

    def add_engine_sweep(self, sweeps: Sequence[EngineSweep]) -> int:
        self._guard_add()
        return self._collection.add_engine_sweep(sweeps)

    def deselect_engines(self, engines: Iterable[int | str]) -> "Autotuner":
        self._collection.deselect_engines(engines)
        if self._built is not None:
            self._built = [b for b in self._built if self._collection.barred_reason(b[0]) is None]
        return self

    def deselect_workspace_greater_than(self, nbytes: int) -> "Autotuner":
        self._collection.deselect_workspace_greater_than(nbytes)
        if self._built is not None:
            self._built = [b for b in self._built if b[2].workspace_size <= nbytes]
        return self

    def estimated_max_workspace(self) -> int:
        return self._collection.estimated_max_workspace()

    @property
    def specs(self) -> tuple[PlanSpec, ...]:
        return self._collection.specs

    def _guard_add(self) -> None:
        if self._built is not None:
            raise UsageError("cannot add plan specs after build_plans(): the plan-spec and compiled-plan paths are exclusive")

    # -- compiled-plan path and the manual loop -----------------------------------------
    def build_plans(self) -> int:
        """Compile every candidate not barred (the manual path); returns the plan count.

        Candidates that fail to compile are logged and left out, as cuDNN's
        build_plans(ALL) does.
        """
        if not self._collection.specs:
            raise AutotuneError("no plan specs to build: add engines first")
        built = []
        for spec in self._collection.specs:
            if self._collection.barred_reason(spec) is not None:
                continue
            cand = self._candidate(0, spec)
            self.compile_candidate(cand)
            if cand.plan is not None:
                built.append((spec, cand.engine, cand.plan))
            else:
                log.warning("autotune: %s not built: %s", spec.describe(self.registry), cand.error)
        self._built = built
        self._collection.lock("plans were built (compiled-plan path)")
        return len(built)

    @property
    def plan_count(self) -> int:
        return len(self._require_built())

    def _require_built(self) -> list[tuple[PlanSpec, Engine, Plan]]:
        if self._built is None:
            raise UsageError("no compiled plans: call build_plans() first")
        return self._built

    def _at(self, index: int) -> tuple[PlanSpec, Engine, Plan]:
        built = self._require_built()
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(built):
            raise UsageError(f"plan index {index!r} out of range: {len(built)} plan(s) built")
        return built[index]

    def workspace_size_at_index(self, index: int) -> int:
        return int(self._at(index)[2].workspace_size)

    def plan_name_at_index(self, index: int) -> str:
        spec, engine, _ = self._at(index)
        return candidate_label(engine.name, spec.knobs)

    def execute_plan_at_index(self, index: int, tensors: Mapping[str, Any]) -> None:
        _, _, plan = self._at(index)
        self._check_tensors(tensors)
        plan.run(tensors, self.workspace_for(plan.workspace_size), self.device.stream)

    def build_plan_at_index(self, index: int) -> None:
        """Make plan ``index`` the one :meth:`execute` runs."""
        self._active = self._at(index)

    # -- execution ------------------------------------------------------------------
    def execute(self, tensors: Mapping[str, Any]) -> None:
        """Run the selected plan (the autotune winner, or build_plan_at_index's choice)."""
        if self._active is None:
            raise UsageError("no plan selected: run autotune() or build_plan_at_index() first")
        self._check_tensors(tensors)
        plan = self._active[2]
        plan.run(tensors, self.workspace_for(plan.workspace_size), self.device.stream)

    @property
    def winner(self) -> AutotuneResult | None:
        return self.results[0] if self.results and self.results[0].succeeded else None

    def close(self) -> None:
        """Release plans and the workspace."""
        for entry in self._built or []:
            _close_plan(entry[2])
        if self._active is not None:
            _close_plan(self._active[2])
        self._active = None
        self._built = None
        self._release_workspace()

    def __enter__(self) -> "Autotuner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- autotune --------------------------------------------------------------------
    def autotune(
        self,
        tensors: Mapping[str, Any] | None = None,
        config: AutotuneConfig | None = None,
        *,
        listener: Callable[[AutotuneResult], None] | None = None,
        seed: int = 0,
        only: Iterable[PlanSpec] | None = None,
    ) -> list[AutotuneResult]:
        """Measure every candidate; return one result per candidate, ranked.

        ``tensors`` defaults to random inputs (seeded) and poisoned outputs on
        the device. ``listener`` receives each candidate's result as soon as it
        is final (before ranking, so with rank -1). ``only`` restricts the run to
        those plan specs (resuming): the others get no result, and every result
        keeps its candidate index in the full list. Raises AutotuneError when no
        candidate succeeds; the error carries ``.results``.
        """
        config = config or AutotuneConfig()
        if not self.device.checks_numerics and config.check is not ResultCheck.OFF:
            config = replace(config, check=ResultCheck.OFF)
        if tensors is None:
            make = getattr(self.device.arrays, "make", None)
            tensors = make(self.problem, seed) if make is not None else make_tensors(self.problem, self.device.arrays, seed)
        self._check_tensors(tensors)
        candidates = self._candidates(config, only)
        t0 = time.perf_counter()
        log.info("autotune: start %s (key %s) on %s: %d candidate(s), mode %s, strategy %s",
                 self.problem.label(), self.problem.key, self.device.properties.name, len(candidates),
                 config.mode.value, config.strategy.value)
        run = _Run(self, config, tensors, listener)
        results = run.execute(candidates, prebuilt=self._built is not None)
        ranked = _rank(results, config.ranking_fn)
        self.results = ranked
        ok = [r for r in ranked if r.succeeded]
        counts: dict[str, int] = {}
        for r in ranked:
            counts[r.disposition.value] = counts.get(r.disposition.value, 0) + 1
        summary = ", ".join(f"{n} {d}" for d, n in sorted(counts.items()))
        if not ok:
            run.release_plans(keep=None)
            log.warning("autotune: no winner for %s after %.0f ms (%s)", self.problem.key, (time.perf_counter() - t0) * 1e3, summary)
            raise AutotuneError(f"every candidate failed for {self.problem.label()} ({summary})", ranked)
        best = ok[0]
        keep = run.plan_of(best)
        run.release_plans(keep=keep)
        self._active = keep
        log.info("autotune: winner %s: %.4f ms min, %.4f ms avg (%s; %.0f ms total)",
                 best.label, best.min_ms, best.avg_ms, summary, (time.perf_counter() - t0) * 1e3)
        return ranked

    # -- helpers --------------------------------------------------------------------
    def _candidates(self, config: AutotuneConfig, only: Iterable[PlanSpec] | None) -> list[_Candidate]:
        """The candidates of this call: the built plans, or the plan specs (those in ``only``, if given)."""
        if self._built is not None:
            if config.mode is TuneMode.EXHAUSTIVE:
                raise UsageError("EXHAUSTIVE mode needs the plan-spec path; these plans were built already")
            candidates = []
            for i, (spec, engine, plan) in enumerate(self._built):
                cand = self._candidate(i, spec)
                cand.plan, cand.compile_ms = plan, 0.0
                candidates.append(cand)
            return candidates
        if not self._collection.specs:
            raise AutotuneError("no autotuning candidates: add engines first")
        wanted = set(only) if only is not None else None
        candidates = [self._candidate(i, s) for i, s in enumerate(self._collection.specs)
                      if wanted is None or s in wanted]
        if not candidates:
            raise AutotuneError("no autotuning candidates left: every plan spec was excluded by 'only'")
        return candidates

    def _candidate(self, index: int, spec: PlanSpec) -> _Candidate:
        engine = self.registry.get(spec.engine_id) if spec.engine_id in self.registry else None
        return _Candidate(index, spec, engine, self._collection.estimated_workspace(spec))

    # -- used by the measuring session (farm.tuner.session) ---------------------------------
    def barred_reason(self, spec: PlanSpec) -> str | None:
        """Why a deselect rule bars this plan spec (None: it may run)."""
        return self._collection.barred_reason(spec)

    def compile_key(self, cand: _Candidate) -> str | None:
        """The host-wide key of the artifact compiling ``cand`` produces, if its engine declares one."""
        if not isinstance(cand.engine, CompileKeyed):
            return None
        try:
            return cand.engine.compile_key(self.problem, settings_to_resolved(cand.engine, cand.spec.knobs), self.device)
        except Exception as exc:  # no key means no sharing, never a failed candidate
            log.warning("autotune: %s.compile_key failed (%s); compiling without host-wide sharing",
                        cand.engine.name, _err(exc))
            return None

    def compile_candidate(self, cand: _Candidate, *, benchmarking: bool = False) -> Plan | None:
        """Compile (or, with ``benchmarking``, build a priming plan). Sets cand.error on failure."""
        engine = cand.engine
        if engine is None:
            cand.error = f"unknown engine id {cand.spec.engine_id}"
            return None
        support = self.registry.config_for(engine, self.problem, self.device)
        if not support.applicable:
            cand.error = f"{engine.name} does not apply: {support.reason}"
            return None
        t0 = time.perf_counter()
        self.in_flight[cand.spec] = time.monotonic()
        try:
            plan = engine.compile(self.problem, settings_to_resolved(engine, cand.spec.knobs, benchmarking=benchmarking), self.device)
        except Exception as exc:  # any compile failure is that candidate's, not the tuner's
            cand.error = f"{engine.name}: compile: {_err(exc)}"
            plan = None
        finally:
            self.in_flight.pop(cand.spec, None)
        if not benchmarking:
            cand.plan = plan
            cand.compile_ms = (time.perf_counter() - t0) * 1e3
        return plan

    def _check_tensors(self, tensors: Mapping[str, Any]) -> None:
        if not isinstance(tensors, Mapping):
            raise InputError("expected a mapping of tensor id to tensor", field="tensors", value=type(tensors).__name__)
        for desc in self.problem.tensors:
            if desc.id not in tensors:
                raise InputError(f"missing tensor {desc.id} (needed: {', '.join(t.id for t in self.problem.tensors)})",
                                 field=f"tensors.{desc.id}")
            shape = getattr(tensors[desc.id], "shape", None)
            if shape is not None and tuple(shape) != desc.dims:
                raise InputError(f"shape must be {list(desc.dims)}", field=f"tensors.{desc.id}", value=list(shape))

    def workspace_for(self, nbytes: int) -> Any:
        nbytes = int(nbytes)
        if nbytes <= 0:
            return None
        if self._workspace is None or self._workspace_size < nbytes:
            self._release_workspace()
            self._workspace = self.device.runtime.malloc(nbytes)
            self._workspace_size = nbytes
        return self._workspace

    def _release_workspace(self) -> None:
        if self._workspace is not None:
            self.device.runtime.free(self._workspace)
        self._workspace, self._workspace_size = None, 0


