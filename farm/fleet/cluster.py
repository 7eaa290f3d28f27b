"""The Ray farm: one device worker (actor) per GPU, dynamic fan-out, faults, results as they arrive.

    report = run_farm(workload, "runs/x")                  # embedded local Ray, GPUs or the CPU
    report = run_farm(workload, "runs/x", address="auto")  # an existing cluster (ray job submit)

This module is the Ray shell: it starts the workers (farm.fleet.launcher, on the nodes that have devices and on
those that join), runs discovery, starts the tasks the driver assigns and passes every event of the workers'
streams and of the cluster's nodes to the Ray-free driver (farm.fleet.driver), which schedules
(farm.fleet.scheduler), writes rows as they arrive and decides what a crash, a silence or a lost node means.
The job folder's lifecycle is farm.fleet.job.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from farm.errors import FarmError
from farm.fleet.driver import Driver, FarmStatus, RunningTask, WorkerHandle, WorkerState, WorkerStatus
from farm.fleet.job import JobRun, JobSummary, prior_rows
from farm.fleet.launcher import FarmFailed, WorkerLauncher
from farm.fleet.options import DeviceRequest, FarmOptions
from farm.fleet.pruning import PlanPruning
from farm.fleet.reaper import Reaper
from farm.fleet.scheduler import PriorRow, Scheduler
from farm.fleet.worker import PartSink, TaskEnd, TaskStarted, WorkerInfo
from farm.model.records import AutotuneConfig, AutotuneResult
from farm.model.workload import Workload, WorkloadProblem
from farm.store.dataset import ResultsDataset
from farm.store.deciding import incumbent_file, incumbent_spec
from farm.store.reduce import ReduceReport
from farm.tuner.phases import PhaseSplit

log = logging.getLogger("farm.fleet.cluster")
REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["DeviceRequest", "FarmFailed", "FarmOptions", "FarmReport", "FarmStatus", "WorkerStatus", "run_farm"]


@dataclass
class FarmReport:
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
    handles: list[Any] = field(default_factory=list, repr=False)  # the workers' Ray handles, as ``workers``

    @property
    def rows_written(self) -> int:
        return self.summary.rows_written if self.summary else 0


def run_farm(
    workload: Workload,
    out: str | Path,
    *,
    devices: DeviceRequest | str = "auto",
    address: str | None = None,
    options: FarmOptions | None = None,
    config: AutotuneConfig | None = None,
    progress: Callable[[FarmStatus], None] | None = None,
    job_id: str | None = None,
) -> FarmReport:
    """Tune ``workload`` on every device of the cluster (or a local one) into ``out``."""
    import ray

    options = options or FarmOptions()
    request = DeviceRequest.parse(devices) if isinstance(devices, str) else devices
    # a candidate measured past its budget ends there, as in-process (farm.fleet.local_run.run_local): the same bound
    # on both executors, so a workload asking for a billion iterations gets a result, not a worker killed as hung
    config = (config or workload.autotune).bounded_by(options.candidate_timeout_s)
    # a model file is read (and refused) before the job folder or Ray is touched
    pruner = PlanPruning(config.prune, config, lambda rows: None) if config.prune is not None else None
    jr = JobRun(out, workload, {"executor": "ray", "devices": request.kind, "shard_size": options.shard_size,
                                "finalist_k": options.finalist_k, "candidate_timeout_s": options.candidate_timeout_s,
                                "address": address or "local", "incumbents": options.incumbents,
                                "prune": pruner.pruner.record() if pruner else None}, job_id)
    if pruner is not None:
        pruner.write = jr.write
    jr.measurement_warning = oversubscribed_cpu(request, address)
    started_ray = False
    reaper: Reaper | None = None
    handles: list[Any] = []
    verify: Callable[[str, str, list[str]], Any] | None = None
    try:
        if options.cpu_threads is None and address is None:
            from farm.devices.runtimes.cpu import blas_threads_in_force

            # the embedded instance runs on this host: production here runs with this process's threads
            options = dataclasses.replace(options, cpu_threads=blas_threads_in_force())
        finished = _finished_here(workload, jr, request, options, config, pruner) \
            if address is None and not ray.is_initialized() else None
        if finished is not None:
            report = finished
            verify = _local_verify(request, options)
        else:
            if progress is not None:
                progress(FarmStatus(0, 0, 0, 0, 0.0, [], [], phase="starting"))
            if not ray.is_initialized():
                if address is None:  # an embedded instance: stopped whole even if this process is killed
                    reaper = Reaper()
                _init_ray(address, request)
                started_ray = True
            launcher = WorkerLauncher(request, options, workload.problems)
            handles = launcher.handles
            report = _drive(workload, jr, launcher, options, config, progress, pruner)
            for sig, names in report.waiting.items():
                jr.wait_for_devices(sig, names)
            if options.verifier is not None:
                if progress is not None:
                    progress(FarmStatus(report.total, report.total, report.remeasured, 0, report.tuning_s,
                                        report.statuses, [], phase="verifying"))
                verify = _worker_verify(report.handles, report.workers, options.verifier)
        # the workers are still up: the reduce's decisions are replayed on them before they stop
        report.summary = jr.finish(
            reduce=options.reduce, top_k=options.top_k, verify=verify,
            devices=[{"name": w.name, "host": w.host, "node_id": w.node_id, "gpu_ids": list(w.gpu_ids),
                      "signature": w.signature, "niceness": w.niceness, "properties": w.properties.to_dict()}
                     for w in report.workers],
            **({"nodes": report.nodes} if report.nodes else {}),
            workers=[s.to_json() for s in report.statuses], skipped_problems=report.problems_skipped,
            phases={"tuning_s": round(report.tuning_s, 3), "devices": len(report.statuses),
                    "total": report.phases.to_json()},
            **({"pruning": pruner.pruner.tally.to_json()} if pruner else {}))
    except BaseException as exc:
        jr.fail(exc)
        raise
    finally:
        _stop_workers(handles)
        if started_ray:
            ray.shutdown()
        if reaper is not None:
            reaper.done()
    report.pruning = pruner.record() if pruner else None
    report.reduce = report.summary.reduce
    report.wall_s = report.summary.wall_s
    return report


def _worker_verify(handles: Sequence[Any], infos: Sequence[WorkerInfo],
                   verifier: Callable[..., Any]) -> Callable[[str, str, list[str]], Any]:
    """``verify(signature, text, keys)``: ``verifier`` run on a live worker of that signature (where the decisions
    are replayed, as production on that kind of device would); a worker that died is passed over."""
    import ray

    def verify(signature: str, text: str, keys: list[str]) -> Any:
        errors = []
        for h, info in zip(handles, infos):
            if info.signature != signature:
                continue
            try:
                return ray.get(h.with_device.remote(verifier, text, keys))
            except worker_gone() as exc:
                errors.append(f"{info.name}: {_first_line(exc)}")
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                raise FarmFailed(f"verifying on {info.name} failed: {type(cause).__name__}: {_first_line(cause)}") \
                    from None
        raise FarmError(f"no worker of {signature} is up to verify its decisions ({'; '.join(errors) or 'none started'})")

    return verify


def _local_verify(request: DeviceRequest, options: FarmOptions) -> Callable[[str, str, list[str]], Any] | None:
    """A resume with nothing to measure on local devices (the CPU, simulated ones) verifies here, on a device of
    that kind opened in this process."""
    if options.verifier is None:
        return None
    from farm.devices.open import open_device

    def verify(signature: str, text: str, keys: list[str]) -> Any:
        if request.kind == "sim" and request.sim is not None:
            slots = [open_device("sim", i, sim=request.sim) for i in range(request.sim.device_count)]
            device = next((d for d in slots if d.signature == signature), None)
        else:
            device = open_device("cpu", 0)
            device = device if device.signature == signature else None
        if device is None:
            raise FarmError(f"no device of {signature} here to verify its decisions")
        return options.verifier(device, text, keys)  # type: ignore[misc]

    return verify


def oversubscribed_cpu(request: DeviceRequest, address: str | None) -> str:
    """Why CPU measurements on this host are not production's: more workers than usable cores measure at once
    ('' when they are not); the override files carry it and farm publish refuses them unless forced."""
    from farm.devices.runtimes.cpu import usable_cores

    workers, cores = request.count or 1, usable_cores()
    if request.kind != "cpu" or address is not None or workers <= cores:
        return ""
    return (f"measured by {workers} CPU workers at once on {cores} usable core(s): slower and noisier than "
            f"production; tune with --devices cpu:{cores} or fewer")


CONNECT_TIMEOUT_S = 10.0
def _reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail within ``timeout_s`` when nothing listens at a ``host:port`` or ``ray://host:port`` address
    (Ray itself retries for minutes). ``auto`` and addresses without a port are left to Ray."""
    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise FarmFailed(f"cannot reach a Ray cluster at {address}: {reason} (within {timeout_s:.0f} s); "
                         "is `ray start --head` running there, and is the port open?") from None


