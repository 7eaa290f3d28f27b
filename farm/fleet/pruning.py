"""A pruned tune's planning: which of a problem's discovered candidates the farm measures (farm tune --prune).

Both executors call :meth:`PlanPruning.apply` between discovery and measuring: the candidates it returns are
measured, the others get a ``pruned`` row now (once: a resume that prunes again writes none twice). A
candidate measured by an earlier run stays in (its row takes part in the winner rule and the confirmation
stage as before); one pruned by an earlier run is measured when this run does not prune.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from farm.costmodel.pruning import Pruner, pruned_result
from farm.devices.properties import DeviceProperties
from farm.fleet.scheduler import Candidate, PriorRow
from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, AutotuneResult, PruneSettings
from farm.model.workload import WorkloadProblem
from farm.store.results import MeasurementContext, now_iso

Write = Callable[[Sequence[tuple[AutotuneResult, WorkloadProblem, MeasurementContext]]], None]


class PlanPruning:
    def __init__(self, settings: PruneSettings, config: AutotuneConfig, write: Write, pruner: Pruner | None = None) -> None:
        self.pruner = pruner or Pruner(settings)  # the model file is read (and refused) here, before any device time
        self.config = config
        self.write = write

    def dry(self) -> "PlanPruning":
        """The same choices, nothing written or counted (planning that may be thrown away)."""
        return PlanPruning(self.pruner.settings, self.config, lambda rows: None,
                           Pruner(self.pruner.settings, self.pruner.model))

    def apply(self, props: DeviceProperties, wp: WorkloadProblem, candidates: Sequence[Candidate],
              prior: Iterable[PriorRow] = (), incumbent: PlanSpec | None = None) -> list[Candidate]:
        """The candidates to measure; the rest are written as pruned rows."""
        prior = list(prior)
        have = {r.spec for r in prior if not r.pruned}
        was_pruned = {r.spec for r in prior if r.pruned}
        cands = sorted(candidates, key=lambda c: c.index)
        position = next((i for i, c in enumerate(cands) if c.spec == incumbent), None)
        choice = self.pruner.decide(props.signature, wp.name, wp.problem, props.to_dict(),
                                    [(c.engine_name, c.spec.knobs) for c in cands], incumbent=position)
        keep = set(choice.measure) | {i for i in choice.pruned if cands[i].spec in have}
        where = MeasurementContext(props)
        started = now_iso()
        rows = [(pruned_result(wp.problem.key, cands[i].spec.engine_id, cands[i].engine_name, cands[i].spec.knobs,
                               cands[i].index, choice, i, self.config, started), wp, where)
                for i in choice.pruned if i not in keep and cands[i].spec not in was_pruned]
        if rows:
            self.write(rows)
        return [cands[i] for i in sorted(keep)]

    def record(self) -> dict[str, Any]:
        return {**self.pruner.record(), **self.pruner.tally.to_json()}
