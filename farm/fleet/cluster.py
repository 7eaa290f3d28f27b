"""The Ray farm: one device worker (actor) per GPU, dynamic fan-out, faults, results as they arrive.

    report = run_farm(workload, "runs/x")                  # embedded local Ray, GPUs or the CPU
    report = run_farm(workload, "runs/x", address="auto")  # an existing cluster (ray job submit)

The driver plans work per device signature (farm.fleet.scheduler), lets each worker
pull the next task when it is free, streams every candidate's result into the
Parquet dataset as it arrives, restarts workers that die or hang, and reduces
the results into override files at the end. The workers run the in-process
autotuner unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from farm.tuner.autotuner import Autotuner
from farm.model.records import AutotuneConfig, AutotuneResult
from farm.devices.device import Device
from farm.devices.properties import DeviceProperties
from farm.model.engine import EngineRegistry, default_engine_registry
from farm.errors import AutotuneError, FarmError, InputError
from farm.fleet.job import JobRun, JobSummary
from farm.store.reduce import ReduceReport
from farm.store.results import MeasurementContext, ResultsDataset, candidate_key, new_id, spec_of
from farm.fleet.scheduler import FINALIST, Candidate, PriorRow, Scheduler, Task
from farm.devices.sim import SimConfig
from farm.model.workload import Workload, WorkloadProblem

log = logging.getLogger("farm.fleet.cluster")
REPO_ROOT = Path(__file__).resolve().parents[1]


class FarmFailed(FarmError, RuntimeError):
    """The farm could not run (no devices, workers that never start...)."""


# -- what to run on ------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceRequest:
    """Which device workers to start: ``auto``, ``gpu``, ``cpu[:N]``, ``sim:N`` or ``sim:FILE.yaml``."""

    kind: str = "auto"
    count: int | None = None
    sim: SimConfig | None = None

    @staticmethod
    def parse(text: str) -> "DeviceRequest":
        kind, _, arg = str(text).partition(":")
        if kind in ("auto", "gpu") and not arg:
            return DeviceRequest(kind)
        if kind == "cpu":
            return DeviceRequest("cpu", _count(arg or "1", text))
        if kind == "sim":
            if not arg:
                return DeviceRequest("sim", 1, SimConfig())
            if arg.isdigit():
                n = _count(arg, text)
                return DeviceRequest("sim", n, SimConfig.parse({"devices": [{"name": "Sim GPU", "count": n}]}))
            cfg = SimConfig.load(arg)
            return DeviceRequest("sim", cfg.device_count, cfg)
        raise InputError("expected auto, gpu, cpu[:N], sim:N or sim:FILE.yaml", field="--devices", value=text)


def _count(arg: str, text: str) -> int:
    if not arg.isdigit() or int(arg) < 1:
        raise InputError("the device count must be an integer >= 1", field="--devices", value=text)
    return int(arg)


@dataclass(frozen=True)
class FarmSettings:
    shard_size: int = 128
    finalist_k: int = 3
    candidate_timeout_s: float = 120.0
    max_strikes: int = 2
    stream_interval_s: float = 0.02  # a worker sends what it has at least this often
    startup_timeout_s: float = 300.0
    cpu_threads: int | None = None  # BLAS threads of a CPU worker (None: what production uses, see run_farm)


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    actor_id: str
    node_id: str
    host: str
    pid: int
    properties: DeviceProperties
    gpu_ids: tuple[str, ...] = ()

    @property
    def signature(self) -> str:
        return self.properties.signature


@dataclass(frozen=True)
class TaskStarted:
    """The first item a worker streams for a task: the task is running on the device now."""

    pid: int


@dataclass(frozen=True)
class TaskEnd:
    """The last item a worker streams for a task."""

    session: str
    ranks: dict[str, int]
    error: str = ""
    wall_ms: float = 0.0


# -- the device worker (runs inside a Ray actor) -----------------------------------------------
class DeviceWorkerImpl:
    """Holds one device, its runtime handle, properties and signature; tunes tasks on it."""

    def __init__(self, kind: str, slot: int, sim: SimConfig | None = None,
                 problems: Sequence[WorkloadProblem] = (), registry: EngineRegistry | None = None,
                 cpu_threads: int | None = None) -> None:
        logging.basicConfig(level=logging.WARNING)
        self.kind = kind
        if kind == "cpu":
            # Ray starts an actor with OMP_NUM_THREADS=1; production runs with the host's threads, so
            # measure with those (the count is part of the CPU's device signature: compute_units)
            from farm.devices.runtimes.cpu import _usable_cores, set_blas_threads

            set_blas_threads(cpu_threads or _usable_cores())
        self.registry = registry or default_engine_registry()
        # before the device opens (torch's import, CUDA's start: seconds), so a compile pool's
        # processes start alongside it rather than during this worker's first task
        self.prepare(problems)
        self.device = _open(kind, slot, sim)
        self.name = f"{kind}:{self.device.properties.index}"

    def info(self) -> WorkerInfo:
        import ray

        ctx = ray.get_runtime_context()
        return WorkerInfo(self.name, ctx.get_actor_id() or "", ctx.get_node_id(), socket.gethostname(), os.getpid(),
                          self.device.properties, tuple(str(g) for g in ray.get_gpu_ids()))

    def expand(self, problems: Sequence[tuple[int, WorkloadProblem]]) -> dict[int, list[Candidate] | str]:
        """Discovery where the signature lives: each problem's candidates here, or why there are none."""
        from farm.tuner.problem_tuning import plan_specs_for

        out: dict[int, list[Candidate] | str] = {}
        for index, wp in problems:
            tuner = Autotuner(wp.problem, self.device, registry=self.registry)
            try:
                specs = plan_specs_for(wp, tuner)
            except FarmError as exc:
                out[index] = str(exc)
                continue
            if not specs:
                reasons = "; ".join(f"{c.engine_name}: {c.reason}" for c in self.registry.explain(wp.problem, self.device)
                                    if wp.engines.selects(c.engine_name)) or "no engine implements this op"
                out[index] = f"no applicable engine ({reasons})"
                continue
            cands = []
            for i, s in enumerate(specs):
                engine = self.registry.get(s.engine_id)
                cands.append(Candidate(s, engine.name, i, bool(engine.supports_exhaustive),
                                       tuner._collection.estimated_workspace(s)))
            out[index] = cands
        self._prepare(c.engine_name for cands in out.values() if not isinstance(cands, str) for c in cands)
        return out

    def prepare(self, problems: Sequence[WorkloadProblem]) -> None:
        """Start what the engines the workload selects want for their compiles (the worker does this
        as it starts, with the workload's problems)."""
        self._prepare(e.name for e in self.registry if any(wp.engines.selects(e.name) for wp in problems))

    def _prepare(self, engine_names: Iterable[str]) -> None:
        """Let engines the tasks will use start what their compiles want on this kind of device
        (Triton's compile pool) in the background: a worker tunes many problems, so it pays once. Idempotent."""
        self.registry.prepare(engine_names, self.kind)

    def run(self, task: Task, wp: WorkloadProblem, candidates: Sequence[Candidate], config: AutotuneConfig,
            seed: int, stream_interval_s: float) -> Iterator[TaskStarted | list[AutotuneResult] | TaskEnd]:
        """Tune the task's candidates; stream TaskStarted, results (each alone in careful mode), then TaskEnd."""
        yield TaskStarted(os.getpid())
        t0 = time.perf_counter()
        self._prepare(c.engine_name for c in candidates)  # discovery ran on one worker of the signature only
        index = {c.spec: c.index for c in candidates}
        items: queue.Queue = queue.Queue()
        session = new_id()
        if self.device.vendor in ("nvidia", "amd") and config.compile_workers == 0:
            config = dataclasses.replace(config, compile_workers=2)  # keep the GPU busy while JIT engines compile

        def tune() -> None:
            tuner = Autotuner(wp.problem, self.device, registry=self.registry)
            error = ""
            ranked: list[AutotuneResult] = []
            try:
                for spec in task.specs:
                    tuner.add_engine(spec.engine_id, dict(spec.knobs))
                ranked = tuner.autotune(config=config, seed=seed, listener=items.put)
            except AutotuneError as exc:
                ranked, error = exc.results, "" if exc.results else str(exc)
            except Exception as exc:  # an engine bug must not kill the worker silently
                error = f"{type(exc).__name__}: {exc}"
            finally:
                tuner.close()
            ranks = {candidate_key(r.engine_id, r.knobs): r.rank for r in ranked}
            items.put(TaskEnd(session, ranks, error, (time.perf_counter() - t0) * 1e3))

        thread = threading.Thread(target=tune, name=f"farm-task-{task.id}", daemon=True)
        thread.start()
        batch: list[AutotuneResult] = []
        last = time.perf_counter()
        while True:
            try:
                item = items.get(timeout=stream_interval_s)
            except queue.Empty:
                # nothing new: send what is measured now, so a candidate that hangs next costs only itself
                if batch:
                    yield batch
                    batch, last = [], time.perf_counter()
                continue
            if isinstance(item, TaskEnd):
                if batch:
                    yield batch
                thread.join()
                self._check_health()
                yield item
                return
            batch.append(dataclasses.replace(item, candidate=index.get(item.spec, item.candidate)))
            if task.careful or time.perf_counter() - last >= stream_interval_s:
                yield batch
                batch, last = [], time.perf_counter()

    def _check_health(self) -> None:
        """A device left in an error state (a lost CUDA context) poisons every later task: restart."""
        try:
            self.device.synchronize()
        except Exception as exc:
            log.error("farm: %s is unusable after a task (%s); restarting the worker", self.name, exc)
            os._exit(3)

    def close(self) -> None:
        self.device.runtime.synchronize()