def _init_ray(address: str | None, request: DeviceRequest) -> None:
    import ray

    if address:
        _reachable(address)
        # a cluster (or a Ray job's own): its runtime environment (the job's working_dir) carries the code
        ray.init(address=address, logging_level=logging.ERROR)
        return
    # the embedded instance: workers import farm and engines from this checkout (or the installed package)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    # Ray's own notices (token auth, deprecations) are not the user's business here; worker errors still reach the log
    kwargs: dict[str, Any] = {"logging_level": logging.ERROR, "runtime_env": {"env_vars": env}}
    cpus = os.cpu_count() or 1
    if request.kind == "cpu":
        cpus = max(cpus, request.count or 1)
    # address="local": a new instance even where a cluster runs on this machine (ray.init() would join that one)
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, **kwargs)


def _stop_workers(handles: Sequence[Any]) -> None:
    import ray

    if not handles:
        return
    try:  # gracefully: let each device finish what it has, then remove the actors
        ray.get([h.close.remote() for h in handles], timeout=10)
    except Exception:
        pass
    for h in handles:
        try:
            ray.kill(h, no_restart=True)
        except Exception:
            pass


def _drive(workload: Workload, jr: JobRun, launcher: WorkerLauncher, options: FarmOptions,
           config: AutotuneConfig, progress: Callable[[FarmStatus], None] | None,
           pruning: PlanPruning | None = None) -> FarmReport:
    """Start the workers, plan the work, then pass every worker and node event to the driver until it is done."""
    handles, infos = launcher.start_initial()
    workers = [_handle(i, info, h) for i, (info, h) in enumerate(zip(infos, handles))]
    sched = Scheduler(shard_size=options.shard_size, finalist_k=options.finalist_k, max_strikes=options.max_strikes,
                      confirm=config.confirm)
    planner = Planner(workload, jr, sched, workers, options.incumbents, pruning)
    # on shared storage (a URI) the workers write their own rows; the driver gets what scheduling needs
    driver = Driver(sched, workers, jr, config, options, workers_write=jr.job.shared, planner=planner,
                    nodes=launcher.nodes)
    sink = PartSink(str(jr.job.results), jr.run) if jr.job.shared else None
    try:
        _event_loop(driver, launcher, workload, config, options, progress, sink)
    finally:
        jr.writer.flush()
    if progress is not None:
        progress(driver.status("done"))
    tuning = time.perf_counter() - driver.t0
    _collect_phases(driver)
    status = driver.status("done")
    return FarmReport(jr.run.job_id, jr.run.run_id, [w.info for w in driver.workers],
                      [w.status for w in driver.workers], planner.skipped, jr.counts, wall_s=tuning, total=sched.total,
                      remeasured=sched.remeasured, tuning_s=tuning, phases=driver.finish_phases(tuning),
                      results=driver.results, confirmations=driver.confirmations,
                      nodes=[n.to_json() for n in status.nodes], waiting=status.given_up,
                      handles=[w.actor for w in driver.workers])


