"""The in-process executor's event loop: the Ray farm's driver and scheduler (farm.fleet.driver), with one worker
in this process. Each task the driver assigns runs on that worker (farm.fleet.on_ray.worker.DeviceWorkerImpl, the code a
Ray actor runs) and every item of its stream goes to the driver as the Ray event loop (farm.fleet.on_ray.event_loop)
hands them over: the same rounds, stages, rows and ranks on both executors. What the Ray loop does beyond this
(workers starting, dying, going silent, nodes coming and going) has no in-process counterpart: a hang here is
the hang watch's (farm.fleet.local_run), a native crash the journal's."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from farm.fleet.driver import Driver, WorkerHandle
from farm.fleet.on_ray.launcher import FarmFailed
from farm.fleet.planner import Planner
from farm.fleet.tasks import CONFIRM, Task
from farm.fleet.on_ray.worker import DeviceWorkerImpl, TaskEnd, TaskStarted
from farm.model.records import AutotuneConfig, AutotuneResult
from farm.model.workload import Workload
from farm.model.plans import candidate_key
from farm.tuner.judging.confirm import ConfirmRun
from farm.tuner.problem_tuning import ProblemOutcome


class LocalLoop:
    """One in-process run's tasks, one after another on its worker, until the driver is done. ``current`` names
    the task running (its problem, where its rows go, its candidates' indices) for the hang watch;
    ``flush`` puts the rows written so far on disk (before a stage); ``on_problem`` gets each problem's outcome once it is settled."""

    def __init__(self, driver: Driver, planner: Planner, worker: DeviceWorkerImpl, workload: Workload,
                 config: AutotuneConfig, current: dict[str, Any], flush: Callable[[], None],
                 on_problem: Callable[[ProblemOutcome], None] | None = None) -> None:
        self.driver, self.planner, self.worker, self.workload, self.config = driver, planner, worker, workload, config
        self.current, self.flush, self.on_problem = current, flush, on_problem
        self.ranks: dict[tuple[str, int], dict[str, int]] = {}  # a problem's rows' ranks in their sessions
        self.wall_ms: dict[tuple[str, int], float] = {}
        self.outcomes: dict[tuple[str, int], ProblemOutcome] = {}

    def run(self) -> list[ProblemOutcome]:
        """Every task run; -> each problem's outcome, in the workload's order."""
        driver = self.driver
        while not driver.done:
            assigned = driver.assignments()  # discovers the next window of problems as the queue runs short
            if not assigned and driver.stuck:
                raise FarmFailed("internal error: work remains but nothing is queued or running")
            for w, task in assigned:
                self._run(w, task)
                self._report_settled()
            self._report_settled()
        return [self.outcomes[k] for k in sorted(self.outcomes, key=lambda k: k[1])]

    def _run(self, w: WorkerHandle, task: Task) -> None:
        driver = self.driver
        assert w.task is not None
        wp = driver.sched.problem_of(task)
        cands = sorted(driver.sched.candidates_of(task).values(), key=lambda c: c.index)
        self.current.update(wp=wp, where=w.task.where, index={c.spec: c.index for c in cands})
        if task.round == CONFIRM:
            # a native crash in a stage ends this process: its participants' main-round rows are on disk first, so
            # the next run quarantines the culprit (the journal) instead of measuring them again and losing the
            # stage's failure to newer main-round rows
            self.flush()
        t0 = time.perf_counter()
        for item in self.worker.run(task, wp, cands, self.config, self.workload.seed,
                                    driver.options.stream_interval_s):
            if isinstance(item, TaskStarted):
                driver.on_started(w)
            elif isinstance(item, TaskEnd):
                self.ranks.setdefault((task.signature, task.problem), {}).update(item.ranks)
                driver.on_end(w, item)
            else:
                driver.on_batch(w, item)
        driver.on_stream_end(w)
        if w.restarting:  # nothing restarts in-process: the worker is the same, and takes the next task
            driver.on_back(w)
        key = (task.signature, task.problem)
        self.wall_ms[key] = self.wall_ms.get(key, 0.0) + (time.perf_counter() - t0) * 1e3

    def _report_settled(self) -> None:
        """Each problem discovered whose rounds all ran (or that has no candidates) gets its outcome, once."""
        for key in self.planner.discovered:
            if key in self.outcomes:
                continue
            sig, index = key
            wp = self.workload.problems[index]
            why = self.planner.skipped.get(sig, {}).get(wp.name)
            if why is None and not self.driver.sched.settled(sig, index):
                continue
            self.outcomes[key] = ProblemOutcome(wp, (), why) if why is not None else self._outcome(sig, index)
            if self.on_problem is not None:
                self.on_problem(self.outcomes[key])

    def _outcome(self, sig: str, index: int) -> ProblemOutcome:
        """The problem's rows of this run (a finalist's row in place of its main-round one) ranked in their
        sessions, and its confirmation stages."""
        driver, wp = self.driver, self.workload.problems[index]
        latest: dict[Any, AutotuneResult] = {}
        for r in driver.results.get((sig, wp.name), []):
            latest[r.spec] = r
        ranks = self.ranks.get((sig, index), {})
        rows = [dataclasses.replace(r, rank=ranks.get(candidate_key(r.engine_id, r.knobs), -1)) if r.succeeded
                else r for r in latest.values()]
        ok = sorted((r for r in rows if r.succeeded), key=lambda r: (r.rank < 0, r.rank, r.median_ms or 0.0))
        stages = tuple(ConfirmRun.of(c.value, driver.confirmations[(sig, wp.name, c.value)]) for c in wp.calls
                       if (sig, wp.name, c.value) in driver.confirmations)
        planned, before = driver.sched.planned(sig, index)
        return ProblemOutcome(wp, tuple(ok + [r for r in rows if not r.succeeded]), "",
                              self.wall_ms.get((sig, index), 0.0), before, stages,
                              self.planner.found.get((sig, index), planned) - planned)
