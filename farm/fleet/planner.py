"""Discovery in windows, for both executors: each signature's next problems are expanded on one of its workers
when its queue runs short, and the candidates found go to the scheduler (with the rows of earlier runs, the
incumbents, and what the cost model prunes). The driver (farm.fleet.driver) asks it to top up between events; the
workers are reached through the executor's seam (farm.fleet.executor.WorkerCalls)."""

from __future__ import annotations

from typing import Any, Sequence

from farm.fleet.driver import WorkerHandle
from farm.fleet.executor import WorkerCalls
from farm.fleet.job import JobRun, prior_rows
from farm.fleet.plan_pruning import PlanPruning
from farm.fleet.tasks import PriorRow
from farm.fleet.scheduler import Scheduler
from farm.model.workload import Workload, WorkloadProblem
from farm.store.dataset import ResultsDataset
from farm.store.deciding.incumbents import incumbent_file, incumbent_spec


class Planner:
    """Discovery in windows: each signature's next problems are expanded (on one of its workers) when its
    queue runs short, so the driver holds the candidates of the problems in flight, not of the whole workload.
    ``skipped``: signature -> problem name -> why it has no candidates; ``found``: (signature, workload index) ->
    the candidates discovery found, before a cost model's pruning; ``discovered``: (signature, workload index) in
    the order discovered."""

    def __init__(self, workload: Workload, jr: JobRun, sched: Scheduler, workers: Sequence[WorkerHandle],
                 calls: WorkerCalls, incumbents: str | None = None, pruning: PlanPruning | None = None) -> None:
        self.jr, self.sched, self.calls, self.pruning = jr, sched, calls, pruning
        self.props = {w.info.signature: w.info.properties for w in workers}
        # the incumbents' override file per signature: its winners join the confirmation stage
        self.incumbents_source = incumbents
        self.incumbents = {w.info.signature: incumbent_file(incumbents, w.info.properties) for w in workers}
        self.problems = list(enumerate(workload.problems))
        self.by_sig: dict[str, list[WorkerHandle]] = {}
        for w in workers:
            self.by_sig.setdefault(w.info.signature, []).append(w)
        self.next = {sig: 0 for sig in self.by_sig}
        # a part the reducer cannot read whole is not counted as measured (its candidates are measured again)
        self.dataset = ResultsDataset(jr.job.results).check_pages() if jr.job.results.exists() else None
        self._prior: dict[str, dict[str, list[PriorRow]]] = {}
        self.inflight: dict[str, tuple[Any, list[tuple[int, WorkloadProblem]]]] = {}  # sig -> (expand ref, chunk)
        self.again: dict[str, list[tuple[int, WorkloadProblem]]] = {}  # sig -> a window whose worker died under it
        self.skipped: dict[str, dict[str, str]] = {}
        self.found: dict[tuple[str, int], int] = {}
        self.discovered: list[tuple[str, int]] = []
        for sig in self.by_sig:
            jr.tuning(sig)

    @property
    def open(self) -> bool:
        """Problems are left to discover on some signature (or a discovery is under way)."""
        return any(self.open_for(sig) for sig in self.next)

    def open_for(self, sig: str) -> bool:
        return sig in self.inflight or sig in self.again or self.next.get(sig, 0) < len(self.problems)

    def add_worker(self, w: WorkerHandle) -> None:
        """A worker joined; a new signature gets the whole workload."""
        sig = w.info.signature
        if sig not in self.by_sig:
            self.props[sig] = w.info.properties
            self.incumbents[sig] = incumbent_file(self.incumbents_source, w.info.properties)
            self.next[sig] = 0
            self.jr.tuning(sig)
        self.by_sig.setdefault(sig, []).append(w)

    def abandon(self, sig: str) -> list[int]:
        """No device of ``sig`` is left: -> the problems (workload indices) it never discovered; none will be."""
        left = [i for i, _ in self.problems[self.next.get(sig, 0):]]
        left += [i for i, _ in self.again.pop(sig, [])]
        left += [i for i, _ in self.inflight.pop(sig, (None, []))[1]]
        self.next[sig] = len(self.problems)
        return left

    def top_up(self) -> None:
        """Take in finished discoveries; start the next window where a signature has fewer queued tasks than
        four per device (the queue keeps a choice of kernel families: farm.fleet.tasks.kernel_family).
        On Ray, discovery runs on a worker while the devices work: nothing here waits for it."""
        for sig, members in self.by_sig.items():
            self._collect(sig)
            if sig in self.inflight:
                continue
            # an idle worker answers at once (an actor runs one call at a time); else one that is up
            worker = next((w for w in members if w.free), next((w for w in members if w.up), None))
            if worker is None:
                continue  # every worker of the signature is restarting: discovery waits for one
            chunk = self.again.pop(sig, None) or self._next_window(sig, len(members))
            if chunk is not None:
                self.inflight[sig] = (self.calls.expand(worker, chunk), chunk)
                self._collect(sig)  # in-process, the answer is there already

    def _collect(self, sig: str) -> None:
        """The signature's discovery under way, taken in if it has answered."""
        if sig not in self.inflight or not self.calls.ready(self.inflight[sig][0]):
            return
        pending, chunk = self.inflight.pop(sig)
        try:
            expanded = self.calls.result(pending)
        except self.calls.gone:
            # its worker died (a killed worker takes the discovery queued behind its task with it): the window is
            # asked again of a worker that is up, once one is
            self.again[sig] = chunk
            return
        self.found.update({(sig, i): len(c) for i, c in expanded.items() if not isinstance(c, str)})
        self._take(sig, chunk, expanded)
        self.discovered += [(sig, i) for i, _ in chunk]

    def _next_window(self, sig: str, devices: int) -> list[tuple[int, WorkloadProblem]] | None:
        """The signature's next problems to discover, when its queue holds fewer than four tasks a device (the queue
        keeps a choice of kernel families); eight a device at a time. None: not now, or none left."""
        start = self.next[sig]
        if start >= len(self.problems) or self.sched.pending_tasks(sig) >= 4 * devices:
            return None
        chunk = self.problems[start:start + 8 * devices]
        self.next[sig] = start + len(chunk)
        return chunk

    def _take(self, sig: str, chunk: Sequence[tuple[int, WorkloadProblem]], expanded: dict[int, Any]) -> None:
        if sig not in self._prior:
            self._prior[sig] = prior_rows(self.dataset, sig)
        skipped = schedule_problems(chunk, {sig: expanded}, self.sched, prior={sig: self._prior[sig]},
                            incumbents=self.incumbents, pruning=self.pruning, props=self.props)
        for name, why in skipped.get(sig, {}).items():
            self.skipped.setdefault(sig, {})[name] = why
            self.jr.skip(sig, name, why)


