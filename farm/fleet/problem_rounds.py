"""A problem's rounds on the farm, for the scheduler (farm.fleet.scheduler): its state, the finalists a finalist
round measures again, the row of a candidate a lost task settles, and its confirmation stages (one task per calling
mode; a stage that loses its worker has its participants probed one at a time)."""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Callable

from farm.fleet.tasks import CONFIRM, Candidate, Task
from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, AutotuneResult, CallMode, ConfirmSettings, Disposition
from farm.model.workload import WorkloadProblem
from farm.tuner.judging.confirm import Measured, participants
from farm.tuner.judging.winner import is_noisy

log = logging.getLogger("farm.fleet.scheduler")

MAX_STAGE_PROBES = 2  # a stage that loses its worker has its participants run alone, at most this many times


@dataclass
class StageProbe:
    """A stage whose worker died or hung: each participant runs alone (a probe) to find which one did it."""

    stage: Task
    left: int  # probes not finished
    culprits: set[PlanSpec] = field(default_factory=set)


@dataclass
class ProblemState:
    """One problem of one signature on the farm: its candidates, what its rounds measured, what is in flight."""

    wp: WorkloadProblem
    candidates: dict[PlanSpec, Candidate]
    pending: set[PlanSpec]  # main round: no row yet
    outstanding: int = 0  # tasks queued or running
    successes: dict[PlanSpec, tuple[str, float, float]] = field(default_factory=dict)  # main: session, median, MAD
    finalist: str = "none"  # none | queued | done
    strikes: collections.Counter = field(default_factory=collections.Counter)
    calls: tuple[str, ...] = ()  # calling modes the confirmation stage runs for ((): off)
    confirmed: set[str] = field(default_factory=set)  # calling modes whose stage is current
    incumbent: PlanSpec | None = None
    measured_now: bool = False  # main-round rows arrived in this run (an earlier stage is stale then)
    probes: dict[str, StageProbe] = field(default_factory=dict)  # calling mode -> its stage's probes in flight
    planned: int = 0  # candidates given for it (after a cost model's pruning)
    measured_before: int = 0  # of those, with a main-round row of an earlier run (not measured again)


def failure_row(state: ProblemState, spec: PlanSpec, kind: str, config: AutotuneConfig,
                detail: str, stage: str = "") -> AutotuneResult:
    """The row of a candidate a lost task settles: quarantined after its strikes, hung, or out of its stage."""
    cand = state.candidates[spec]
    if stage:  # a confirmation stage's participant, run alone after its stage lost its worker
        disposition = Disposition.TIMED_OUT if kind in ("timeout", "silent") else Disposition.CRASHED
        what = ("no result within the candidate timeout; its worker was restarted" if kind in ("timeout", "silent")
                else "killed its worker" if kind == "crash" else "failed its task")
        short = detail.split(": ")[0]  # 'worker sim:0 died' (Ray's account of it is for its log)
        error = f"confirmation ({stage}): {what}, run alone after its stage lost its worker{': ' + short if short else ''}"
    elif kind == "timeout":
        disposition = Disposition.TIMED_OUT
        error = f"no result within the candidate timeout; its worker was restarted{': ' + detail if detail else ''}"
    else:
        disposition = Disposition.CRASHED
        error = (f"killed its worker {state.strikes[spec]} times; quarantined"
                 f"{': ' + detail if detail else ''}")
    return AutotuneResult(
        problem_key=state.wp.problem.key, engine_id=spec.engine_id, engine_name=cand.engine_name, knobs=spec.knobs,
        disposition=disposition, mode=config.mode, strategy=config.strategy, candidate=cand.index, error=error,
        supports_exhaustive=cand.supports_exhaustive, estimated_workspace=cand.estimated_workspace,
    )


def finalists(state: ProblemState, finalist_k: int) -> tuple[PlanSpec, ...] | None:
    """What a finalist round measures again, in discovery order; None when one session measured everything.

    Per session its ``finalist_k`` fastest and its fastest stable candidate, and the default: every
    candidate the winner rule (farm.tuner.judging.winner) could pick, so the round decides as one session would.
    """
    sessions: dict[str, list[tuple[float, int, PlanSpec]]] = {}
    for spec, (session, median, _) in state.successes.items():
        sessions.setdefault(session, []).append((median, state.candidates[spec].index, spec))
    if len(sessions) < 2:
        return None  # measured together already
    finalists: list[PlanSpec] = []
    for rows in sessions.values():
        rows.sort()
        finalists += [spec for _, _, spec in rows[:finalist_k]]
        stable = next((spec for median, _, spec in rows if not is_noisy(median, state.successes[spec][2])), None)
        if stable is not None:
            finalists.append(stable)
    defaults = [s for s in state.successes if not s.knobs]
    if defaults:  # the default is compared in the final round too: it gets the benefit of the doubt there
        finalists.append(min(defaults, key=lambda s: state.candidates[s].index))
    return tuple(sorted(set(finalists), key=lambda s: state.candidates[s].index))


