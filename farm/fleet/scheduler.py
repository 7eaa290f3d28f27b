"""The farm's work bookkeeping: tasks per device signature, shards, finalist rounds, faults.

Pure Python (no Ray), so it can be tested alone. For every (signature, problem):

* the candidates not measured yet become one task, or several of at most
  ``shard_size`` candidates when there are more;
* devices of the signature pull tasks as they free up (finalists first, then
  retries, then the rest in workload order, except that a device passes over
  problems of a kernel family another device is running now: see ``kernel_family``);
* when every candidate has a row, the confirmation stage (farm.tuner.judging.confirm) re-measures the leader,
  its near rivals, the default and the incumbent together on one device, in paired rounds: one
  ``confirm`` task per calling mode of the problem (a resumed job runs again a stage cut short, one that
  ended undecided with ``--reconfirm``, and every stage again when it measured new candidates). With the stage off, a problem whose successful
  candidates were measured in more than one session (shards, a resumed job, retries after a crash)
  has a ``finalist`` task instead: the top ``finalist_k`` of every session, its fastest stable
  candidate and the default measured again together;
* a task whose worker dies (a crash, a kill) goes on from what it reported: its
  unreported candidates run again as one task, which keeps the compile pipeline
  and pays the problem's setup once. If that task loses its worker too, or a
  task stops reporting (a hang), or fails, the rest is retried one candidate
  per task ("careful" mode), so the next failure names its candidate exactly.
  A candidate that kills a careful task's worker ``max_strikes`` times is
  quarantined with a ``crashed`` row; one that hangs a careful task gets a
  ``timed_out`` row at once.
"""

from __future__ import annotations

import collections
import itertools
import logging
from typing import Any, Iterable, Sequence

from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, AutotuneResult, ConfirmSettings
from farm.model.workload import WorkloadProblem
from farm.fleet.problem_rounds import ConfirmStages, ProblemState, failure_row, finalists
from farm.fleet.tasks import (CONFIRM, FINALIST, MAIN, Candidate, PriorRow, Task, confirmed_calls, failed_in_stage,
                              kernel_family)

log = logging.getLogger("farm.fleet.scheduler")

__all__ = ["Scheduler"]

def _take_first(tasks: collections.deque[Task] | None, problems: Any) -> Task | None:
    """Remove and return the first of ``tasks`` whose (signature, problem) is in ``problems``; None if none is."""
    pick = next((i for i, t in enumerate(tasks or ()) if (t.signature, t.problem) in problems), None)
    if pick is None or tasks is None:
        return None
    task = tasks[pick]
    del tasks[pick]
    return task