def _handle(index: int, info: WorkerInfo, actor: Any) -> WorkerHandle:
    return WorkerHandle(index, info, actor, WorkerStatus(info.name, info.signature, info.properties.name, info.host,
                                                         WorkerState.IDLE.value, node_id=info.node_id))


def _collect_phases(driver: Driver) -> None:
    """What the workers did since their last task (discovery): asked once, at the end; a worker that does not
    answer keeps what its tasks reported."""
    import ray

    live = [w for w in driver.workers if w.up]
    refs = [w.actor.take_phases.remote() for w in live]
    for w, ref in zip(live, refs):
        try:
            driver.add_phases(w, ray.get(ref, timeout=10))
        except Exception as exc:  # a dead or slow worker: its discovery time is not counted
            log.debug("farm: no phase split from %s: %s", w.status.name, exc)


def _finished_here(workload: Workload, jr: JobRun, request: DeviceRequest, options: FarmOptions,
                   config: AutotuneConfig, pruning: PlanPruning | None = None) -> FarmReport | None:
    """A resume with nothing left to measure, on local devices (the CPU, simulated ones): found by the
    workers' own planning, run here, so no Ray instance starts to do nothing. None: there is work (or
    the devices are GPUs, which only Ray's workers open)."""
    from farm.devices.open import open_device
    from farm.devices.runtimes import RuntimeUnavailable, runtime_for
    from farm.fleet.worker import expand_problems
    from farm.model.engine import default_engine_registry

    # the run's results writer makes the folder at once: a folder without a results file is a first run, whose
    # problems the workers expand (expanding them here too would do it twice)
    if not jr.job.results.exists() or not ResultsDataset(jr.job.results).files:
        return None
    kind = request.kind
    if kind == "auto":
        for gpu in ("cuda", "hip"):
            try:
                if runtime_for(gpu).device_count():
                    return None
            except RuntimeUnavailable:
                pass
        kind = "cpu"
    if kind == "cpu":
        devices = [open_device("cpu", 0)]  # every CPU worker of this host has this signature
    elif kind == "sim" and request.sim is not None:
        devices = [open_device("sim", i, sim=request.sim) for i in range(request.sim.device_count)]
    else:
        return None
    by_sig = {d.signature: d for d in devices}
    sched = Scheduler(shard_size=options.shard_size, finalist_k=options.finalist_k, max_strikes=options.max_strikes,
                      confirm=config.confirm)
    dataset = ResultsDataset(jr.job.results).check_pages()
    problems = list(enumerate(workload.problems))
    registry = default_engine_registry()
    plans = {sig: expand_problems(problems, device, registry) for sig, device in by_sig.items()}
    skipped = _schedule(problems, plans, sched, dataset, pruning=pruning.dry() if pruning else None,
                        props={sig: d.properties for sig, d in by_sig.items()})
    if sched.total or not sched.done:
        return None
    _record_plan(jr, plans, skipped)
    log.info("farm: nothing left to measure in %s; no Ray instance started", jr.job.root)
    infos = [WorkerInfo(f"{kind}:{d.properties.index}", "", "", socket.gethostname(), os.getpid(), d.properties)
             for d in by_sig.values()]
    statuses = [WorkerStatus(i.name, i.signature, i.properties.name, i.host, WorkerState.IDLE.value) for i in infos]
    return FarmReport(jr.run.job_id, jr.run.run_id, infos, statuses, skipped, jr.counts, wall_s=0.0, total=0,
                      remeasured=0, workers_started=False)


