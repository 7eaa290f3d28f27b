"""The Ray farm's event loop: start what the driver assigns, wait on the workers' result streams, the workers
starting and restarting, the discoveries under way, follow the nodes, and hand every event to the Ray-free driver
(farm.fleet.driver), which decides what it means."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from farm.errors import first_line
from farm.fleet.driver import Driver, FarmStatus, RunningTask, WorkerHandle, WorkerState, WorkerStatus
from farm.fleet.on_ray.launcher import FarmFailed, WorkerLauncher
from farm.fleet.options import FarmOptions
from farm.fleet.on_ray.calls import worker_gone
from farm.fleet.planner import Planner
from farm.fleet.on_ray.worker import PartSink, TaskEnd, TaskStarted, WorkerInfo
from farm.model.records import AutotuneConfig
from farm.model.workload import Workload

log = logging.getLogger("farm.fleet.on_ray.cluster")


class EventLoop:
    """One Ray run's events until the driver is done and no worker is starting."""

    def __init__(self, driver: Driver, launcher: WorkerLauncher, workload: Workload, config: AutotuneConfig,
                 options: FarmOptions, progress: Callable[[FarmStatus], None] | None, sink: PartSink | None = None
                 ) -> None:
        self.driver, self.launcher, self.workload, self.config = driver, launcher, workload, config
        self.options, self.progress, self.sink = options, progress, sink
        self.gone = worker_gone()
        self.streams: dict[Any, tuple[WorkerHandle, RunningTask]] = {}  # a task's result stream -> worker, task
        self.pings: dict[Any, WorkerHandle] = {}  # info() calls to restarting workers: work once one answers
        self.last_progress = self.last_poll = self.last_check = 0.0
        self.last_look = False  # the nodes were listed once more after the work ran out

    def run(self) -> None:
        driver = self.driver
        while not self._ended():
            now = time.perf_counter()
            if now - self.last_check >= 0.25:  # the fleet's state changes in seconds: not looked at every event
                self.last_check = now
                self._look_at_fleet(now)
            self._start_assigned()
            if driver.stuck:
                raise FarmFailed("internal error: work remains but nothing is queued or running")
            self._wait()
            self._tidy()
            now = time.perf_counter()
            if self.progress is not None and now - self.last_progress >= self.options.progress_interval_s:
                self.last_progress = now
                self.progress(driver.status())

    def _ended(self) -> bool:
        if self.driver.done and not self.launcher.starting:
            if not self.launcher.placed or self.last_look:
                return True
            # one more look before the end: a node that joined since the last poll still gets its kind's workload
            self.last_look, self.last_check, self.last_poll = True, 0.0, float("-inf")
        elif self.launcher.starting:
            self.last_look = False
        return False

    def _look_at_fleet(self, now: float) -> None:
        """Nodes lost and joined, workers late to start, unreachable workers settled, waits for lost kinds."""
        import ray

        driver, launcher, options = self.driver, self.launcher, self.options
        unreachable = any(w.unreachable for w in driver.workers)
        # while a worker is unreachable, whether its node is going is asked more often
        if launcher.placed and now - self.last_poll >= (0.25 if unreachable else options.node_poll_s):
            self.last_poll = now
            for node_id in launcher.poll(now - driver.t0):
                driver.on_node_lost(node_id, "the cluster lists it dead")
            launcher.fill(live=sum(not w.lost for w in driver.workers))
        for ref in launcher.late(options.startup_timeout_s):
            log.warning("farm: a worker on node %s did not start within %.0f s: given up",
                        launcher.starting[ref][1].node_id[:8], options.startup_timeout_s)
            ray.kill(launcher.take(ref)[0], no_restart=True)
        if unreachable:
            driver.settle_unreachable()
        driver.check_waits()

    def _start_assigned(self) -> None:
        driver, sink = self.driver, self.sink
        for w, task in driver.assignments():
            cands = sorted(driver.sched.candidates_of(task).values(), key=lambda c: c.index)
            gen = w.actor.run.options(num_returns="streaming").remote(
                task, driver.sched.problem_of(task), cands, self.config, self.workload.seed,
                self.options.stream_interval_s, sink, w.task.where if sink is not None else None)
            self.streams[gen] = (w, w.task)
        for w in driver.workers:
            if (w.restarting or w.unreachable) and w not in self.pings.values():
                self.pings[w.actor.info.remote()] = w

    def _wait(self) -> None:
        """One event (or 50 ms): a worker started, a restarting one answered, a stream's next item."""
        import ray

        driver, launcher = self.driver, self.launcher
        discovering = [ref for ref, _ in driver.planner.inflight.values()] if isinstance(driver.planner, Planner) else []
        ready, _ = ray.wait(list(self.streams) + list(self.pings) + discovering + list(launcher.starting),
                            num_returns=1, timeout=0.05)
        for ref in [x for x in ready if x in launcher.starting]:
            _started(driver, launcher, ref, self.gone)
        for ref in [x for x in ready if x in self.pings]:
            _answered(driver, launcher, self.pings.pop(ref), ref, self.gone)
        for gen in [x for x in ready if x in self.streams]:
            _next_item(driver, launcher, self.streams, gen, self.gone)

    def _tidy(self) -> None:
        """Silent workers restarted; streams of tasks the driver settled, and pings of lost workers, dropped."""
        import ray

        for w in self.driver.on_silent():
            ray.kill(w.actor, no_restart=False)
        for gen, (w, r) in list(self.streams.items()):
            if w.task is not r:  # the driver settled that task (lost it): its stream is not read again
                del self.streams[gen]
        for ref, w in list(self.pings.items()):
            if w.lost:
                del self.pings[ref]