class ConfirmStages:
    """The confirmation stages of the scheduler's problems: ``push(signature, index, specs, **task)`` queues a task,
    ``next_round(signature, index)`` moves a problem on once a stage settled."""

    def __init__(self, confirm: ConfirmSettings, push: Callable[..., Task],
                 next_round: Callable[[str, int], None]) -> None:
        self.confirm, self.push, self.next_round = confirm, push, next_round

    def queue(self, signature: str, index: int, state: ProblemState) -> bool:
        """Queue a confirm task per calling mode that needs one; False when there is none to run."""
        if state.measured_now:
            state.confirmed, state.measured_now = set(), False  # new rows: every stage again
        todo = [c for c in state.calls if c not in state.confirmed]
        if not todo:
            return False
        measured = [Measured(spec, state.candidates[spec].index, session, median, mad)
                    for spec, (session, median, mad) in state.successes.items()]
        defaults = [m for m in measured if not m.spec.knobs]
        default = min(defaults, key=lambda m: m.index).spec if defaults else None
        leader = min(measured, key=lambda m: (m.median_ms, m.index)).spec if measured else None
        queued = False
        for call in todo:
            state.confirmed.add(call)  # queued: settled when its task ends (or is given up); nothing to compare: none
            chosen = participants(measured, default=default, incumbent=state.incumbent,
                                  max_candidates=self.confirm.max_candidates, runners_up=self.confirm.runners_up,
                                  engine_leaders=call == CallMode.EAGER.value)
            if chosen:
                self.push(signature, index, chosen, round=CONFIRM, urgent=True, call=call,
                           reference=default or leader, incumbent=state.incumbent)
                queued = True
        return queued

    def lost(self, task: Task, state: ProblemState, kind: str, config: AutotuneConfig, detail: str
             ) -> list[AutotuneResult]:
        """A confirmation stage's task lost: run again (not started), its probe's participant out, its participants
        probed one at a time, or (lost again) the problem decided on its main round."""
        rows: list[AutotuneResult] = []
        if kind == "not_started":  # again, as it was (its rows come at its end)
            self.push(task.signature, task.problem, task.specs, round=CONFIRM, urgent=True, call=task.call,
                       reference=task.reference, incumbent=task.incumbent, attempt=task.attempt, probe=task.probe,
                       careful=task.careful)
        elif task.probe:  # this participant, alone, killed or hung its worker: it is out of the stage
            culprit = task.specs[0]
            rows.append(failure_row(state, culprit, kind, config, detail, stage=task.call))
            self.probe_done(task, state, culprit)
        elif task.attempt <= MAX_STAGE_PROBES:
            # the stage lost its worker: which participant did it is unknown (its rows come at its end), so
            # each runs alone; the stage then runs again without those that failed
            state.probes[task.call] = StageProbe(task, len(task.specs))
            log.warning("farm: the %s confirmation stage of %s lost its worker (%s): running its %d "
                        "participant(s) one at a time to find which", task.call, state.wp.name, detail or kind,
                        len(task.specs))
            for spec in task.specs:
                self.push(task.signature, task.problem, (spec,), round=CONFIRM, urgent=True, careful=True,
                           call=task.call, reference=task.reference, incumbent=task.incumbent,
                           attempt=task.attempt, probe=True)
        else:  # lost again: the problem is decided on its main round (without what failed in a probe)
            log.warning("farm: the %s confirmation stage of %s lost its worker again (%s): decided on the main "
                        "round", task.call, state.wp.name, detail or kind)
            state.confirmed.add(task.call)
            self.next_round(task.signature, task.problem)
        return rows

    def probe_done(self, task: Task, state: ProblemState, culprit: PlanSpec | None) -> None:
        """A probe ended (``culprit``: its participant failed it). After the last one the stage runs again
        without the participants that failed, or, with fewer than two left, the main round decides."""
        probing = state.probes.get(task.call)
        if probing is None:
            return
        if culprit is not None:
            probing.culprits.add(culprit)
            state.successes.pop(culprit, None)  # in no later stage either
        probing.left -= 1
        if probing.left > 0:
            return
        del state.probes[task.call]
        stage = probing.stage
        rest = tuple(s for s in stage.specs if s not in probing.culprits)
        if len(rest) >= 2:
            log.warning("farm: the %s confirmation stage of %s runs again without %d participant(s) that failed alone",
                        task.call, state.wp.name, len(stage.specs) - len(rest))
            self.push(task.signature, task.problem, rest, round=CONFIRM, urgent=True, call=stage.call,
                       reference=stage.reference, incumbent=stage.incumbent, attempt=stage.attempt + 1)
            return
        state.confirmed.add(task.call)  # nothing left to compare: the main round decides
        self.next_round(task.signature, task.problem)