class Planner:
    """Discovery in windows: each signature's next problems are expanded (on one of its workers) when its
    queue runs short, so the driver holds the candidates of the problems in flight, not of the whole workload.
    ``skipped``: signature -> problem name -> why it has no candidates."""

    def __init__(self, workload: Workload, jr: JobRun, sched: Scheduler, workers: Sequence[WorkerHandle],
                 incumbents: str | None = None, pruning: PlanPruning | None = None) -> None:
        self.jr, self.sched, self.pruning = jr, sched, pruning
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
        four per device (the queue keeps a choice of kernel families: farm.fleet.scheduler.kernel_family).
        Discovery runs on a worker while the devices work: nothing here waits for it."""
        import ray

        for sig, members in self.by_sig.items():
            if sig in self.inflight:
                ref, chunk = self.inflight[sig]
                ready, _ = ray.wait([ref], timeout=0)
                if not ready:
                    continue
                del self.inflight[sig]
                try:
                    self._take(sig, chunk, ray.get(ref))
                except worker_gone():
                    # its worker died (a killed worker takes the discovery queued behind its task with it): the
                    # window is asked again of a worker that is up, once one is
                    self.again[sig] = chunk
            if sig in self.inflight:
                continue
            # an idle worker answers at once (an actor runs one call at a time); else one that is up
            worker = next((w for w in members if w.free), next((w for w in members if w.up), None))
            if worker is None:
                continue  # every worker of the signature is restarting: discovery waits for one
            chunk = self.again.pop(sig, None)
            if chunk is None and self.next[sig] < len(self.problems) and self.sched.pending_tasks(sig) < 4 * len(members):
                start = self.next[sig]
                chunk = self.problems[start:start + 8 * len(members)]
                self.next[sig] = start + len(chunk)
            if chunk is not None:
                self.inflight[sig] = (worker.actor.expand.remote(chunk), chunk)

    def _take(self, sig: str, chunk: Sequence[tuple[int, WorkloadProblem]], expanded: dict[int, Any]) -> None:
        if sig not in self._prior:
            self._prior[sig] = prior_rows(self.dataset, sig)
        skipped = _schedule(chunk, {sig: expanded}, self.sched, prior={sig: self._prior[sig]},
                            incumbents=self.incumbents, pruning=self.pruning, props=self.props)
        for name, why in skipped.get(sig, {}).items():
            self.skipped.setdefault(sig, {})[name] = why
            self.jr.skip(sig, name, why)


def _schedule(problems: Sequence[tuple[int, WorkloadProblem]], plans: dict[str, dict[int, Any]], sched: Scheduler,
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
                incumbent = incumbent_spec((incumbents or {}).get(sig), wp.problem)
                if pruning is not None and props is not None:
                    cands = pruning.apply(props[sig], wp, cands, before, incumbent)
                sched.add_problem(sig, index, wp, cands, before, incumbent)
    return skipped


def _record_plan(jr: JobRun, plans: dict[str, Any], skipped: dict[str, dict[str, str]]) -> None:
    """The job record learns the signatures tuned and the problems they cannot tune."""
    for sig in plans:
        jr.tuning(sig)
        for name, why in skipped.get(sig, {}).items():
            jr.skip(sig, name, why)


def worker_gone() -> tuple[type[BaseException], ...]:
    """Ray's errors for a call to a worker that died, is restarting, or cannot be placed again (its node is gone)."""
    import ray

    return (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
            ray.exceptions.ActorUnschedulableError)


