"""The scheduler's values: a discovered candidate, a task of candidates for one device, a row measured before (what a
resume rebuilds from), the rounds, and the rules the scheduler and the in-process executor share over earlier rows
(which calling modes' stages ran whole; which candidates failed in a stage)."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Iterable

from farm.model.plans import PlanSpec
from farm.model.workload import WorkloadProblem

MAIN, FINALIST, CONFIRM = "main", "finalist", "confirm"


def kernel_family(problem: WorkloadProblem) -> tuple[str, ...]:
    """Problems of one family (op, storage and compute dtypes) tend to share JIT-compiled kernels.

    Two devices starting such problems at once both wait for the same compiles (one compiles,
    the other waits on its claim), where one device alone would compile once and then hit its
    cache; so a device first takes work of a family no other device is running.
    """
    p = problem.problem
    return (p.op, *sorted({t.dtype for t in p.tensors}), p.compute_dtype)


@dataclass(frozen=True)
class Candidate:
    """A plan spec as discovered on a signature: its identity, engine name, and discovery position."""

    spec: PlanSpec
    engine_name: str
    index: int
    supports_exhaustive: bool = False
    estimated_workspace: int | None = None


@dataclass(frozen=True)
class Task:
    id: int
    signature: str
    problem: int  # index in the workload
    specs: tuple[PlanSpec, ...]
    round: str = MAIN
    careful: bool = False
    call: str = ""  # a confirm task: the calling mode it times
    reference: PlanSpec | None = None  # a confirm task: the default (what a challenger must beat)
    incumbent: PlanSpec | None = None  # a confirm task: the incumbent
    attempt: int = 1  # a confirm task: how many times its stage has been started
    probe: bool = False  # a confirm task of one participant, alone: did it kill or hang the stage's worker?

    @property
    def size(self) -> int:
        return len(self.specs)


@dataclass(frozen=True)
class PriorRow:
    """A row measured before (resume): enough to rebuild the state."""

    spec: PlanSpec
    round: str
    session: str
    succeeded: bool
    median_ms: float | None
    mad_ms: float | None = None
    call: str = ""  # the calling mode of a confirm row
    measured_at: float = 0.0  # seconds since the epoch
    session_size: int | None = None  # a confirm row: the rows its stage wrote in all
    pruned: bool = False  # a cost model skipped it (farm tune --prune): no measurement, so still to measure
    converged: bool = True  # a confirm row: its stage decided before its budget ended (``settled``)


def confirmed_calls(rows: Iterable[PriorRow], redo_undecided: bool = False) -> set[str]:
    """The calling modes whose confirmation stage ran whole after the problem's last main-round measurement (a
    stage cut short has fewer rows on disk than its ``session_size``; a stage's failed row written apart from a
    stage, for a participant that hung or killed its worker, has none). With ``redo_undecided`` (farm tune
    --reconfirm) the latest such stage must also have decided: one whose budget ended undecided runs again."""
    rows = list(rows)
    main = max((r.measured_at for r in rows if r.round != CONFIRM and not r.pruned), default=0.0)
    sessions = collections.Counter(r.session for r in rows if r.round == CONFIRM)
    whole = [r for r in rows if r.round == CONFIRM and r.measured_at >= main and r.session_size
             and sessions[r.session] >= r.session_size]
    if not redo_undecided:
        return {r.call for r in whole}
    latest: dict[str, PriorRow] = {}
    for r in whole:
        if r.call not in latest or r.measured_at > latest[r.call].measured_at:
            latest[r.call] = r
    decided = {r.session for r in whole if r.succeeded and r.converged}
    return {call for call, r in latest.items() if r.session in decided}


def failed_in_stage(rows: Iterable[PriorRow]) -> set[PlanSpec]:
    """The candidates whose newest row is a failed confirmation-stage row (newer than their main-round one):
    they take part in no stage again and are never published, until a main round measures them again."""
    newest: dict[PlanSpec, tuple[float, bool]] = {}
    for r in rows:
        if r.pruned:
            continue
        failed = r.round == CONFIRM and not r.succeeded
        if r.round == CONFIRM and not failed:
            continue
        at = (r.measured_at, failed)  # at the same instant the failure counts
        if r.spec not in newest or at > newest[r.spec]:
            newest[r.spec] = at
    return {spec for spec, (_, failed) in newest.items() if failed}
