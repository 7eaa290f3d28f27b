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

import collections
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
    engine_priority,
    settings_to_resolved,
)
from farm.model.knobs import KnobValue
from farm.model.plans import EngineSweep, EngineVariant, PlanSpec, PlanSpecCollection
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig, AutotuneResult, HeuristicMode, ResultCheck, TuneMode
from farm.tuner.candidate import CandidateRun, close_plan, error_text
from farm.tuner.compiled_plans import CompiledPlans, PlanSlot
from farm.tuner.interrupts import reraise_user_interrupt
from farm.tuner.journal import InFlight
from farm.tuner.phases import PhaseClock
from farm.tuner.judging.ranking import rank_results
from farm.tuner.session import TuningRun

log = logging.getLogger("farm.tuner.autotuner")


class Autotuner(CompiledPlans):
    """Tunes one problem on one device: discover, collect plan specs, autotune, execute."""

    def __init__(self, problem: Problem, device: Device | None = None, *, registry: EngineRegistry | None = None) -> None:
        self.problem = problem
        self.device = device or cpu_device()
        self.registry = registry or default_engine_registry()
        self._collection = PlanSpecCollection(problem, self.device, self.registry)
        self._built: list[PlanSlot] | None = None  # compiled-plan path: one slot per plan spec
        self._active: tuple[PlanSpec, Engine, Plan] | None = None
        self._workspace: Any = None
        self._workspace_size = 0
        self.results: list[AutotuneResult] = []
        # plan spec -> time.monotonic() its compile or measurement began: what a hang watch looks at
        self.in_flight = InFlight(problem.key)

    # -- discovery and plan specs (delegated to the collection) ----------------------
    def engine_configs(self) -> list[EngineConfig]:
        """Applicable engines for this problem on this device."""
        return self.registry.discover(self.problem, self.device)

    def get_engine_configs(self, modes: Sequence[HeuristicMode | str] = (HeuristicMode.FALLBACK,)) -> list[EngineConfig]:
        """The applicable engines ranked by each heuristic mode in turn, each engine once (the autotuning RFC's
        call; FALLBACK, the default, is discovery order; A and B: StaticOrdering's rule, see ranked_configs; a
        tuned winner is the selection policies' business, farm.replay.selection)."""
        return ranked_configs(self.engine_configs(), [HeuristicMode(m) for m in modes], self.registry)

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
        """Bar engines by name or id. After build_plans() their plans stay in the list (indices do not move)
        but are excluded: executing one is an error, autotune() gives them a barred result."""
        self._collection.deselect_engines(engines)
        return self

    def deselect_workspace_greater_than(self, nbytes: int) -> "Autotuner":
        """Bar plans whose workspace is above ``nbytes``: the compiled plan's real workspace (the estimate
        before compile decides nothing). On the plan-spec path it is checked after each compile."""
        self._collection.deselect_workspace_greater_than(nbytes)
        return self

    def estimated_max_workspace(self) -> int:
        """The largest pre-compile workspace estimate of the candidates not barred (UsageError with none)."""
        return self._collection.estimated_max_workspace()

    @property
    def specs(self) -> tuple[PlanSpec, ...]:
        return self._collection.specs

    def _guard_add(self) -> None:
        if self._built is not None:
            raise UsageError("cannot add plan specs after build_plans(): the plan-spec and compiled-plan paths are exclusive")

    def check_support(self) -> int:
        """How many plan specs an applicable engine serves; AutotuneError naming each reason when none."""
        if not self._collection.specs:
            raise AutotuneError("no plan specs to check: add engines first")
        reasons, supported = [], 0
        for spec in self._collection.specs:
            cand = self._candidate(0, spec)
            why = self.unsupported_reason(cand)
            if why is None:
                supported += 1
            else:
                reasons.append(why)
        if not supported:
            raise AutotuneError(f"{self.problem.label()} is not supported here: " + "; ".join(dict.fromkeys(reasons)))
        return supported

    # -- execution ------------------------------------------------------------------
    def execute(self, tensors: Mapping[str, Any]) -> None:
        """Run the selected plan (the autotune winner, or build_plan_at_index's choice)."""
        if self._active is None:
            raise UsageError("no plan selected: run autotune() or build_plan_at_index() first")
        self._check_tensors(tensors)
        self._run_after_caller(self._active[2], tensors)

    def _run_after_caller(self, plan: Plan, tensors: Mapping[str, Any]) -> None:
        """Run on the device stream, ordered after the caller's stream's work and before its next."""
        follow = self.device.extras.get("follow_caller")
        if follow is None:
            plan.run(tensors, self.workspace_for(plan.workspace_size), self.device.stream)
            return
        with follow(self.device):
            plan.run(tensors, self.workspace_for(plan.workspace_size), self.device.stream)

    @property
    def winner(self) -> AutotuneResult | None:
        return self.results[0] if self.results and self.results[0].succeeded else None

    def close(self) -> None:
        """Release plans and the workspace."""
        built = {id(s.cand.plan) for s in self._built or [] if s.cand.plan is not None}
        for slot in self._built or []:
            if slot.cand.plan is not None:
                close_plan(slot.cand.plan)
        if self._active is not None and id(self._active[2]) not in built:
            close_plan(self._active[2])
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
        phases: PhaseClock | None = None,
        prepare: bool = True,
    ) -> list[AutotuneResult]:
        """Measure every candidate; return one result per candidate, ranked.

        ``tensors`` defaults to random inputs (seeded) and poisoned outputs on
        the device. ``listener`` receives each candidate's result as soon as it
        is final (before ranking, so with rank -1). ``only`` restricts the run to
        those plan specs (resuming): the others get no result, and every result
        keeps its candidate index in the full list. ``phases`` learns how long
        the measuring thread waited for compiles and measured (farm.tuner.phases).
        ``prepare``: let the candidates' engines start what their compiles want
        (Triton's compile pool: a process that tunes compiles in parallel); the
        replay runtime, which only tunes a missing shape now and then, passes False.
        Raises AutotuneError when no candidate succeeds; the error carries ``.results``.
        """
        config = config or AutotuneConfig()
        if not self.device.checks_numerics and config.check is not ResultCheck.OFF:
            config = replace(config, check=ResultCheck.OFF)
        if tensors is None:
            tensors = make_tensors(self.problem, self.device.arrays, seed)
        self._check_tensors(tensors)
        candidates = self._candidates(config, only)
        if prepare:
            kind = "gpu" if self.device.vendor in ("nvidia", "amd") else self.device.vendor
            self.registry.prepare({c.engine.name for c in candidates if c.engine is not None}, kind)
        t0 = time.perf_counter()
        log.info("autotune: start %s (key %s) on %s: %d candidate(s), mode %s, strategy %s",
                 self.problem.label(), self.problem.key, self.device.properties.name, len(candidates),
                 config.mode.value, config.strategy.value)
        run = TuningRun(self, config, tensors, listener, phases)
        results = run.execute(candidates, prebuilt=self._built is not None)
        ranked = rank_results(results, config.ranking_fn, config.ranking)
        self.results = ranked
        ok = [r for r in ranked if r.succeeded]
        summary = ", ".join(f"{n} {d}" for d, n in sorted(collections.Counter(r.disposition.value for r in ranked).items()))
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
        if config.storage is not None:  # the RFC's storage config: the rank-0 winner into an override file
            config.storage.write(self.problem, ranked, self.device)
        return ranked

    # -- helpers --------------------------------------------------------------------
    def _candidates(self, config: AutotuneConfig, only: Iterable[PlanSpec] | None) -> list[CandidateRun]:
        """The candidates of this call: the built plans, or the plan specs (those in ``only``, if given)."""
        if self._built is not None:
            if config.mode is TuneMode.EXHAUSTIVE:
                raise UsageError("EXHAUSTIVE mode needs the plan-spec path; these plans were built already")
            return [slot.cand for slot in self._built]  # every slot, indices as built; unbuilt ones compile
        if not self._collection.specs:
            raise AutotuneError("no autotuning candidates: add engines first")
        wanted = set(only) if only is not None else None
        candidates = [self._candidate(i, s) for i, s in enumerate(self._collection.specs)
                      if wanted is None or s in wanted]
        if not candidates:
            raise AutotuneError("no autotuning candidates left: every plan spec was excluded by 'only'")
        return candidates

    def _candidate(self, index: int, spec: PlanSpec) -> CandidateRun:
        engine = self.registry.get(spec.engine_id) if spec.engine_id in self.registry else None
        return CandidateRun(index, spec, engine, self._collection.estimated_workspace(spec))

    # -- used by the measuring session (farm.tuner.session) ---------------------------------
    def barred_reason(self, spec: PlanSpec) -> str | None:
        """Why an engine deselection bars this plan spec (None: it may run)."""
        return self._collection.barred_reason(spec)

    def ceiling_reason(self, workspace: int) -> str | None:
        """Why a compiled plan of this workspace is over the deselect ceiling (None: it is not)."""
        return self._collection.ceiling_reason(workspace)

    def unsupported_reason(self, cand: CandidateRun) -> str | None:
        """Why no engine can build this candidate here (None: it applies)."""
        if cand.engine is None:
            return f"unknown engine id {cand.spec.engine_id}"
        support = self.registry.config_for(cand.engine, self.problem, self.device)
        return None if support.applicable else f"{cand.engine.name} does not apply: {support.reason}"

    def compile_key(self, cand: CandidateRun) -> str | None:
        """The host-wide key of the artifact compiling ``cand`` produces, if its engine declares one."""
        if not isinstance(cand.engine, CompileKeyed):
            return None
        try:
            return cand.engine.compile_key(self.problem, settings_to_resolved(cand.engine, cand.spec.knobs), self.device)
        except Exception as exc:  # no key means no sharing, never a failed candidate
            log.warning("autotune: %s.compile_key failed (%s); compiling without host-wide sharing",
                        cand.engine.name, error_text(exc))
            return None

    def compile_candidate(self, cand: CandidateRun, *, benchmarking: bool = False) -> Plan | None:
        """Compile (or, with ``benchmarking``, build a priming plan). Sets cand.error on failure."""
        engine = cand.engine
        why = self.unsupported_reason(cand)
        if why is not None:
            cand.error = why
            return None
        t0 = time.perf_counter()
        self.in_flight[cand.spec] = time.monotonic()
        try:
            plan = engine.compile(self.problem, settings_to_resolved(engine, cand.spec.knobs, benchmarking=benchmarking), self.device)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # any compile failure is that candidate's
            reraise_user_interrupt(exc)  # ... but a user's Ctrl-C stops the tuning
            cand.error = f"{engine.name}: compile: {error_text(exc)}"
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


def ranked_configs(configs: Sequence[EngineConfig], modes: Sequence[HeuristicMode],
                   registry: EngineRegistry) -> list[EngineConfig]:
    """``configs`` ranked by each heuristic mode in turn, each engine once: FALLBACK keeps discovery order, the
    others rank by the engines' declared priority, then name (StaticOrdering's rule: the one heuristic here)."""
    out: dict[int, EngineConfig] = {}
    for mode in modes:
        ranked = configs if mode is HeuristicMode.FALLBACK else sorted(
            configs, key=lambda c: (engine_priority(registry.get(c.engine_id)), c.engine_name))
        for c in ranked:
            out.setdefault(c.engine_id, c)
    return list(out.values())