def _open(kind: str, slot: int, sim: SimConfig | None) -> Device:
    if kind == "sim":
        from farm.devices.sim import sim_device

        assert sim is not None
        group, index = sim.slots()[slot]
        return sim_device(sim, group, slot)
    if kind == "cpu":
        from farm.devices.device import cpu_device

        return cpu_device(slot)
    from farm.devices.device import gpu_device
    from farm.devices.runtimes import RuntimeUnavailable

    import ray

    errors = []
    for runtime in ("cuda", "hip"):
        try:
            dev = gpu_device(runtime, 0)  # Ray made the assigned GPU the only visible one
        except RuntimeUnavailable as exc:
            errors.append(str(exc))
            continue
        ids = ray.get_gpu_ids()
        physical = int(ids[0]) if ids and str(ids[0]).isdigit() else dev.properties.index
        dev.properties = dataclasses.replace(dev.properties, index=physical)
        dev.index = 0
        return dev
    raise FarmFailed("a GPU worker found no GPU: " + "; ".join(errors))


# -- the driver --------------------------------------------------------------------------------
@dataclass
class WorkerStatus:
    name: str
    signature: str
    device: str
    host: str
    state: str = "starting"  # starting | idle | busy | restarting | stopped
    problem: str = ""
    candidates: int = 0
    failures: int = 0
    restarts: int = 0
    busy_s: float = 0.0


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

    @property
    def eta_s(self) -> float | None:
        if not self.finished or self.finished >= self.total:
            return None
        return self.elapsed_s / self.finished * (self.total - self.finished)


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
    results: dict[tuple[str, str], list[AutotuneResult]] = field(default_factory=dict)  # (signature, problem name)
    summary: JobSummary | None = None  # how the run ended (set once it has)
    reduce: ReduceReport | None = None

    @property
    def rows_written(self) -> int:
        return self.summary.rows_written if self.summary else 0


