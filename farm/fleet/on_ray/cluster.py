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
from pathlib import Path
from typing import Any, Callable, Sequence

from farm.errors import first_line
from farm.fleet.driver import Driver, FarmStatus, WorkerState, WorkerStatus, finish_phases
from farm.fleet.job import JobRun
from farm.fleet.on_ray.launcher import FarmFailed, WorkerLauncher
from farm.fleet.executor import InProcessCalls, finish_job, start_job, verify_on_workers
from farm.fleet.on_ray.calls import RayCalls
from farm.fleet.on_ray.event_loop import EventLoop, worker_handle
from farm.fleet.planner import Planner, record_plan, schedule_problems
from farm.fleet.report import TuneReport
from farm.fleet.options import DeviceRequest, FarmOptions
from farm.fleet.plan_pruning import PlanPruning
from farm.fleet.on_ray.reaper import Reaper
from farm.fleet.scheduler import Scheduler
from farm.fleet.on_ray.worker import PartSink, WorkerInfo
from farm.model.records import AutotuneConfig
from farm.model.workload import Workload
from farm.store.dataset import ResultsDataset

log = logging.getLogger("farm.fleet.on_ray.cluster")
REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["run_farm"]


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
) -> TuneReport:
    """Tune ``workload`` on every device of the cluster (or a local one) into ``out``."""
    options = options or FarmOptions()
    request = DeviceRequest.parse(devices) if isinstance(devices, str) else devices
    job = start_job(workload, out, options, config, {
        "executor": "ray", "devices": request.kind, "shard_size": options.shard_size,
        "finalist_k": options.finalist_k, "address": address or "local"}, job_id,
        timeout_s=options.candidate_timeout_s)
    jr, config, pruner = job.run, job.config, job.pruning
    jr.measurement_warning = oversubscribed_cpu(request, address)
    ray_up = _RayInstance()
    try:
        if options.cpu_threads is None and address is None:
            from farm.devices.runtimes.cpu import blas_threads_in_force

            # the embedded instance runs on this host: production here runs with this process's threads
            options = dataclasses.replace(options, cpu_threads=blas_threads_in_force())
        report, verify = _tune(workload, jr, request, options, config, pruner, address, progress, ray_up)
        # the workers are still up: the reduce's decisions are replayed on them before they stop
        report.summary = finish_job(job, options, verify, **_run_record(report))
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
          ray_up: _RayInstance) -> tuple[TuneReport, Callable[[str, str, list[str]], Any] | None]:
    """The workload tuned on the cluster's workers, or found measured already (no Ray started): the report, and
    how the decisions are verified (on the workers while they are up, or in this process)."""
    import ray

    finished = _finished_here(workload, jr, request, options, config, pruner) \
        if address is None and not ray.is_initialized() else None
    if finished is not None:
        # verified here, on a device of each kind opened in this process
        verify = verify_on_workers(finished.handles, InProcessCalls(), options.verifier) if options.verifier else None
        return finished, verify
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
    return report, verify_on_workers(report.handles, RayCalls(), options.verifier)


def _run_record(report: TuneReport) -> dict[str, Any]:
    """What the job record keeps of a Ray run: its devices, nodes, workers, skipped problems and phases."""
    return {"devices": [{"name": w.name, "host": w.host, "node_id": w.node_id, "gpu_ids": list(w.gpu_ids),
                         "signature": w.signature, "niceness": w.niceness, "properties": w.properties.to_dict()}
                        for w in report.workers],
            **({"nodes": report.nodes} if report.nodes else {}),
            "workers": [s.to_json() for s in report.statuses], "skipped_problems": report.problems_skipped,
            "phases": {"tuning_s": round(report.tuning_s, 3), "devices": len(report.statuses),
                       "total": report.phases.to_json()}}


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
LOCAL_START_ATTEMPTS = 2  # a loaded machine's first start can time out where the second one comes up


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
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, **kwargs)
            return
        except Exception as exc:  # Ray's own: its node timed out starting (a loaded machine), a port taken...
            ray.shutdown()  # what this attempt started goes before the next one
            if attempt == LOCAL_START_ATTEMPTS:
                raise FarmFailed(f"a local Ray instance did not start ({LOCAL_START_ATTEMPTS} tries: "
                                 f"{type(exc).__name__}: {first_line(exc)}); on a busy machine run the same command "
                                 "again, or tune in this process with --in-process") from None
            log.warning("farm: the local Ray instance did not start (%s); trying again", first_line(exc))


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
           pruning: PlanPruning | None = None) -> TuneReport:
    """Start the workers, plan the work, then pass every worker and node event to the driver until it is done."""
    handles, infos = launcher.start_initial()
    workers = [worker_handle(i, info, h) for i, (info, h) in enumerate(zip(infos, handles))]
    sched = Scheduler(shard_size=options.shard_size, finalist_k=options.finalist_k, max_strikes=options.max_strikes,
                      confirm=config.confirm)
    planner = Planner(workload, jr, sched, workers, RayCalls(), options.incumbents, pruning)
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
    return TuneReport(jr.run.job_id, jr.run.run_id, [w.info for w in driver.workers],
                      [w.status for w in driver.workers], planner.skipped, jr.counts, wall_s=tuning, total=sched.total,
                      remeasured=sched.remeasured, tuning_s=tuning, phases=finish_phases(driver.workers, tuning),
                      results=driver.results, confirmations=driver.confirmations,
                      nodes=[n.to_json() for n in status.nodes], waiting=status.given_up,
                      handles=list(driver.workers))


def _collect_phases(driver: Driver) -> None:
    """What the workers did since their last task (discovery): asked once, at the end; a worker that does not
    answer keeps what its tasks reported."""
    import ray

    live = [w for w in driver.workers if w.up]
    refs = [w.actor.take_phases.remote() for w in live]
    for w, ref in zip(live, refs):
        try:
            w.status.phases = w.status.phases + ray.get(ref, timeout=10)  # its discovery after its last task
        except Exception as exc:  # a dead or slow worker: its discovery time is not counted
            log.debug("farm: no phase split from %s: %s", w.status.name, exc)


def _finished_here(workload: Workload, jr: JobRun, request: DeviceRequest, options: FarmOptions,
                   config: AutotuneConfig, pruning: PlanPruning | None = None) -> TuneReport | None:
    """A resume with nothing left to measure, on local devices (the CPU, simulated ones): found by the
    workers' own planning, run here, so no Ray instance starts to do nothing. None: there is work (or
    the devices are GPUs, which only Ray's workers open)."""
    from farm.devices.open import open_device
    from farm.devices.runtimes.base import RuntimeUnavailable
    from farm.devices.runtimes import runtime_for
    from farm.fleet.on_ray.worker import DeviceWorkerImpl, expand_problems
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
    handles = [worker_handle(n, info, DeviceWorkerImpl.in_process_on(d, registry))
               for n, (info, d) in enumerate(zip(infos, by_sig.values()))]
    return TuneReport(jr.run.job_id, jr.run.run_id, infos, statuses, skipped, jr.counts, wall_s=0.0, total=0,
                      remeasured=0, workers_started=False, handles=handles)
