"""The farm driver's decisions, without Ray: which worker runs what, and what each event means.

The Ray shell (farm.fleet.on_ray.cluster) starts tasks and waits on the workers' streams; every event it sees
goes to a :class:`Driver` method, which updates the scheduler, writes rows and says what to do next:

    for worker, task in driver.assignments(): ...start the task on worker.actor...
    driver.on_started(worker)            # the worker's TaskStarted
    driver.on_batch(worker, results)     # a batch of AutotuneResults
    driver.on_end(worker, end)           # its TaskEnd
    driver.on_lost(worker, detail)       # the actor died (a crash): the worker is restarting
    driver.on_unreachable(worker, why)   # it died, and its node may be going: judged once Ray knows which
    driver.on_silent(now)                # workers silent past their limit: the shell kills and restarts them
    driver.on_back(worker)               # a restarting worker answers again
    driver.add_worker(worker)            # a worker started on a node that joined
    driver.on_node_lost(node_id, why)    # a node is gone with its workers: their tasks run again elsewhere
    driver.check_waits()                 # a signature with work and no device left waits, then is given up

So the fault paths (a lost worker, a silent one, a task that ended short) are tested without Ray
(tests/fleet/test_driver.py), like the Scheduler.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

from farm.fleet.on_ray.nodes import DeviceWaits, NodeRecord, NodeTable
from farm.fleet.late_parts import written_unreported
from farm.fleet.options import FarmOptions
from farm.fleet.tasks import CONFIRM, FINALIST, Task
from farm.fleet.scheduler import Scheduler
from farm.fleet.on_ray.worker import TaskEnd, WorkerInfo
from farm.model.records import AutotuneConfig, AutotuneResult
from farm.model.workload import WorkloadProblem
from farm.store.results import MeasurementContext, new_id
from farm.tuner.phases import LOST, PhaseSplit

log = logging.getLogger("farm.fleet.driver")


class LossKind(str, enum.Enum):
    """How a task was lost (the Scheduler's ``kind``)."""

    CRASH = "crash"  # the worker died
    SILENT = "silent"  # the worker went silent on a task of several candidates: one of them may hang
    TIMEOUT = "timeout"  # the worker went silent on a careful task: its candidate hangs
    ERROR = "error"  # the task ended without a result for every candidate
    NOT_STARTED = "not_started"  # the worker went away before the task began: nobody is charged
    NODE_LOST = "node_lost"  # the worker's node is gone: nobody is charged, the task runs again as it was


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    RESTARTING = "restarting"
    STOPPED = "stopped"
    LOST = "lost"  # its node is gone: it takes no more work
    UNREACHABLE = "unreachable"  # it died while its node is still listed alive: a crash, or the node going


@dataclass
class WorkerStatus:
    """What a progress display shows of one worker."""

    name: str
    signature: str
    device: str
    host: str
    state: str = WorkerState.STARTING.value
    problem: str = ""
    candidates: int = 0
    failures: int = 0
    restarts: int = 0
    busy_s: float = 0.0
    phases: PhaseSplit = PhaseSplit()  # where its time went (farm.tuner.phases); idle is set at the end
    node_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "phases": self.phases.to_json()}


@dataclass
class FarmStatus:
    """A snapshot for progress displays."""

    total: int
    finished: int
    remeasured: int
    failed: int
    elapsed_s: float
    workers: list[WorkerStatus]
    signatures: list[str]
    phase: str = "tuning"
    nodes: list[NodeRecord] = field(default_factory=list)  # the nodes with device workers
    waiting: dict[str, float] = field(default_factory=dict)  # signature -> seconds it waits yet for a device
    given_up: dict[str, list[str]] = field(default_factory=dict)  # signature -> problems waiting for a device

    @property
    def eta_s(self) -> float | None:
        if not self.finished or self.finished >= self.total:
            return None
        return self.elapsed_s / self.finished * (self.total - self.finished)