def schedule_problems(problems: Sequence[tuple[int, WorkloadProblem]], plans: dict[str, dict[int, Any]], sched: Scheduler,
              dataset: ResultsDataset | None = None, *,
              prior: dict[str, dict[str, list[PriorRow]]] | None = None,
              incumbents: dict[str, Any] | None = None, pruning: PlanPruning | None = None,
              props: dict[str, Any] | None = None) -> dict[str, dict[str, str]]:
    """Give the scheduler every problem discovery found candidates for (with its rows from earlier runs,
    ``prior`` per signature or read from ``dataset``; only those ``pruning`` keeps, the device's properties
    being ``props[signature]``); -> signature -> problem name -> why it has none."""
    skipped: dict[str, dict[str, str]] = {}
    for sig, expanded in plans.items():
        rows = prior[sig] if prior is not None else prior_rows(dataset, sig)
        for index, wp in problems:
            cands = expanded[index]
            if isinstance(cands, str):
                skipped.setdefault(sig, {})[wp.name] = cands
            else:
                before = rows.get(wp.problem.key, ())
                current = (incumbents or {}).get(sig)
                incumbent = incumbent_spec(current, wp.problem)
                if pruning is not None and props is not None:
                    cands = pruning.apply(props[sig], wp, cands, before, incumbent,
                                          decided=pruning.check_decided and pruning.decides(current, wp.problem))
                sched.add_problem(sig, index, wp, cands, before, incumbent)
    return skipped


def record_plan(jr: JobRun, plans: dict[str, Any], skipped: dict[str, dict[str, str]]) -> None:
    """The job record learns the signatures tuned and the problems they cannot tune."""
    for sig in plans:
        jr.tuning(sig)
        for name, why in skipped.get(sig, {}).items():
            jr.skip(sig, name, why)
