"""The Ray farm: one device worker (actor) per GPU, dynamic fan-out, faults, results as they arrive.

    report = run_farm(workload, "runs/x")                  # embedded local Ray, GPUs or the CPU
    report = run_farm(workload, "runs/x", address="auto")  # an existing cluster (ray job submit)

This module is the Ray shell: it starts the workers (farm.fleet.on_ray.launcher, on the nodes that have devices and on
those that join), runs discovery, starts the tasks the driver assigns and passes every event of the workers'
streams and of the cluster's nodes to the Ray-free driver (farm.fleet.driver), which schedules
(farm.fleet.scheduler), writes rows as they arrive and decides what a crash, a silence or a lost node means.
The job folder's lifecycle is farm.fleet.job; discovery in windows is farm.fleet.planner.
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
from farm.fleet.driver import Driver, FarmStatus, WorkerState, WorkerStatus
from farm.fleet.job import JobRun, JobSummary
from farm.fleet.on_ray.launcher import FarmFailed, WorkerLauncher
from farm.fleet.on_ray.event_loop import EventLoop, first_line, worker_handle
from farm.fleet.planner import Planner, record_plan, schedule_problems, worker_gone
from farm.fleet.options import DeviceRequest, FarmOptions
from farm.fleet.plan_pruning import PlanPruning
from farm.fleet.on_ray.reaper import Reaper
from farm.fleet.scheduler import Scheduler
from farm.fleet.on_ray.worker import PartSink, WorkerInfo
from farm.model.records import AutotuneConfig, AutotuneResult
from farm.model.workload import Workload
from farm.store.dataset import ResultsDataset
from farm.store.reduce import ReduceReport
from farm.tuner.phases import PhaseSplit

log = logging.getLogger("farm.fleet.on_ray.cluster")
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
    options = options or FarmOptions()
    request = DeviceRequest.parse(devices) if isinstance(devices, str) else devices
    # a candidate measured past its budget ends there, as in-process (farm.fleet.local_run.run_local): the same bound
    # on both executors, so a workload asking for a billion iterations gets a result, not a worker killed as hung
    config = (config or workload.autotune).bounded_by(options.candidate_timeout_s)
    # a model file is read (and refused) before the job folder or Ray is touched
    pruner = PlanPruning.of(config, check_decided=options.check_decided and bool(options.incumbents))
    jr = JobRun(out, workload, {"executor": "ray", "devices": request.kind, "shard_size": options.shard_size,
                                "finalist_k": options.finalist_k, "candidate_timeout_s": options.candidate_timeout_s,
                                "address": address or "local", "incumbents": options.incumbents,
                                "prune": pruner.settings_record() if pruner else None}, job_id)
    if pruner is not None:
        pruner.write = jr.write
    jr.measurement_warning = oversubscribed_cpu(request, address)
    ray_up = _RayInstance()
    try:
        if options.cpu_threads is None and address is None:
            from farm.devices.runtimes.cpu import blas_threads_in_force

            # the embedded instance runs on this host: production here runs with this process's threads
            options = dataclasses.replace(options, cpu_threads=blas_threads_in_force())
        report, verify = _tune(workload, jr, request, options, config, pruner, address, progress, ray_up)
        # the workers are still up: the reduce's decisions are replayed on them before they stop
        report.summary = jr.finish(reduce=options.reduce, top_k=options.top_k, verify=verify,
                                   **_run_record(report, pruner))
    except BaseException as exc:
        jr.fail(exc)
        raise
    finally:
        ray_up.stop()
    report.pruning = pruner.record() if pruner else None
    report.reduce = report.summary.reduce
    report.wall_s = report.summary.wall_s
    return report


class _RayInstance:
    """The Ray instance and workers this run started (an existing cluster is left running), stopped at the end."""

    def __init__(self) -> None:
        self.started = False
        self.reaper: Reaper | None = None
        self.handles: list[Any] = []

    def start(self, address: str | None, request: DeviceRequest) -> None:
        import ray

        if ray.is_initialized():
            return
        if address is None:  # an embedded instance: stopped whole even if this process is killed
            self.reaper = Reaper()
        _init_ray(address, request)
        self.started = True

    def stop(self) -> None:
        _stop_workers(self.handles)
        if self.started:
            import ray

            ray.shutdown()
        if self.reaper is not None:
            self.reaper.done()


def _tune(workload: Workload, jr: JobRun, request: DeviceRequest, options: FarmOptions, config: AutotuneConfig,
          pruner: PlanPruning | None, address: str | None, progress: Callable[[FarmStatus], None] | None,
          ray_up: _RayInstance) -> tuple[FarmReport, Callable[[str, str, list[str]], Any] | None]:
    """The workload tuned on the cluster's workers, or found measured already (no Ray started): the report, and
    how the decisions are verified (on the workers while they are up, or in this process)."""
    import ray

    finished = _finished_here(workload, jr, request, options, config, pruner) \
        if address is None and not ray.is_initialized() else None
    if finished is not None:
        return finished, _local_verify(request, options)
    if progress is not None:
        progress(FarmStatus(0, 0, 0, 0, 0.0, [], [], phase="starting"))
    ray_up.start(address, request)
    launcher = WorkerLauncher(request, options, workload.problems)
    ray_up.handles = launcher.handles
    report = _drive(workload, jr, launcher, options, config, progress, pruner)
    for sig, names in report.waiting.items():
        jr.wait_for_devices(sig, names)
    if options.verifier is None:
        return report, None
    if progress is not None:
        progress(FarmStatus(report.total, report.total, report.remeasured, 0, report.tuning_s, report.statuses, [],
                            phase="verifying"))
    return report, _worker_verify(report.handles, report.workers, options.verifier)


def _run_record(report: FarmReport, pruner: PlanPruning | None) -> dict[str, Any]:
    """What the job record keeps of a Ray run: its devices, nodes, workers, skipped problems and phases."""
    return {"devices": [{"name": w.name, "host": w.host, "node_id": w.node_id, "gpu_ids": list(w.gpu_ids),
                         "signature": w.signature, "niceness": w.niceness, "properties": w.properties.to_dict()}
                        for w in report.workers],
            **({"nodes": report.nodes} if report.nodes else {}),
            "workers": [s.to_json() for s in report.statuses], "skipped_problems": report.problems_skipped,
            "phases": {"tuning_s": round(report.tuning_s, 3), "devices": len(report.statuses),
                       "total": report.phases.to_json()},
            **({"pruning": pruner.tally()} if pruner else {})}


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
                errors.append(f"{info.name}: {first_line(exc)}")
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                raise FarmFailed(f"verifying on {info.name} failed: {type(cause).__name__}: {first_line(cause)}") \
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
    workers = [worker_handle(i, info, h) for i, (info, h) in enumerate(zip(infos, handles))]
    sched = Scheduler(shard_size=options.shard_size, finalist_k=options.finalist_k, max_strikes=options.max_strikes,
                      confirm=config.confirm)
    planner = Planner(workload, jr, sched, workers, options.incumbents, pruning)
    # on shared storage (a URI) the workers write their own rows; the driver gets what scheduling needs
    driver = Driver(sched, workers, jr, config, options, workers_write=jr.job.shared, planner=planner,
                    nodes=launcher.nodes)
    sink = PartSink(str(jr.job.results), jr.run) if jr.job.shared else None
    try:
        EventLoop(driver, launcher, workload, config, options, progress, sink).run()
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
    from farm.fleet.on_ray.worker import expand_problems
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
    skipped = schedule_problems(problems, plans, sched, dataset, pruning=pruning.dry() if pruning else None,
                        props={sig: d.properties for sig, d in by_sig.items()})
    if sched.total or not sched.done:
        return None
    record_plan(jr, plans, skipped)
    log.info("farm: nothing left to measure in %s; no Ray instance started", jr.job.root)
    infos = [WorkerInfo(f"{kind}:{d.properties.index}", "", "", socket.gethostname(), os.getpid(), d.properties)
             for d in by_sig.values()]
    statuses = [WorkerStatus(i.name, i.signature, i.properties.name, i.host, WorkerState.IDLE.value) for i in infos]
    return FarmReport(jr.run.job_id, jr.run.run_id, infos, statuses, skipped, jr.counts, wall_s=0.0, total=0,
                      remeasured=0, workers_started=False)