@dataclass
class RunningTask:
    """A task on a worker: where its rows go, what it reported, and when it last said anything."""

    task: Task
    where: MeasurementContext
    started: float
    last_progress: float
    reported: list[AutotuneResult] = field(default_factory=list)
    on_device: bool = False  # the worker said it started the task


@dataclass
class WorkerHandle:
    """One device worker as the driver sees it (``actor`` is the Ray handle, opaque here)."""

    index: int
    info: WorkerInfo
    actor: Any
    status: WorkerStatus
    task: RunningTask | None = None
    restarting: bool = False
    lost: bool = False  # its node is gone
    unreachable: tuple[float, str] | None = None  # since when, and why: its death is not judged yet

    @property
    def up(self) -> bool:
        """Running and reachable (it may be busy)."""
        return not self.restarting and not self.lost and self.unreachable is None

    @property
    def free(self) -> bool:
        return self.task is None and self.up


class RowSink(Protocol):
    """Where rows go (farm.fleet.job.JobRun)."""

    def write(self, rows: Iterable[tuple[AutotuneResult, WorkloadProblem, MeasurementContext]]) -> None: ...

    def set_ranks(self, session_id: str, ranks: dict[str, int]) -> None: ...

    def count(self, results: Iterable[AutotuneResult]) -> None:
        """Results whose rows a worker wrote itself (counted, not written)."""

    def add_parts(self, parts: Iterable[tuple[str, int]]) -> None:
        """Results files a worker wrote (the run's manifest)."""

    def results_of_session(self, signature: str, op: str, session_id: str) -> list[AutotuneResult]:
        """Results a worker wrote into parts in a session (shared storage), reported or not."""

    def fence(self, signature: str, op: str, session_id: str) -> None:
        """A lost node's session runs again: a part of it written from now on is not data."""


class ProblemSource(Protocol):
    """Where more problems come from (farm.fleet.planner.Planner: discovery on the workers, in windows)."""

    @property
    def open(self) -> bool: ...

    def top_up(self) -> None: ...

    def add_worker(self, worker: "WorkerHandle") -> None:
        """A worker joined (its signature may be new: its whole workload is then discovered)."""

    def abandon(self, signature: str) -> list[int]:
        """No device of ``signature`` is left: stop discovering for it; -> the problems never discovered."""


