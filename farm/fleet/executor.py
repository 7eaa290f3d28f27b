"""The seam between the farm's one planning and driving code and where its devices are.

Both executors run the same planner (farm.fleet.planner), scheduler and driver (farm.fleet.driver); what differs is
how a call reaches a worker: a method of a Ray actor (farm.fleet.on_ray.calls.RayCalls) or of the worker object in
this process (:class:`InProcessCalls`, ``farm tune --in-process``). A task's rows stream back from
``DeviceWorkerImpl.run`` on both (Ray: a generator's refs the event loop waits on; in-process: the iterator itself).

What starts a tuning job and what ends it is written here once, for both: the candidate budget bounded by the
candidate timeout, the cost model's pruning, the job folder's record (:func:`start_job`), and the check of the
reduce's decisions on a live worker of each signature (:func:`verify_on_workers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from farm.errors import FarmError, first_line
from farm.fleet.job import JobRun
from farm.fleet.options import FarmOptions
from farm.fleet.plan_pruning import PlanPruning
from farm.model.records import AutotuneConfig
from farm.model.workload import Workload

if TYPE_CHECKING:
    from farm.fleet.driver import WorkerHandle

# signature, the override file's text, its problem keys -> the verification's record (farm.replay.verify)
Verify = Callable[[str, str, list[str]], Any]


class WorkerCalls(Protocol):
    """How the planner and the end of a job call a worker (``WorkerHandle.actor``)."""

    gone: tuple[type[BaseException], ...]  # what a call raises when its worker went away (no blame on the work)

    def expand(self, worker: "WorkerHandle", chunk: Sequence[tuple[int, Any]]) -> Any:
        """Start discovery of ``chunk`` on ``worker``; -> a pending result."""

    def ready(self, pending: Any) -> bool:
        """The discovery has its answer (never waits)."""

    def result(self, pending: Any) -> dict[int, Any]:
        """The discovery's answer: workload index -> candidates, or why there are none."""

    def with_device(self, worker: "WorkerHandle", fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(device, *args)`` on the worker's device, waited for."""


class InProcessCalls:
    """The worker is an object of this process: a call is a method call, done when it returns."""

    gone: tuple[type[BaseException], ...] = ()

    def expand(self, worker: "WorkerHandle", chunk: Sequence[tuple[int, Any]]) -> dict[int, Any]:
        return worker.actor.expand(chunk)

    def ready(self, pending: Any) -> bool:
        return True

    def result(self, pending: dict[int, Any]) -> dict[int, Any]:
        return pending

    def with_device(self, worker: "WorkerHandle", fn: Callable[..., Any], *args: Any) -> Any:
        return worker.actor.with_device(fn, *args)


@dataclass(frozen=True)
class StartedJob:
    """A tuning job's folder opened for this run, with the budget and the pruning both executors apply."""

    run: JobRun
    config: AutotuneConfig  # the workload's, each candidate bounded by the candidate timeout
    pruning: PlanPruning | None  # farm tune --prune / --check-decided (None: every candidate is measured)


def start_job(workload: Workload, out: str | Path, options: FarmOptions, config: AutotuneConfig | None,
              record: dict[str, Any], job_id: str | None = None, *, timeout_s: float | None) -> StartedJob:
    """Open ``out`` for a run of ``workload`` on an executor described by ``record`` (the job record's fields).

    A candidate measured past its budget ends there on both executors (``timeout_s``, the candidate timeout; None:
    no bound), so a workload asking for a billion iterations gets a result, not a worker killed as hung; a cost
    model's file is read, and refused, before the folder is touched."""
    config = (config or workload.autotune).bounded_by(timeout_s)
    pruning = PlanPruning.of(config, check_decided=options.check_decided and bool(options.incumbents))
    jr = JobRun(out, workload, {**record, "candidate_timeout_s": timeout_s,
                                "incumbents": options.incumbents,
                                "prune": pruning.settings_record() if pruning else None}, job_id)
    if pruning is not None:
        pruning.write = jr.write  # a pruned candidate's row says why, beside the measured ones
    return StartedJob(jr, config, pruning)


def finish_job(job: StartedJob, options: FarmOptions, verify: Verify | None, **record: Any) -> Any:
    """The run's end: reduce (and verify) what was measured; -> the job's summary (farm.fleet.job.JobSummary)."""
    if job.pruning is not None:
        record["pruning"] = job.pruning.tally()
    return job.run.finish(reduce=options.reduce, top_k=options.top_k, verify=verify, **record)


def verify_on_workers(workers: Sequence["WorkerHandle"], calls: WorkerCalls, verifier: Callable[..., Any]) -> Verify:
    """``verify(signature, text, keys)``: ``verifier(device, text, keys)`` on a live worker of that signature (the
    decisions replayed where production on that kind of device would run them); a worker gone is passed over."""

    def verify(signature: str, text: str, keys: list[str]) -> Any:
        errors = []
        for w in workers:
            if w.info.signature != signature:
                continue
            try:
                return calls.with_device(w, verifier, text, keys)
            except calls.gone as exc:
                errors.append(f"{w.info.name}: {first_line(exc)}")
        raise FarmError(f"no worker of {signature} is up to verify its decisions ({'; '.join(errors) or 'none started'})")

    return verify