class Scheduler:
    def __init__(self, *, shard_size: int = 128, finalist_k: int = 3, max_strikes: int = 2,
                 confirm: ConfirmSettings | None = None) -> None:
        if shard_size < 1 or finalist_k < 1 or max_strikes < 1:
            raise ValueError("shard_size, finalist_k and max_strikes must be >= 1")
        self.shard_size = shard_size
        self.finalist_k = finalist_k
        self.max_strikes = max_strikes
        self.confirm = confirm if confirm is not None else ConfirmSettings(enabled=False)
        self._ids = itertools.count(1)
        self._queues: dict[str, collections.deque[Task]] = {}
        self._urgent: dict[str, collections.deque[Task]] = {}
        self._problems: dict[tuple[str, int], ProblemState] = {}
        # task id: (device, kernel family, (signature, problem))
        self._running: dict[int, tuple[object, tuple[str, ...], tuple[str, int]]] = {}
        self._set_up: dict[object, set[tuple[str, int]]] = {}  # device: the (signature, problem)s it has run
        self.total = 0  # candidates to measure in the main round
        self.finished = 0  # of those, with a final row
        self.remeasured = 0  # finalist measurements
        self.stages = ConfirmStages(self.confirm, self._push, self._maybe_finalist)

    # -- building ------------------------------------------------------------------------
    def add_problem(self, signature: str, index: int, wp: WorkloadProblem, candidates: Sequence[Candidate],
                    prior: Iterable[PriorRow] = (), incumbent: PlanSpec | None = None) -> None:
        """Plan one problem on one signature; ``prior`` are its rows from earlier runs, ``incumbent`` the
        candidate the incumbent override file names for it."""
        self._queues.setdefault(signature, collections.deque())
        self._urgent.setdefault(signature, collections.deque())
        by_spec = {c.spec: c for c in candidates}
        state = ProblemState(wp, by_spec, set(by_spec), incumbent=incumbent if incumbent in by_spec else None)
        prior = list(prior)
        if self.confirm.enabled:
            state.calls = tuple(c.value for c in wp.calls)
            state.confirmed = confirmed_calls([r for r in prior if r.spec in by_spec], self.confirm.redo_undecided)
        final_rounds: dict[str, set[PlanSpec]] = {}  # session -> finalists it measured
        dropped = failed_in_stage(r for r in prior if r.spec in by_spec)
        for row in prior:
            if row.spec not in by_spec or row.pruned:
                continue  # measured under another workload; or never measured (a pruned tune's row)
            if row.round == CONFIRM:
                continue
            if row.round == FINALIST:
                final_rounds.setdefault(row.session, set()).add(row.spec)
                continue
            state.pending.discard(row.spec)
            if row.succeeded and row.median_ms is not None and row.spec not in dropped:
                state.successes[row.spec] = (row.session, row.median_ms, row.mad_ms or 0.0)
        wanted = set(finalists(state, self.finalist_k) or ())
        if not state.pending and any(wanted <= done for done in final_rounds.values()):
            # a complete finalist round of these main-round rows exists; a partial one (a driver
            # killed during the round) or one from before more candidates were measured is run again
            state.finalist = "done"
        self._problems[(signature, index)] = state
        todo = [c.spec for c in sorted(candidates, key=lambda c: c.index) if c.spec in state.pending]
        self.total += len(todo)
        state.planned, state.measured_before = len(by_spec), len(by_spec) - len(todo)
        for i in range(0, len(todo), self.shard_size):
            self._push(signature, index, tuple(todo[i:i + self.shard_size]))
        if not todo:
            self._maybe_finalist(signature, index)

    def _push(self, signature: str, index: int, specs: tuple[PlanSpec, ...], *, round: str = MAIN,
              careful: bool = False, urgent: bool = False, **confirm: Any) -> Task:
        task = Task(next(self._ids), signature, index, specs, round, careful, **confirm)
        (self._urgent if urgent else self._queues)[signature].append(task)
        self._problems[(signature, index)].outstanding += 1
        return task

    # -- pulling ---------------------------------------------------------------------------
    def next_task(self, signature: str, device: object = None) -> Task | None:
        """The next task for a free ``device`` of ``signature``. First a task of a problem this device set up
        already (an urgent one: a stage, a retry; then a sibling shard); then the first urgent task; then a
        main task of a problem no other device is running, of a kernel family no other device is running;
        else one of a problem no other device is running; else the first; of those, the one with the most work
        (candidates x the problem's operations). A device that set a problem
        up (its inputs, its library plans, its kernels loaded) measures the rest of it without paying that
        again, and two devices do not both pay one problem's setup while other problems wait."""
        urgent, queue = self._urgent.get(signature), self._queues.get(signature)
        mine = self._set_up.get(device, ()) if device is not None else ()
        task = _take_first(urgent, mine) or _take_first(queue, mine)  # this device's own problems first
        if task is None and urgent:
            task = urgent.popleft()
        elif task is None and queue and device is None:  # no device to place: plain order
            task = queue.popleft()
        elif task is None and queue:
            others = [(fam, prob) for dev, fam, prob in self._running.values() if dev != device]
            families, problems = {f for f, _ in others}, {p for _, p in others}
            free = [i for i, t in enumerate(queue) if (t.signature, t.problem) not in problems]
            apart = [i for i in free if self._family(queue[i]) not in families]
            # the largest first (of what discovery has queued): small problems fill the end, so devices
            # finish together instead of one device running the biggest problem alone at the end
            pick = max(apart or free or [0], key=lambda i: (self._cost(queue[i]), -i))
            task = queue[pick]
            del queue[pick]
        if task is None:
            return None
        if device is not None:
            self._running[task.id] = (device, self._family(task), (task.signature, task.problem))
            self._set_up.setdefault(device, set()).add((task.signature, task.problem))
        return task

    def _family(self, task: Task) -> tuple[str, ...]:
        return kernel_family(self.problem_of(task))

    def _cost(self, task: Task) -> float:
        """A task's expected device time, relatively: its candidates times its problem's work."""
        p = self.problem_of(task).problem
        return task.size * (p.flops or float(sum(t.nbytes for t in p.tensors)))

    def pending_tasks(self, signature: str | None = None) -> int:
        sigs = [signature] if signature else list(self._queues)
        return sum(len(self._queues.get(s, ())) + len(self._urgent.get(s, ())) for s in sigs)

    @property
    def done(self) -> bool:
        return all(p.outstanding == 0 for p in self._problems.values())

    def problem_name(self, signature: str, index: int) -> str:
        state = self._problems.get((signature, index))
        return state.wp.name if state is not None else f"#{index}"

    def abandon(self, signature: str) -> list[int]:
        """No device of ``signature`` is left: its queued work is dropped (none of it runs); -> the problems (workload
        indices) it leaves undecided, to be measured by a resume."""
        for queue in (self._queues.get(signature), self._urgent.get(signature)):
            if queue is not None:
                queue.clear()
        left = []
        for (sig, index), state in self._problems.items():
            if sig == signature and state.outstanding:
                state.outstanding = 0
                state.probes.clear()
                left.append(index)
        return left

    def settled(self, signature: str, index: int) -> bool:
        """Every round of the problem ran (its main round, finalists or confirmation stages): nothing more comes."""
        state = self._problems.get((signature, index))
        return state is not None and not state.outstanding and not state.pending

    def planned(self, signature: str, index: int) -> tuple[int, int]:
        """The problem's candidates given, and of those the ones an earlier run measured (not measured again)."""
        state = self._problems.get((signature, index))
        return (state.planned, state.measured_before) if state is not None else (0, 0)

    def problem_of(self, task: Task) -> WorkloadProblem:
        return self._problems[(task.signature, task.problem)].wp

    def candidates_of(self, task: Task) -> dict[PlanSpec, Candidate]:
        return self._problems[(task.signature, task.problem)].candidates

    # -- reporting -----------------------------------------------------------------------
    def on_result(self, task: Task, result: AutotuneResult, session: str) -> None:
        """A candidate's row arrived."""
        state = self._problems[(task.signature, task.problem)]
        if task.round in (FINALIST, CONFIRM):
            self.remeasured += 1
            probing = state.probes.get(task.call) if task.probe else None
            if probing is not None and not result.succeeded:
                probing.culprits.add(result.spec)
                state.successes.pop(result.spec, None)
            return
        state.measured_now = True
        if result.spec in state.pending:
            state.pending.discard(result.spec)
            self.finished += 1
        if result.succeeded and result.median_ms is not None:
            state.successes[result.spec] = (session, result.median_ms, result.mad_ms or 0.0)

    def on_task_end(self, task: Task) -> None:
        """The task finished (every candidate reported)."""
        self._running.pop(task.id, None)
        self._problems[(task.signature, task.problem)].outstanding -= 1
        self._settle(task)

    def on_task_lost(self, task: Task, reported: Iterable[PlanSpec], kind: str,
                     config: AutotuneConfig, detail: str = "") -> list[AutotuneResult]:
        """The task's worker died (``kind`` "crash"), stopped reporting ("timeout"), failed the task
        ("error"), or went away before the task started ("not_started", which charges nobody).

        Returns the rows to write for candidates this failure settles.
        """
        self._running.pop(task.id, None)
        state = self._problems[(task.signature, task.problem)]
        state.outstanding -= 1
        seen = set(reported)
        left = [s for s in task.specs if s not in seen]
        rows: list[AutotuneResult] = []
        if task.round == CONFIRM:
            return self.stages.lost(task, state, kind, config, detail)
        if kind == "not_started":
            if left:  # queued again as it was
                self._push(task.signature, task.problem, tuple(left), round=task.round, careful=task.careful,
                           urgent=True)
            else:
                self._settle(task)
            return rows
        if kind == "crash" and not task.careful and task.attempt == 1 and task.round == MAIN and left:
            # one death names nobody (a kill, an OOM, a lost node as often as a bad kernel): the rest goes on
            # as one task; a second death on it is when candidates are isolated
            self._push(task.signature, task.problem, tuple(left), urgent=True, attempt=2)
            return rows
        if task.careful and left:
            culprit, left = left[0], left[1:]
            state.strikes[culprit] += 1
            if kind == "timeout" or state.strikes[culprit] >= self.max_strikes:
                rows.append(failure_row(state, culprit, kind, config, detail))
                if task.round == MAIN and culprit in state.pending:
                    state.pending.discard(culprit)
                    self.finished += 1
            else:
                left.insert(0, culprit)
        for spec in left:  # retried one per task, so the next failure names its candidate
            self._push(task.signature, task.problem, (spec,), round=task.round, careful=True, urgent=True)
        if not left:
            self._settle(task)
        return rows

    def _settle(self, task: Task) -> None:
        state = self._problems[(task.signature, task.problem)]
        if task.round == FINALIST and state.outstanding == 0:
            state.finalist = "done"
        if task.probe:
            self.stages.probe_done(task, state, None)
            return
        if task.round == CONFIRM:
            state.confirmed.add(task.call)
        self._maybe_finalist(task.signature, task.problem)

    def _maybe_finalist(self, signature: str, index: int) -> None:
        """The next round of a problem whose candidates all have rows: its confirmation stage (or, with the
        stage off, a finalist round), then retirement."""
        state = self._problems[(signature, index)]
        if state.pending or state.outstanding:
            return
        if state.calls:
            if self.stages.queue(signature, index, state):
                return
            self._retire(state, (signature, index))
            return
        if state.finalist == "none":
            order = finalists(state, self.finalist_k)
            if order is not None:
                state.finalist = "queued"
                self._push(signature, index, order, round=FINALIST, urgent=True)
                return
        if state.finalist != "queued":
            self._retire(state, (signature, index))

    def _retire(self, state: ProblemState, where: tuple[str, int]) -> None:
        """A settled problem keeps only what ``done`` reads: its per-candidate state goes, and no device holds it as
        set up (the driver's memory follows the problems in flight, not every candidate ever measured)."""
        for problems in self._set_up.values():
            problems.discard(where)
        state.candidates, state.successes = {}, {}
        state.strikes.clear()
