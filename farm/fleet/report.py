"""A tuning run's report, the same type on both executors (farm.fleet.on_ray.cluster.run_farm and
farm.fleet.local_run.run_local)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from farm.fleet.driver import WorkerStatus
from farm.fleet.job import JobSummary
from farm.fleet.on_ray.worker import WorkerInfo
from farm.model.records import AutotuneResult
from farm.store.reduce import ReduceReport
from farm.tuner.phases import PhaseSplit
from farm.tuner.problem_tuning import ProblemOutcome


@dataclass
class TuneReport:
    """What a tuning run did, on either executor (Ray's, or --in-process: one worker, this process's)."""

    job_id: str
    run_id: str
    workers: list[WorkerInfo]
    statuses: list[WorkerStatus]
    problems_skipped: dict[str, dict[str, str]]  # signature -> problem name -> why it was not tuned
    counts: dict[str, int]
    wall_s: float
    total: int
    remeasured: int
    tuning_s: float = 0.0  # from the workers' start to the last result (busy fractions are of this)
    phases: PhaseSplit = PhaseSplit()  # every worker's time by phase, summed (each worker's is in its status)
    results: dict[tuple[str, str], list[AutotuneResult]] = field(default_factory=dict)  # (signature, problem name)
    pruning: dict[str, Any] | None = None  # farm tune --prune: the settings and what was measured and pruned
    # (signature, problem name, calling mode) -> the confirmation stage's rows
    confirmations: dict[tuple[str, str, str], list[AutotuneResult]] = field(default_factory=dict)
    workers_started: bool = True  # False: a resume with nothing to measure, found without Ray
    summary: JobSummary | None = None  # how the run ended (set once it has)
    reduce: ReduceReport | None = None
    nodes: list[dict[str, Any]] = field(default_factory=list)  # the nodes with device workers (NodeRecord.to_json)
    waiting: dict[str, list[str]] = field(default_factory=dict)  # signature -> problems left for a device of it
    handles: list[Any] = field(default_factory=list, repr=False)  # the driver's WorkerHandles, as ``workers``
    outcomes: list[ProblemOutcome] = field(default_factory=list)  # in-process: each problem's rows, in order

    @property
    def rows_written(self) -> int:
        return self.summary.rows_written if self.summary else 0