@dataclass
class _Running:
    task: Task
    worker: int
    generator: Any
    started: float
    last_progress: float
    reported: list = field(default_factory=list)
    where: MeasurementContext | None = None
    running: bool = False  # the worker said it started the task


def run_farm(
    workload: Workload,
    out: str | Path,
    *,
    devices: DeviceRequest | str = "auto",
    address: str | None = None,
    settings: FarmSettings | None = None,
    config: AutotuneConfig | None = None,
    progress: Callable[[FarmStatus], None] | None = None,
    progress_interval_s: float = 0.5,
    reduce: bool = True,
    top_k: int = 3,
    job_id: str | None = None,
    keep_results: bool = False,
    incumbents: str | None = None,
) -> FarmReport:
    """Tune ``workload`` on every device of the cluster (or a local one) into ``out``."""
    import ray

    settings = settings or FarmSettings()
    request = DeviceRequest.parse(devices) if isinstance(devices, str) else devices
    config = config or workload.autotune
    jr = JobRun(out, workload, {"executor": "ray", "devices": request.kind, "shard_size": settings.shard_size,
                                "finalist_k": settings.finalist_k, "candidate_timeout_s": settings.candidate_timeout_s,
                                "address": address or "local", "incumbents": incumbents}, job_id)
    started_ray = False
    handles: list[Any] = []
    try:
        if not ray.is_initialized():
            _init_ray(address, request)
            started_ray = True
        if settings.cpu_threads is None and address is None:
            from farm.devices.runtimes.cpu import blas_threads_in_force

            # the embedded instance runs on this host: production here runs with this process's threads
            settings = dataclasses.replace(settings, cpu_threads=blas_threads_in_force())
        handles, infos = _start_workers(request, settings, workload.problems)
        report = _drive(workload, jr, handles, infos, request, settings, config, progress, progress_interval_s,
                        keep_results)
    except BaseException as exc:
        jr.fail(exc)
        raise
    finally:
        _stop_workers(handles)
        if started_ray:
            ray.shutdown()
    report.summary = jr.finish(
        reduce=reduce, top_k=top_k,
        devices=[{"name": w.name, "host": w.host, "gpu_ids": list(w.gpu_ids), "signature": w.signature,
                  "properties": w.properties.to_dict()} for w in report.workers],
        workers=[dataclasses.asdict(s) for s in report.statuses], skipped_problems=report.problems_skipped)
    report.reduce = report.summary.reduce
    report.wall_s = report.summary.wall_s
    return report


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
    ray.init(num_cpus=cpus, include_dashboard=False, **kwargs)