def _event_loop(driver: Driver, launcher: WorkerLauncher, workload: Workload, config: AutotuneConfig,
                options: FarmOptions, progress: Callable[[FarmStatus], None] | None, sink: PartSink | None = None) -> None:
    """Start what the driver assigns, wait on the streams, restarting and starting workers, follow the nodes
    (placed devices: farm.fleet.nodes), hand over every event."""
    import ray

    gone = worker_gone()
    streams: dict[Any, tuple[WorkerHandle, RunningTask]] = {}  # a task's result stream -> its worker and task
    pings: dict[Any, WorkerHandle] = {}  # info() calls to restarting workers: they get work once one answers
    last_progress = last_poll = last_check = 0.0
    last_look = False  # the nodes were listed once more after the work ran out
    while True:
        now = time.perf_counter()
        if driver.done and not launcher.starting:
            if not launcher.placed or last_look:
                break
            # one more look before the end: a node that joined since the last poll still gets its kind's workload
            last_look, last_check, last_poll = True, 0.0, float("-inf")
        elif launcher.starting:
            last_look = False
        if now - last_check >= 0.25:  # the fleet's state changes in seconds: not looked at on every event
            last_check = now
            unreachable = any(w.unreachable for w in driver.workers)
            # while a worker is unreachable, whether its node is going is asked more often
            if launcher.placed and now - last_poll >= (0.25 if unreachable else options.node_poll_s):
                last_poll = now
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
        for w, task in driver.assignments():
            cands = sorted(driver.sched.candidates_of(task).values(), key=lambda c: c.index)
            gen = w.actor.run.options(num_returns="streaming").remote(
                task, driver.sched.problem_of(task), cands, config, workload.seed, options.stream_interval_s,
                sink, w.task.where if sink is not None else None)
            streams[gen] = (w, w.task)
        for w in driver.workers:
            if (w.restarting or w.unreachable) and w not in pings.values():
                pings[w.actor.info.remote()] = w
        if driver.stuck:
            raise FarmFailed("internal error: work remains but nothing is queued or running")
        discovering = [ref for ref, _ in driver.planner.inflight.values()] if isinstance(driver.planner, Planner) else []
        ready, _ = ray.wait(list(streams) + list(pings) + discovering + list(launcher.starting), num_returns=1,
                            timeout=0.05)
        for ref in [x for x in ready if x in launcher.starting]:
            _started(driver, launcher, ref, gone)
        for ref in [x for x in ready if x in pings]:
            _answered(driver, launcher, pings.pop(ref), ref, gone)
        for gen in [x for x in ready if x in streams]:
            _next_item(driver, launcher, streams, gen, gone)
        for w in driver.on_silent():
            ray.kill(w.actor, no_restart=False)
        for gen, (w, r) in list(streams.items()):
            if w.task is not r:  # the driver settled that task (lost it): its stream is not read again
                del streams[gen]
        for ref, w in list(pings.items()):
            if w.lost:
                del pings[ref]
        now = time.perf_counter()
        if progress is not None and now - last_progress >= options.progress_interval_s:
            last_progress = now
            progress(driver.status())


