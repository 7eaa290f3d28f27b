"""The autotuning RFC's compiled-plan path of the Autotuner (farm.tuner.autotuner): build the plan list (one slot
per plan spec; an index never moves), ask each plan's workspace and name, run one by index, or hard-select one
engine (hipDNN's ``create_execution_plan_ext``) for :meth:`Autotuner.execute`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from farm.devices.device import Device
from farm.errors import AutotuneError, InputError, UnknownNameError, UsageError
from farm.model.engine import Engine, EngineRegistry, Plan, engine_id, known_file_knobs
from farm.model.knobs import KnobValue, candidate_label
from farm.model.plans import PlanSpec, PlanSpecCollection
from farm.model.problem import Problem
from farm.model.records import BuildPolicy
from farm.tuner.candidate import CandidateRun, close_plan

log = logging.getLogger("farm.tuner.autotuner")


@dataclass
class PlanSlot:
    """One entry of the compiled-plan list: its plan spec and build state (``cand.plan``, ``cand.error``)."""

    spec: PlanSpec
    cand: CandidateRun


class CompiledPlans:
    """The plan-list half of the Autotuner; of the tuner it uses the attributes below and its barred_reason,
    ceiling_reason, compile_candidate, _candidate, _check_tensors and _run_after_caller."""

    problem: Problem
    device: Device
    registry: EngineRegistry
    _collection: PlanSpecCollection
    _built: list[PlanSlot] | None
    _active: tuple[PlanSpec, Engine, Plan] | None

    def build_plans(self, policy: BuildPolicy | str = BuildPolicy.ALL) -> int:
        """Make the plan list (one slot per plan spec, in order) and compile into it; returns the plans built.

        ``ALL`` compiles every slot not barred; ``HEURISTICS_CHOICE`` stops at the first one that compiles
        (the others can be built later with build_plan_at_index). A slot that fails to compile keeps its
        index, with the reason; ``plan_count`` counts every slot.
        """
        policy = BuildPolicy(policy) if not isinstance(policy, BuildPolicy) else policy
        if not self._collection.specs:
            raise AutotuneError("no plan specs to build: add engines first")
        if self._built is None:
            self._built = [PlanSlot(spec, self._candidate(i, spec)) for i, spec in enumerate(self._collection.specs)]
            self._collection.lock("plans were built (compiled-plan path)")
        built = 0
        for slot in self._built:
            if self.barred_reason(slot.spec) is not None:
                continue
            if slot.cand.plan is None and not slot.cand.error:
                self.compile_candidate(slot.cand)
                if slot.cand.plan is None:
                    log.warning("autotune: %s not built: %s", slot.spec.describe(self.registry), slot.cand.error)
            built += slot.cand.plan is not None
            if policy is BuildPolicy.HEURISTICS_CHOICE and built:
                break
        log.info("autotune: built %d of %d plan(s) for %s (%s)", built, len(self._built), self.problem.label(), policy.value)
        return built

    @property
    def plan_count(self) -> int:
        """Every slot of the plan list, excluded and failed ones included (indices never move)."""
        return len(self._require_built())

    def _require_built(self) -> list[PlanSlot]:
        if self._built is None:
            raise UsageError("no compiled plans: call build_plans() first")
        return self._built

    def _slot(self, index: int) -> PlanSlot:
        built = self._require_built()
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(built):
            raise UsageError(f"plan index {index!r} out of range: {len(built)} plan(s) in the list")
        return built[index]

    def excluded_reason(self, index: int) -> str | None:
        """Why plan ``index`` may not run (deselected, over the workspace ceiling, failed to build), or None."""
        slot = self._slot(index)
        reason = self.barred_reason(slot.spec)
        if reason is None and slot.cand.plan is not None:
            reason = self.ceiling_reason(int(slot.cand.plan.workspace_size))
        if reason is None and slot.cand.error:
            reason = f"failed to build: {slot.cand.error}"
        return reason

    def _runnable(self, index: int) -> tuple[PlanSpec, Engine, Plan]:
        slot = self._slot(index)
        reason = self.excluded_reason(index)
        if reason is not None:
            raise InputError(f"invalid value: plan {index} ({self.plan_name_at_index(index)}) is excluded: {reason}",
                             field="index", value=index)
        if slot.cand.plan is None:
            raise UsageError(f"plan {index} ({self.plan_name_at_index(index)}) is not built: call build_plan_at_index({index})")
        return slot.spec, slot.cand.engine, slot.cand.plan

    def workspace_size_at_index(self, index: int) -> int:
        """The workspace compiled plan ``index`` needs; -1 for a plan never compiled (not built, or its build
        failed: the autotuning RFC's value; ``estimated_workspace_at_index`` gives the estimate). Index -1: the
        plan execute() runs."""
        if index == -1 and not isinstance(index, bool):
            if self._active is None:
                raise UsageError("no plan selected: run autotune() or build_plan_at_index() first")
            return int(self._active[2].workspace_size)
        slot = self._slot(index)
        if slot.cand.plan is not None:
            return int(slot.cand.plan.workspace_size)
        return -1

    def estimated_workspace_at_index(self, index: int) -> int:
        """The engine's pre-compile workspace estimate for plan ``index`` (0 when it gives none)."""
        return int(self._slot(index).cand.estimated_workspace or 0)

    def get_autotune_workspace_size(self) -> int:
        """The workspace autotune() needs on the compiled-plan path: the largest of the runnable built plans."""
        built = self._require_built()
        return max((int(s.cand.plan.workspace_size) for i, s in enumerate(built)
                    if s.cand.plan is not None and self.excluded_reason(i) is None), default=0)

    def plan_name_at_index(self, index: int) -> str:
        slot = self._slot(index)
        name = slot.cand.engine.name if slot.cand.engine is not None else str(slot.spec.engine_id)
        return candidate_label(name, slot.spec.knobs)

    def execute_plan_at_index(self, index: int, tensors: Mapping[str, Any]) -> None:
        """Run plan ``index`` (an excluded one is an InputError: invalid value)."""
        _, _, plan = self._runnable(index)
        self._check_tensors(tensors)
        self._run_after_caller(plan, tensors)

    def build_plan_at_index(self, index: int) -> None:
        """Build plan ``index`` if it is not yet, and make it the one :meth:`execute` runs."""
        slot = self._slot(index)
        if slot.cand.plan is None and not slot.cand.error and self.barred_reason(slot.spec) is None:
            self.compile_candidate(slot.cand)
        self._active = self._runnable(index)

    def create_execution_plan_ext(self, engine: int | str,
                                  knobs: Mapping[str, KnobValue] | Iterable[tuple[str, KnobValue]] | None = None) -> PlanSpec:
        """Hard-select one engine (hipDNN's ``create_execution_plan_ext``): compile its plan with these knobs and make
        it the one :meth:`execute` runs, whatever the plan list holds. Knobs the engine does not have are ignored
        with a warning, as hipDNN does; a bad value of one it has is an InputError; an engine that does not apply
        here, or whose compile fails, is an AutotuneError."""
        try:
            eng = self.registry.get(engine)
        except UnknownNameError as exc:
            raise InputError(str(exc), field="engine", value=engine) from None
        items = list(knobs.items() if isinstance(knobs, Mapping) else (knobs or ()))
        settings, ignored = known_file_knobs(eng, items, source=f"create_execution_plan_ext({eng.name})")
        if ignored:
            log.warning("autotune: create_execution_plan_ext: %s has no knob %s: ignored", eng.name, ", ".join(ignored))
        spec = PlanSpec(engine_id(eng), settings)
        cand = self._candidate(-1, spec)
        plan = self.compile_candidate(cand)
        if plan is None:
            raise AutotuneError(f"create_execution_plan_ext: {spec.describe(self.registry)} for {self.problem.label()}: "
                                f"{cand.error}")
        built = {id(s.cand.plan) for s in self._built or []}
        if self._active is not None and id(self._active[2]) not in built:
            close_plan(self._active[2])
        self._active = (spec, eng, plan)
        return spec