def _start_workers(request: DeviceRequest, settings: FarmSettings,
                   problems: Sequence[WorkloadProblem] = ()) -> tuple[list[Any], list[WorkerInfo]]:
    import ray

    actor = ray.remote(DeviceWorkerImpl)
    kind = request.kind
    if kind == "auto":
        kind = "gpu" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"
    opts: dict[str, Any] = {"max_restarts": -1, "max_task_retries": 0}
    if kind == "gpu":
        n = int(ray.cluster_resources().get("GPU", 0))
        if n < 1:
            raise FarmFailed("--devices gpu: the cluster has no GPUs")
        handles = [actor.options(num_gpus=1, num_cpus=1, **opts).remote("gpu", i, None, list(problems))
                   for i in range(n)]
    elif kind == "cpu":
        n = request.count or 1
        handles = [actor.options(num_cpus=1, **opts).remote("cpu", i, None, (), None, settings.cpu_threads)
                   for i in range(n)]
    else:
        assert request.sim is not None
        n = request.sim.device_count
        handles = [actor.options(num_cpus=0, **opts).remote("sim", i, request.sim) for i in range(n)]
    try:
        infos = ray.get([h.info.remote() for h in handles], timeout=settings.startup_timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise FarmFailed(f"{n} {kind} worker(s) did not start within {settings.startup_timeout_s:.0f} s "
                         f"(cluster resources: {ray.cluster_resources()})") from None
    except ray.exceptions.RayActorError as exc:
        raise FarmFailed(f"a {kind} worker failed to start: {exc}") from None
    if kind == "gpu":
        seen = [(i.host, i.properties.uuid) for i in infos]
        if len(set(seen)) != len(seen):
            raise FarmFailed(f"two GPU workers share a GPU: {seen}")
    log.info("farm: %d worker(s): %s", len(infos), ", ".join(f"{i.name}@{i.host} {i.signature}" for i in infos))
    return handles, infos


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


def _expand(handles: Sequence[Any], members: Sequence[int], problems: Any, signature: str) -> dict[int, Any]:
    """Discovery on a worker of the signature; another one is tried if it dies."""
    import ray

    errors = []
    for w in members:
        try:
            return ray.get(handles[w].expand.remote(problems))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            errors.append(_first_line(exc))
    raise FarmFailed(f"engine discovery failed on every worker of {signature}: {'; '.join(errors)}")


def _prior_rows(dataset: ResultsDataset | None, signature: str) -> dict[str, list[PriorRow]]:
    if dataset is None or not dataset.files:
        return {}
    import pyarrow.dataset as ds

    t = dataset.table(["problem_key", "candidate_key", "round", "session_id", "succeeded", "median_ms", "mad_ms"],
                      filter=ds.field("device_signature") == signature)
    out: dict[str, list[PriorRow]] = {}
    for pk, ck, rnd, sess, ok, med, mad in zip(*(t.column(c).to_pylist() for c in t.column_names)):
        out.setdefault(pk, []).append(PriorRow(spec_of(ck), rnd, sess, bool(ok), med, mad))
    return out


def _drive(workload: Workload, jr: JobRun, handles: list[Any], infos: list[WorkerInfo],
           request: DeviceRequest, settings: FarmSettings, config: AutotuneConfig,
           progress: Callable[[FarmStatus], None] | None, progress_interval_s: float, keep_results: bool) -> FarmReport:
    import ray

    t0 = time.perf_counter()
    by_sig: dict[str, list[int]] = {}
    for i, info in enumerate(infos):
        by_sig.setdefault(info.signature, []).append(i)
    statuses = [WorkerStatus(i.name, i.signature, i.properties.name, i.host, "idle") for i in infos]
    sched = Scheduler(shard_size=settings.shard_size, finalist_k=settings.finalist_k, max_strikes=settings.max_strikes)
    problems = list(enumerate(workload.problems))
    job = jr.job
    dataset = ResultsDataset(job.results) if job.results.exists() else None
    skipped: dict[str, dict[str, str]] = {}
    for sig, members in by_sig.items():
        jr.tuning(sig)
        expanded = _expand(handles, members, problems, sig)
        prior = _prior_rows(dataset, sig)
        for index, wp in problems:
            cands = expanded[index]
            if isinstance(cands, str):
                skipped.setdefault(sig, {})[wp.name] = cands
                jr.skip(sig, wp.name, cands)
                continue
            sched.add_problem(sig, index, wp, cands, prior.get(wp.problem.key, ()))
    counts = jr.counts
    results: dict[tuple[str, str], list[AutotuneResult]] = {}
    running: dict[Any, _Running] = {}
    busy: set[int] = set()
    last_progress_call = 0.0

    def status(phase: str = "tuning") -> FarmStatus:
        failed = sum(v for k, v in counts.items() if k != "succeeded")
        return FarmStatus(sched.total, sched.finished, sched.remeasured, failed, time.perf_counter() - t0,
                          statuses, sorted(by_sig), phase)

    def write(r: _Running, rows: Sequence[AutotuneResult]) -> None:
        wp = sched.problem_of(r.task)
        jr.write((x, wp, r.where) for x in rows)
        for x in rows:
            sched.on_result(r.task, x, r.where.session_id if r.where else "")
            if keep_results:
                results.setdefault((r.task.signature, wp.name), []).append(x)
        st = statuses[r.worker]
        st.candidates += len(rows)
        st.failures += sum(not x.succeeded for x in rows)

    def finish(key: Any, r: _Running) -> None:
        running.pop(key, None)
        busy.discard(r.worker)
        st = statuses[r.worker]
        st.busy_s += time.perf_counter() - r.started
        if st.state == "busy":
            st.state, st.problem = "idle", ""

    pings: dict[Any, int] = {}  # info() calls to workers being restarted: they get work once it answers

    def lose(key: Any, r: _Running, kind: str, detail: str) -> None:
        finish(key, r)
        # a task that never started on the device (the worker was still restarting) proves nothing
        rows = sched.on_task_lost(r.task, [x.spec for x in r.reported], kind if r.running else "not_started",
                                  config, detail)
        if rows:
            write(r, rows)
        if kind != "error":
            statuses[r.worker].state = "restarting"
            statuses[r.worker].restarts += r.running
            busy.add(r.worker)
            pings[handles[r.worker].info.remote()] = r.worker

    try:
        while not sched.done or running or pings:
            for sig, members in by_sig.items():
                for w in members:
                    if w in busy:
                        continue
                    task = sched.next_task(sig, w)
                    if task is None:
                        break
                    wp = sched.problem_of(task)
                    cands = sorted(sched.candidates_of(task).values(), key=lambda c: c.index)
                    gen = handles[w].run.options(num_returns="streaming").remote(
                        task, wp, cands, config, workload.seed, settings.stream_interval_s)
                    now = time.perf_counter()
                    where = MeasurementContext(infos[w].properties, session_id=new_id(), host=infos[w].host,
                                               actor_id=infos[w].actor_id, round=task.round)
                    running[gen] = _Running(task, w, gen, now, now, where=where)
                    busy.add(w)
                    st = statuses[w]
                    st.state, st.problem = "busy", f"{wp.name} ({task.size}{', finalists' if task.round == FINALIST else ''})"
            if not running and not pings:
                if sched.done:
                    break
                if not any(sched.pending_tasks(s) for s in by_sig):
                    raise FarmFailed("internal error: work remains but nothing is queued or running")
                continue
            ready, _ = ray.wait(list(running) + list(pings), num_returns=1, timeout=0.05)
            for ref in [x for x in ready if x in pings]:
                w = pings.pop(ref)
                try:
                    ray.get(ref)
                    busy.discard(w)
                    statuses[w].state = "idle"
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                    pings[handles[w].info.remote()] = w  # still restarting: ask again
            for gen in [x for x in ready if x in running]:
                r = running[gen]
                try:
                    ref = next(gen)
                    item = ray.get(ref)
                except StopIteration:
                    finish(gen, r)
                    sched.on_task_end(r.task)
                    continue
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                    log.warning("farm: %s died running task %d (%s): retrying its %d unreported candidate(s)",
                                statuses[r.worker].name, r.task.id, _first_line(exc), r.task.size - len(r.reported))
                    lose(gen, r, "crash", f"worker {statuses[r.worker].name} died: {_first_line(exc)}")
                    continue
                r.last_progress = time.perf_counter()
                if isinstance(item, TaskStarted):
                    r.running = True
                    continue
                if isinstance(item, TaskEnd):
                    if r.where is not None:
                        jr.set_ranks(r.where.session_id, item.ranks)
                    if item.error:
                        log.warning("farm: task %d on %s failed: %s", r.task.id, statuses[r.worker].name, item.error)
                    unreported = {s for s in r.task.specs} - {x.spec for x in r.reported}
                    if unreported:
                        lose(gen, r, "error", item.error or "the worker reported no result")
                    continue
                r.reported.extend(item)
                write(r, item)
            now = time.perf_counter()
            for gen, r in list(running.items()):
                limit = settings.candidate_timeout_s if r.running else settings.startup_timeout_s
                if now - r.last_progress > limit:
                    name = statuses[r.worker].name
                    log.warning("farm: %s sent nothing for %.0f s on task %d; restarting it", name,
                                now - r.last_progress, r.task.id)
                    ray.kill(handles[r.worker], no_restart=False)
                    lose(gen, r, "timeout" if r.task.careful else "crash",
                         f"{name} silent for {settings.candidate_timeout_s:.0f} s")
                    if not r.task.careful:
                        statuses[r.worker].state = "restarting"
            if progress is not None and now - last_progress_call >= progress_interval_s:
                last_progress_call = now
                progress(status())
    finally:
        jr.writer.flush()
    if progress is not None:
        progress(status("done"))
    tuning = time.perf_counter() - t0
    return FarmReport(jr.run.job_id, jr.run.run_id, infos, statuses, skipped, counts, wall_s=tuning,
                      total=sched.total, remeasured=sched.remeasured, tuning_s=tuning, results=results)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