class Driver:
    def __init__(self, scheduler: Scheduler, workers: Sequence[WorkerHandle], sink: RowSink, config: AutotuneConfig,
                 options: FarmOptions, *, clock: Callable[[], float] = time.perf_counter,
                 workers_write: bool = False, planner: ProblemSource | None = None, nodes: NodeTable | None = None) -> None:
        self.sched = scheduler
        self.planner = planner  # discovery in windows: more problems as the queues run short
        self.workers_write = workers_write  # workers write their rows (shared storage); the driver only counts
        self.workers = list(workers)
        self.sink = sink
        self.config = config
        self.options = options
        self.clock = clock
        self.t0 = clock()
        self.counts: dict[str, int] = {}
        self.results: dict[tuple[str, str], list[AutotuneResult]] = {}  # (signature, problem name), keep_results
        # (signature, problem name, calling mode) -> the confirmation stage's rows, keep_results
        self.confirmations: dict[tuple[str, str, str], list[AutotuneResult]] = {}
        self.signatures = sorted({w.info.signature for w in self.workers})
        self.nodes = nodes if nodes is not None else NodeTable()
        self.waits = DeviceWaits(options.device_wait_s)  # kinds of device the cluster lost, waited for

    # -- what to do next -------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Nothing left to discover, schedule, run or wait for."""
        return (self.sched.done and not any(w.task or w.restarting for w in self.workers)
                and (self.planner is None or not self.planner.open))

    @property
    def stuck(self) -> bool:
        """Work remains but nothing is queued, running or restarting: a bookkeeping bug."""
        return (not self.sched.done and not any(w.task or w.restarting for w in self.workers)
                and not any(self.sched.pending_tasks(s) for s in self.signatures)
                and (self.planner is None or not self.planner.open))

    def assignments(self) -> list[tuple[WorkerHandle, Task]]:
        """Give every free worker the next task of its signature; the caller starts them."""
        if self.planner is not None:
            self.planner.top_up()
        out = []
        for w in self.workers:
            if not w.free:
                continue
            task = self.sched.next_task(w.info.signature, w.index)
            if task is None:
                continue
            now = self.clock()
            where = MeasurementContext(w.info.properties, session_id=new_id(), host=w.info.host,
                                       actor_id=w.info.actor_id, node_id=w.info.node_id, round=task.round,
                                       call=task.call,
                                       # a probe's rows are no stage's (a stage is whole when all its rows are in)
                                       session_size=task.size if task.round == CONFIRM and not task.probe else None)
            w.task = RunningTask(task, where, now, now)
            wp = self.sched.problem_of(task)
            w.status.state = WorkerState.BUSY.value
            what = {FINALIST: ", finalists", CONFIRM: f", {'probing' if task.probe else 'confirming'} {task.call}"
                    }.get(task.round, "")
            w.status.problem = f"{wp.name} ({task.size}{what})"
            out.append((w, task))
        return out

    # -- events ------------------------------------------------------------------------------
    def on_started(self, w: WorkerHandle) -> None:
        assert w.task is not None
        w.task.on_device = True
        w.task.last_progress = self.clock()

    def on_batch(self, w: WorkerHandle, rows: Sequence[AutotuneResult]) -> None:
        assert w.task is not None
        w.task.last_progress = self.clock()
        w.task.reported.extend(rows)
        self._write(w, w.task, rows, by_worker=self.workers_write)

    def on_end(self, w: WorkerHandle, end: TaskEnd) -> None:
        """The worker's last item for the task; the stream ends after it (see on_stream_end)."""
        r = w.task
        assert r is not None
        r.last_progress = self.clock()
        w.status.phases = w.status.phases + end.phases
        if self.workers_write:
            self.sink.add_parts(end.parts)  # the worker set the ranks in its rows
        else:
            self.sink.set_ranks(r.where.session_id, end.ranks)
        if end.error:
            log.warning("farm: task %d on %s failed: %s", r.task.id, w.status.name, end.error)
        # a probe reports its participant only when it failed (its times are no stage's)
        if set(r.task.specs) - {x.spec for x in r.reported} and not (r.task.probe and not end.error):
            self._lose(w, LossKind.ERROR, end.error or "the worker reported no result")

    def on_stream_end(self, w: WorkerHandle) -> None:
        """The task's stream closed after its TaskEnd (a task on_end already settled is gone)."""
        if w.task is None:
            return
        self._release(w)
        task = w.task.task
        w.task = None
        self.sched.on_task_end(task)

    def on_lost(self, w: WorkerHandle, detail: str) -> None:
        """The worker died under the task: its unreported candidates are retried one per task."""
        r = w.task
        assert r is not None
        log.warning("farm: %s died running task %d (%s): retrying its %d unreported candidate(s)",
                    w.status.name, r.task.id, detail, r.task.size - len(r.reported))
        self._lose(w, LossKind.CRASH, f"worker {w.status.name} died: {detail}")

    def on_silent(self, now: float | None = None) -> list[WorkerHandle]:
        """Workers whose task said nothing for too long (the candidate timeout once the task runs, the
        startup timeout before). The driver records the loss; the caller kills each returned worker."""
        now = self.clock() if now is None else now
        silent = []
        for w in self.workers:
            r = w.task
            if r is None or w.unreachable is not None:  # a dead worker is not silent: it is judged elsewhere
                continue
            limit = self.options.candidate_timeout_s if r.on_device else self.options.startup_timeout_s
            if now - r.last_progress <= limit:
                continue
            log.warning("farm: %s sent nothing for %.0f s on task %d; restarting it", w.status.name,
                        now - r.last_progress, r.task.id)
            # a careful task holds one candidate: it hangs; a batch's silence names nobody yet (its candidates are
            # retried one per task at once: a hang would cost a whole timeout again in a batch)
            kind = LossKind.TIMEOUT if r.task.careful else LossKind.SILENT
            self._lose(w, kind, f"{w.status.name} silent for {self.options.candidate_timeout_s:.0f} s")
            silent.append(w)
        return silent

    def on_back(self, w: WorkerHandle) -> None:
        """A restarting worker answers again: it may take work. An unreachable one that answers was restarted on its
        node: its task's loss was a crash, charged now."""
        if w.lost:
            return
        if w.unreachable is not None:
            self._judge_crash(w)
        w.restarting = False
        w.status.state = WorkerState.IDLE.value

    def on_unreachable(self, w: WorkerHandle, detail: str) -> None:
        """The worker died while Ray still lists its node alive: its node may be going (Ray notices a dead node
        seconds after its workers' connections break). Its task waits, uncharged, until the worker answers again
        (restarted on its node: a crash, judged then), its node is listed dead (on_node_lost: nobody is charged), or
        ``node_grace_s`` passes (a crash)."""
        assert w.task is not None
        w.unreachable = (self.clock(), detail)
        w.status.state = WorkerState.UNREACHABLE.value

    def settle_unreachable(self) -> list[WorkerHandle]:
        """Unreachable workers past ``node_grace_s``: their tasks' losses count as crashes now."""
        now = self.clock()
        late = [w for w in self.workers if w.unreachable is not None and now - w.unreachable[0] >= self.options.node_grace_s]
        for w in late:
            self._judge_crash(w)
        return late

    def _judge_crash(self, w: WorkerHandle) -> None:
        assert w.unreachable is not None
        detail, w.unreachable = w.unreachable[1], None
        if w.task is not None:
            self.on_lost(w, detail)

    def add_worker(self, w: WorkerHandle) -> None:
        """A worker started on a node that joined: it takes work on the next assignment."""
        w.index = len(self.workers)
        self.workers.append(w)
        if w.info.signature not in self.signatures:
            self.signatures = sorted({*self.signatures, w.info.signature})
        self.nodes.add_worker(w.info.node_id, w.status.name, w.info.signature)
        if self.planner is not None:
            self.planner.add_worker(w)
        log.info("farm: %s joined on node %s (%s)", w.status.name, w.info.node_id[:8], w.info.signature)

    def on_node_lost(self, node_id: str, detail: str = "") -> list[WorkerHandle]:
        """The node is gone and its workers with it: each one's task runs again as it was (on another device of
        its signature), charging no candidate; the workers take no more work. -> the workers lost."""
        self.nodes.mark_lost(node_id, self.clock() - self.t0)
        gone = [w for w in self.workers if w.info.node_id == node_id and not w.lost]
        for w in gone:
            if w.task is not None:
                r = w.task
                log.warning("farm: node %s was lost (%s): %s's task %d runs again elsewhere (%d candidate(s) not "
                            "reported)", node_id[:8], detail or "gone", w.status.name, r.task.id,
                            r.task.size - len(r.reported))
                self._lose(w, LossKind.NODE_LOST, f"node {node_id[:8]} lost: {detail or 'gone'}")
            w.lost, w.restarting, w.unreachable = True, False, None
            w.status.state, w.status.problem = WorkerState.LOST.value, ""
        return gone

    def check_waits(self) -> list[str]:
        """Signatures with work left and no device up wait up to ``device_wait_s`` for a node of their kind
        (farm.fleet.on_ray.nodes.DeviceWaits); -> the signatures given up now."""
        return self.waits.check(
            self.clock(), self.signatures, lambda sig: any(w.info.signature == sig and not w.lost for w in self.workers),
            lambda sig: bool(self.sched.pending_tasks(sig)) or (self.planner is not None and self.planner.open_for(sig)),
            lambda sig: set(self.sched.abandon(sig)) | set(self.planner.abandon(sig) if self.planner else ()))

    # -- reporting -------------------------------------------------------------------------------
    def status(self, phase: str = "tuning") -> FarmStatus:
        failed = sum(v for k, v in self.counts.items() if k != "succeeded")
        now = self.clock()
        given_up = {s: [self.sched.problem_name(s, i) for i in ix] for s, ix in self.waits.given_up.items()}
        return FarmStatus(self.sched.total, self.sched.finished, self.sched.remeasured, failed, now - self.t0,
                          [w.status for w in self.workers], self.signatures, phase, self.nodes.with_workers(),
                          self.waits.left_s(now), given_up)

    # -- inside ----------------------------------------------------------------------------------
    def _write(self, w: WorkerHandle, r: RunningTask, rows: Sequence[AutotuneResult], *, by_worker: bool = False) -> None:
        wp = self.sched.problem_of(r.task)
        if by_worker:
            self.sink.count(rows)
        else:
            self.sink.write((x, wp, r.where) for x in rows)
        for x in rows:
            self.counts[x.disposition.value] = self.counts.get(x.disposition.value, 0) + 1
            self.sched.on_result(r.task, x, r.where.session_id)
            if self.options.keep_results and r.task.round == CONFIRM:
                self.confirmations.setdefault((r.task.signature, wp.name, r.task.call), []).append(x)
            elif self.options.keep_results:
                self.results.setdefault((r.task.signature, wp.name), []).append(x)
        w.status.candidates += len(rows)
        w.status.failures += sum(not x.succeeded for x in rows)
        node = self.nodes.records.get(w.info.node_id)
        if node is not None:
            node.rows += len(rows)
            node.failures += sum(not x.succeeded for x in rows)

    def _release(self, w: WorkerHandle) -> None:
        assert w.task is not None
        w.status.busy_s += self.clock() - w.task.started
        if w.status.state == WorkerState.BUSY.value:
            w.status.state, w.status.problem = WorkerState.IDLE.value, ""

    def _reported_on_storage(self, w: WorkerHandle, r: RunningTask) -> None:
        """A worker that went between writing a part and reporting it (shared storage): the rows it wrote in the
        task's session count as reported, so they are not measured (and written) twice."""
        found = written_unreported(self.sink, r.task, self.sched.problem_of(r.task).problem.op, r.where.session_id,
                                   r.reported)
        if found:
            log.info("farm: %d result(s) %s wrote but never reported are on the storage: counted", len(found),
                     w.status.name)
            r.reported.extend(found)
            self._write(w, r, found, by_worker=True)

    def _lose(self, w: WorkerHandle, kind: LossKind, detail: str) -> None:
        r = w.task
        assert r is not None
        if self.workers_write and kind is not LossKind.ERROR and not r.task.probe:
            self._reported_on_storage(w, r)
        if kind is not LossKind.ERROR:  # a dead or silent worker's task: its time bought nothing
            w.status.phases = w.status.phases + PhaseSplit.of({LOST: self.clock() - r.started})
        self._release(w)
        w.task = None
        if kind is not LossKind.ERROR and not set(r.task.specs) - {x.spec for x in r.reported} and not r.task.probe:
            self.sched.on_task_end(r.task)  # every row of it was written before the worker went: it is done
        else:
            if self.workers_write and kind is LossKind.NODE_LOST:
                # its worker may still write a part for a moment (or longer, cut off): set aside at the run's end
                self.sink.fence(r.task.signature, self.sched.problem_of(r.task).problem.op, r.where.session_id)
            # a task that never started on the device (the worker was still restarting) proves nothing; nor does one
            # whose node went: it runs again as it was
            effective = LossKind.NOT_STARTED if kind is LossKind.NODE_LOST or not r.on_device else kind
            rows = self.sched.on_task_lost(r.task, [x.spec for x in r.reported], effective.value, self.config, detail)
            if rows:
                self._write(w, r, rows)
        if kind not in (LossKind.ERROR, LossKind.NODE_LOST):
            w.restarting = True
            w.status.state = WorkerState.RESTARTING.value
            w.status.restarts += r.on_device


def finish_phases(workers: Sequence[WorkerHandle], window_s: float) -> PhaseSplit:
    """Every worker's split over the tuning window (idle: what its phases leave of it); -> the sum."""
    total = PhaseSplit()
    for w in workers:
        w.status.phases = w.status.phases.with_idle(window_s)
        total = total + w.status.phases
    return total