def worker_handle(index: int, info: WorkerInfo, actor: Any) -> WorkerHandle:
    return WorkerHandle(index, info, actor, WorkerStatus(info.name, info.signature, info.properties.name, info.host,
                                                         WorkerState.IDLE.value, node_id=info.node_id))


def _started(driver: Driver, launcher: WorkerLauncher, ref: Any, gone: tuple[type, ...]) -> None:
    """A worker started on a node that joined answers (it takes work now), or failed to start."""
    import ray

    handle, slot = launcher.take(ref)
    try:
        info = ray.get(ref)
    except gone as exc:  # its node went before it was up
        log.warning("farm: a worker on node %s did not start: %s", slot.node_id[:8], first_line(exc))
        return
    except ray.exceptions.RayTaskError as exc:
        log.warning("farm: a worker on node %s failed to start: %s", slot.node_id[:8], first_line(exc))
        return
    if launcher.kind == "gpu" and any(w.info.host == info.host and w.info.properties.uuid == info.properties.uuid
                                      and not w.lost for w in driver.workers):
        # two raylets of one host that both claim a GPU (a misconfigured node): one worker measures it, not two
        log.error("farm: a worker on node %s got GPU %s of %s, which another worker measures already: stopped",
                  slot.node_id[:8], info.properties.uuid, info.host)
        ray.kill(handle, no_restart=True)
        return
    driver.add_worker(worker_handle(len(driver.workers), info, handle))


def _worker_lost(driver: Driver, launcher: WorkerLauncher, w: WorkerHandle, exc: BaseException) -> bool:
    """True when ``w`` died with its node (the driver was told): a worker pinned to a node that is gone cannot be
    placed again (ActorUnschedulableError), or the cluster lists its node dead."""
    import ray

    if not launcher.placed or not w.info.node_id:
        return False
    if isinstance(exc, ray.exceptions.ActorUnschedulableError) or not launcher.node_alive(w.info.node_id):
        driver.on_node_lost(w.info.node_id, first_line(exc))
        return True
    return False


def _answered(driver: Driver, launcher: WorkerLauncher, w: WorkerHandle, ref: Any, gone: tuple[type, ...]) -> None:
    import ray

    try:
        ray.get(ref)
        driver.on_back(w)  # restarted (on its node: an unreachable worker's loss was a crash)
    except gone as exc:
        _worker_lost(driver, launcher, w, exc)  # else still restarting: asked again on the next turn


def _next_item(driver: Driver, launcher: WorkerLauncher, streams: dict[Any, tuple[WorkerHandle, RunningTask]],
               gen: Any, gone: tuple[type, ...]) -> None:
    import ray

    w, r = streams[gen]
    if w.task is not r:
        del streams[gen]
        return
    try:
        item = ray.get(next(gen))
    except StopIteration:
        streams.pop(gen)
        driver.on_stream_end(w)
        return
    except gone as exc:
        streams.pop(gen)
        if _worker_lost(driver, launcher, w, exc):
            return
        if launcher.placed and w.info.node_id:
            driver.on_unreachable(w, first_line(exc))  # Ray may not list its node dead yet: judged later
        else:
            driver.on_lost(w, first_line(exc))
        return
    except ray.exceptions.RayTaskError as exc:  # the worker's own code raised: writing its results, mostly
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        raise FarmFailed(f"{w.status.name} failed: {type(cause).__name__}: {first_line(cause)}") from None
    if isinstance(item, TaskStarted):
        driver.on_started(w)
    elif isinstance(item, TaskEnd):
        driver.on_end(w, item)
    else:
        driver.on_batch(w, item)
