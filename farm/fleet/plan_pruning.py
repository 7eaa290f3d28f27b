"""A pruned tune's planning: which of a problem's discovered candidates the farm measures (farm tune --prune,
--history).

Both executors call :meth:`PlanPruning.apply` between discovery and measuring: the candidates it returns are
measured, the others get a ``pruned`` row now (once: a resume that prunes again writes none twice). A
candidate measured by an earlier run stays in (its row takes part in the winner rule and the confirmation
stage as before); one pruned by an earlier run is measured when this run does not prune.

Two reasons not to measure a candidate: the cost model ranks it out (``settings``), or the problem is already
decided for this device in a published root (``check_decided``: only the published winner and the default are
measured, so the confirmation stage checks the decision still holds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from farm.costmodel.pruning import PruneChoice, Pruner, default_position, pruned_result
from farm.devices.properties import DeviceProperties
from farm.fleet.tasks import Candidate, PriorRow
from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, AutotuneResult, Disposition, PruneSettings
from farm.model.workload import WorkloadProblem
from farm.store.deciding.incumbents import decided_keys
from farm.store.results import MeasurementContext, now_iso

Write = Callable[[Sequence[tuple[AutotuneResult, WorkloadProblem, MeasurementContext]]], None]


@dataclass
class DecidedTally:
    """Problems a published decision spared (job.json's ``pruning.decided``): signature -> problem names."""

    checked: dict[str, list[str]] = field(default_factory=dict)
    spared: int = 0  # candidates not measured for them

    def to_json(self) -> dict[str, Any]:
        return {"checked": self.checked, "spared": self.spared}


class PlanPruning:
    def __init__(self, settings: PruneSettings | None, config: AutotuneConfig, write: Write,
                 pruner: Pruner | None = None, *, check_decided: bool = False) -> None:
        # the model file is read (and refused) here, before any device time
        self.pruner = pruner or (Pruner(settings) if settings is not None else None)
        self.config = config
        self.write = write
        self.check_decided = check_decided
        self.decided = DecidedTally()
        self._decided_keys: dict[int, tuple[Any, frozenset[str]]] = {}

    @staticmethod
    def of(config: AutotuneConfig, *, check_decided: bool = False) -> "PlanPruning | None":
        """The planning ``config`` asks for; None where every candidate is measured."""
        if config.prune is None and not check_decided:
            return None
        return PlanPruning(config.prune, config, lambda rows: None, check_decided=check_decided)

    def decides(self, current: Any, problem: Any) -> bool:
        """Whether the incumbents' file ``current`` holds a decision made for ``problem`` itself (its problem key),
        not a rule that merely matches it; the file's keys are read once."""
        if current is None:
            return False
        held = self._decided_keys.get(id(current))
        if held is None or held[0] is not current:
            held = self._decided_keys[id(current)] = (current, decided_keys(current))
        return problem.key in held[1]

    def dry(self) -> "PlanPruning":
        """The same choices, nothing written or counted (planning that may be thrown away)."""
        pruner = Pruner(self.pruner.settings, self.pruner.model) if self.pruner is not None else None
        return PlanPruning(None, self.config, lambda rows: None, pruner, check_decided=self.check_decided)

    def apply(self, props: DeviceProperties, wp: WorkloadProblem, candidates: Sequence[Candidate],
              prior: Iterable[PriorRow] = (), incumbent: PlanSpec | None = None, *,
              decided: bool = False) -> list[Candidate]:
        """The candidates to measure; the rest are written as pruned rows. ``decided``: the incumbents' file holds
        a decision for this very problem (not a rule that merely matches it)."""
        prior = list(prior)
        have = {r.spec for r in prior if not r.pruned}
        was_pruned = {r.spec for r in prior if r.pruned}
        cands = sorted(candidates, key=lambda c: c.index)
        named = [(c.engine_name, c.spec.knobs) for c in cands]
        position = next((i for i, c in enumerate(cands) if c.spec == incumbent), None)
        started = now_iso()
        checked = self.check_decided and decided and position is not None
        if checked:
            measure = sorted({position} | {i for i in (default_position(named),) if i is not None})
            why = (f"not measured: decided in the published root ({cands[position].engine_name} checked against "
                   f"the default)")
            choice = PruneChoice(tuple(measure), tuple(i for i in range(len(cands)) if i not in measure))
            make = lambda i: self._decided_result(wp, cands[i], why, started)  # noqa: E731
            self.decided.checked.setdefault(props.signature, []).append(wp.name)
        elif self.pruner is not None:
            choice = self.pruner.decide(props.signature, wp.name, wp.problem, props.to_dict(), named,
                                        incumbent=position)
            make = lambda i: pruned_result(wp.problem.key, cands[i].spec.engine_id, cands[i].engine_name,  # noqa: E731
                                           cands[i].spec.knobs, cands[i].index, choice, i, self.config, started)
        else:
            return cands
        keep = set(choice.measure) | {i for i in choice.pruned if cands[i].spec in have}
        if checked:
            self.decided.spared += len(cands) - len(keep)
        where = MeasurementContext(props)
        rows = [(make(i), wp, where) for i in choice.pruned if i not in keep and cands[i].spec not in was_pruned]
        if rows:
            self.write(rows)
        return [cands[i] for i in sorted(keep)]

    def _decided_result(self, wp: WorkloadProblem, c: Candidate, why: str, started: str) -> AutotuneResult:
        return AutotuneResult(problem_key=wp.problem.key, engine_id=c.spec.engine_id, engine_name=c.engine_name,
                              knobs=c.spec.knobs, disposition=Disposition.PRUNED, mode=self.config.mode,
                              strategy=self.config.strategy, candidate=c.index, error=why, started_at=started)

    def settings_record(self) -> dict[str, Any] | None:
        """For job.json's settings: the model's settings and provenance, and whether decisions are only checked."""
        record = self.pruner.record() if self.pruner is not None else {}
        return {**record, "check_decided": self.check_decided}

    def tally(self) -> dict[str, Any]:
        """What this run measured and spared (job.json's ``pruning``)."""
        out = self.pruner.tally.to_json() if self.pruner is not None else {}
        return {**out, "decided": self.decided.to_json()}

    def record(self) -> dict[str, Any]:
        return {**(self.settings_record() or {}), **self.tally()}