def _started(driver: Driver, launcher: WorkerLauncher, ref: Any, gone: tuple[type, ...]) -> None:
    """A worker started on a node that joined answers (it takes work now), or failed to start."""
    import ray

    handle, slot = launcher.take(ref)
    try:
        info = ray.get(ref)
    except gone as exc:  # its node went before it was up
        log.warning("farm: a worker on node %s did not start: %s", slot.node_id[:8], _first_line(exc))
        return
    except ray.exceptions.RayTaskError as exc:
        log.warning("farm: a worker on node %s failed to start: %s", slot.node_id[:8], _first_line(exc))
        return
    if launcher.kind == "gpu" and any(w.info.host == info.host and w.info.properties.uuid == info.properties.uuid
                                      and not w.lost for w in driver.workers):
        # two raylets of one host that both claim a GPU (a misconfigured node): one worker measures it, not two
        log.error("farm: a worker on node %s got GPU %s of %s, which another worker measures already: stopped",
                  slot.node_id[:8], info.properties.uuid, info.host)
        ray.kill(handle, no_restart=True)
        return
    driver.add_worker(_handle(len(driver.workers), info, handle))


def _worker_lost(driver: Driver, launcher: WorkerLauncher, w: WorkerHandle, exc: BaseException) -> bool:
    """True when ``w`` died with its node (the driver was told): a worker pinned to a node that is gone cannot be
    placed again (ActorUnschedulableError), or the cluster lists its node dead."""
    import ray

    if not launcher.placed or not w.info.node_id:
        return False
    if isinstance(exc, ray.exceptions.ActorUnschedulableError) or not launcher.node_alive(w.info.node_id):
        driver.on_node_lost(w.info.node_id, _first_line(exc))
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
            driver.on_unreachable(w, _first_line(exc))  # Ray may not list its node dead yet: judged later
        else:
            driver.on_lost(w, _first_line(exc))
        return
    except ray.exceptions.RayTaskError as exc:  # the worker's own code raised: writing its results, mostly
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        raise FarmFailed(f"{w.status.name} failed: {type(cause).__name__}: {_first_line(cause)}") from None
    if isinstance(item, TaskStarted):
        driver.on_started(w)
    elif isinstance(item, TaskEnd):
        driver.on_end(w, item)
    else:
        driver.on_batch(w, item)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
