"""The device worker: what runs inside one Ray actor per device, and the records it streams to the driver.

A worker opens its device, discovers candidates where the signature lives (``expand``), and tunes the
tasks the driver gives it with the in-process autotuner, streaming TaskStarted, batches of results and
TaskEnd. It knows nothing of scheduling.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from farm.devices.device import Device
from farm.devices.open import open_device
from farm.devices.properties import DeviceProperties
from farm.devices.runtimes.base import RuntimeUnavailable
from farm.devices.sim import SimConfig, SimGroup, sim_device
from farm.errors import AutotuneError, FarmError
from farm.fleet.tasks import CONFIRM, FINALIST, Candidate, Task
from farm.model.plans import PlanSpec
from farm.model.engine import EngineRegistry, default_engine_registry
from farm.model.records import AutotuneConfig, AutotuneResult, CallMode
from farm.model.workload import WorkloadProblem
from farm.store.results import MeasurementContext, ResultWriter, RunContext, new_id, result_row
from farm.model.plans import candidate_key
from farm.tuner.autotuner import Autotuner
from farm.tuner.judging.confirm import run_confirmation
from farm.tuner.interrupts import ENGINE_ERRORS
from farm.tuner.phases import COMPILE, DISCOVER, MEASURE, SETUP, PhaseClock, PhaseSplit
from farm.tuner.phases import CONFIRM as PHASE_CONFIRM
from farm.tuner.problem_tuning import plan_specs_for
from farm.tuner.watchdog import HangWatch

log = logging.getLogger("farm.fleet.on_ray.worker")


class WorkerFailed(FarmError, RuntimeError):
    """A worker could not open its device."""


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    actor_id: str
    node_id: str
    host: str
    pid: int
    properties: DeviceProperties
    gpu_ids: tuple[str, ...] = ()
    niceness: int = 0  # the worker process's scheduling priority (the driver's, so it measures as production runs)

    @property
    def signature(self) -> str:
        return self.properties.signature


@dataclass(frozen=True)
class TaskStarted:
    """The first item a worker streams for a task: the task is running on the device now."""

    pid: int


@dataclass(frozen=True)
class TaskEnd:
    """The last item a worker streams for a task (``parts``: the results files it wrote, with their rows)."""

    session: str
    ranks: dict[str, int]
    error: str = ""
    wall_ms: float = 0.0
    parts: tuple[tuple[str, int], ...] = ()
    phases: PhaseSplit = PhaseSplit()  # the worker's time since its last report, by phase (this task and discovery)


@dataclass(frozen=True)
class PartSink:
    """Where a worker writes the rows of its tasks itself (shared storage: a ``pyarrow.fs`` URI or a mount)
    instead of streaming them to the driver. The driver then gets results without their samples: what
    scheduling needs."""

    results: str  # the results folder's location
    run: RunContext
    part_interval_s: float = 1.0  # results are held until their rows are in a part: at most this long


class _TaskRows:
    """The rows of one task: appended as results arrive, flushed into parts before the results are reported
    (a result the driver has seen is on the shared storage), the session's ranks set before the last flush."""

    def __init__(self, writer: ResultWriter, sink: PartSink, wp: WorkloadProblem, where: MeasurementContext) -> None:
        self.writer, self.sink, self.wp, self.where = writer, sink, wp, where
        self.held: list[AutotuneResult] = []
        self.first_file = len(writer.files_written)
        self.last = time.perf_counter()

    def add(self, results: Sequence[AutotuneResult]) -> None:
        self.writer.append(result_row(r, self.wp.problem, self.wp.name, self.sink.run, self.where) for r in results)
        self.held.extend(results)

    def due(self, careful: bool) -> bool:
        return bool(self.held) and (careful or time.perf_counter() - self.last >= self.sink.part_interval_s)

    def release(self, ranks: dict[str, int] | None = None) -> list[AutotuneResult]:
        """Flush (ranks first, at the task's end); the held results, slimmed, to report now."""
        if ranks:
            self.writer.set_ranks(self.where.session_id, ranks)
        self.writer.flush()
        self.last = time.perf_counter()
        out, self.held = [dataclasses.replace(r, samples=()) for r in self.held], []
        return out

    def parts(self) -> tuple[tuple[str, int], ...]:
        return tuple((p, n) for p, n in self.writer.part_rows[self.first_file:])


class _ProblemName(logging.Filter):
    """Puts the name of the problem this worker is tuning into its log records (``%(problem)s``)."""

    def __init__(self) -> None:
        super().__init__()
        self.name_now = ""

    def filter(self, record: logging.LogRecord) -> bool:
        record.problem = f"{self.name_now}: " if self.name_now else ""
        return True


def _worker_logging(level: int) -> _ProblemName:
    """farm.* lines of this worker process, at ``level``, each naming the problem (Ray forwards them to the driver)."""
    names = _ProblemName()
    handler = logging.StreamHandler()
    handler.addFilter(names)
    handler.setFormatter(logging.Formatter("%(levelname)s %(problem)s%(message)s"))
    root = logging.getLogger("farm")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return names


class DeviceWorkerImpl:
    """Holds one device, its runtime handle, properties and signature; tunes tasks on it."""

    def __init__(self, kind: str, slot: int, sim: SimConfig | None = None,
                 problems: Sequence[WorkloadProblem] = (), registry: EngineRegistry | None = None,
                 cpu_threads: int | None = None, log_level: int = logging.WARNING,
                 sim_group: SimGroup | None = None) -> None:
        self._log_names = _worker_logging(log_level)
        self.kind = kind
        from farm.tuner.interrupts import SIGINTS

        SIGINTS.install()  # an engine's KeyboardInterrupt fails its candidate, not the task (where a handler can go)
        wanted = os.environ.get("RAY_worker_niceness")
        if wanted is not None and wanted.lstrip("-").isdigit() and os.nice(0) > int(wanted):
            log.warning("farm: this worker runs at niceness %d, below the driver's priority (%s): on a busy machine "
                        "its measurements are slower than production's", os.nice(0), wanted)
        if kind == "cpu":
            # Ray starts an actor with OMP_NUM_THREADS=1; production runs with the host's threads, so
            # measure with those (the count is part of the CPU's device signature: compute_units)
            from farm.devices.runtimes.cpu import usable_cores, set_blas_threads

            set_blas_threads(cpu_threads or usable_cores())
        self.registry = registry or default_engine_registry()
        self.phases = PhaseClock()
        # before the device opens (torch's import, CUDA's start: seconds), so a compile pool's
        # processes start alongside it rather than during this worker's first task
        self.prepare(problems)
        self._attach(_open(kind, slot, sim, sim_group))

    def _attach(self, device: Device) -> None:
        self.device = device
        self.name = f"{self.kind}:{device.properties.index}"
        self._part_writer: ResultWriter | None = None  # with shared storage: this worker's writer for the run
        self._writer_key: tuple[str, str] | None = None
        self.watch: HangWatch | None = None  # in-process: the hang watch and crash journal see each task's tuner
        self.in_process = False

    @classmethod
    def in_process_on(cls, device: Device, registry: EngineRegistry, watch: HangWatch | None = None
                      ) -> "DeviceWorkerImpl":
        """The worker of ``farm tune --in-process``: this process's device, logging and signal handling as they
        are (a Ray worker's process is its own; this one is the caller's)."""
        self = cls.__new__(cls)
        self._log_names = _ProblemName()
        self.kind = "gpu" if device.vendor in ("nvidia", "amd") else device.vendor
        self.registry, self.phases = registry, PhaseClock()
        self._attach(device)
        self.name = f"in-process:{device.properties.index}"
        self.watch, self.in_process = watch, True
        return self

    def info(self) -> WorkerInfo:
        if self.in_process:
            return WorkerInfo(self.name, "", "", socket.gethostname(), os.getpid(), self.device.properties)
        import ray

        ctx = ray.get_runtime_context()
        return WorkerInfo(self.name, ctx.get_actor_id() or "", ctx.get_node_id(), socket.gethostname(), os.getpid(),
                          self.device.properties, tuple(str(g) for g in ray.get_gpu_ids()), os.nice(0))

    def expand(self, problems: Sequence[tuple[int, WorkloadProblem]]) -> dict[int, list[Candidate] | str]:
        """Discovery where the signature lives: each problem's candidates here, or why there are none."""
        with self.phases.phase(DISCOVER):
            out = expand_problems(problems, self.device, self.registry)
            self._prepare(c.engine_name for cands in out.values() if not isinstance(cands, str) for c in cands)
        return out

    def take_phases(self) -> PhaseSplit:
        """The time by phase since the last report (what no TaskEnd carried: discovery after the last task)."""
        return self.phases.take()

    def prepare(self, problems: Sequence[WorkloadProblem]) -> None:
        """Start what the engines the workload selects want for their compiles (the worker does this
        as it starts, with the workload's problems)."""
        self._prepare(e.name for e in self.registry if any(wp.engines.selects(e.name) for wp in problems))

    def _prepare(self, engine_names: Iterable[str]) -> None:
        """Let engines the tasks will use start what their compiles want on this kind of device
        (Triton's compile pool) in the background: a worker tunes many problems, so it pays once. Idempotent."""
        self.registry.prepare(engine_names, self.kind)

    def run(self, task: Task, wp: WorkloadProblem, candidates: Sequence[Candidate], config: AutotuneConfig,
            seed: int, stream_interval_s: float, sink: PartSink | None = None,
            where: MeasurementContext | None = None) -> Iterator[TaskStarted | list[AutotuneResult] | TaskEnd]:
        """Tune the task's candidates; stream TaskStarted, results (each alone in careful mode), then TaskEnd.
        With ``sink`` the worker writes the rows (measured ``where``) and reports each result once its row
        is in a part."""
        yield TaskStarted(os.getpid())
        rows = _TaskRows(self._writer(sink), sink, wp, where) if sink is not None and where is not None else None
        self._log_names.name_now = wp.name
        t0 = time.perf_counter()
        before = {p: self.phases.seconds(p) for p in (COMPILE, MEASURE, PHASE_CONFIRM)}
        self._prepare(c.engine_name for c in candidates)  # discovery ran on one worker of the signature only
        index = {c.spec: c.index for c in candidates}
        items: queue.Queue = queue.Queue()
        session = new_id()
        sim = self.device.extras.get("sim")
        compiles = self.device.vendor in ("nvidia", "amd") or (sim is not None and sim.compile.active)
        if compiles and config.compile_workers == 0:
            config = dataclasses.replace(config, compile_workers=2)  # keep the GPU busy while JIT engines compile

        work = _TaskWork(self, task, wp, index, config, seed, items, session, t0)
        thread = threading.Thread(target=work.run, name=f"farm-task-{task.id}", daemon=True)
        thread.start()
        yield from self._stream(task, items, thread, rows, index, stream_interval_s, before, t0)

    def _stream(self, task: Task, items: queue.Queue, thread: threading.Thread, rows: "_TaskRows | None",
                index: dict[PlanSpec, int], stream_interval_s: float, before: dict[str, float], t0: float
                ) -> Iterator[list[AutotuneResult] | TaskEnd]:
        """The task's rows as its thread measures them (each alone in careful mode), then its TaskEnd."""
        batch: list[AutotuneResult] = []
        last = time.perf_counter()
        while True:
            try:
                # a stage streams nothing until its end: no need to wake this thread (and take the GIL from
                # the timed rounds) every stream interval
                item = items.get(timeout=1.0 if task.round == CONFIRM else stream_interval_s)
            except queue.Empty:
                if not thread.is_alive() and items.empty():  # it ended past every handler: say so, not hang
                    items.put(TaskEnd("", {}, "the task's thread ended without finishing it", 0.0))
                    continue
                if task.round == CONFIRM:
                    continue  # a stage's rows go together (a part of one is no stage)
                # nothing new: send what is measured now, so a candidate that hangs next costs only itself
                if rows is not None and rows.due(False):
                    yield rows.release()
                    continue
                if batch:
                    yield batch
                    batch, last = [], time.perf_counter()
                continue
            if isinstance(item, TaskEnd):
                thread.join()
                item = dataclasses.replace(item, phases=self._task_phases(task, before, t0))
                if rows is not None:
                    rows.add(batch)
                    batch = rows.release(item.ranks)
                    item = dataclasses.replace(item, parts=rows.parts())
                if batch:
                    yield batch
                self._check_health()
                yield item
                return
            batch.append(dataclasses.replace(item, candidate=index.get(item.spec, item.candidate)))
            if task.round == CONFIRM:
                continue
            if rows is not None:
                rows.add(batch)
                batch = rows.release() if rows.due(task.careful) else []
                if batch:
                    yield batch
                    batch, last = [], time.perf_counter()
            elif task.careful or time.perf_counter() - last >= stream_interval_s:
                yield batch
                batch, last = [], time.perf_counter()

    def _task_phases(self, task: Task, before: dict[str, float], t0: float) -> PhaseSplit:
        """The worker's phases since its last report, this task's setup (what its compiles, measurements and
        stage left of its wall time) added; a finalist round's measurements count as re-measuring."""
        spent = {p: self.phases.seconds(p) - s for p, s in before.items()}
        self.phases.add(SETUP, time.perf_counter() - t0 - sum(spent.values()))
        split = self.phases.take()
        if task.round == FINALIST:
            d = dict(split.seconds)
            d[PHASE_CONFIRM] = d.get(PHASE_CONFIRM, 0.0) + d.pop(MEASURE, 0.0)
            split = PhaseSplit.of(d)
        return split

    def _writer(self, sink: PartSink) -> ResultWriter:
        """This worker's writer into the run's results (one per run; its part names are its own)."""
        key = (sink.results, sink.run.run_id)
        if self._part_writer is None or self._writer_key != key:
            # flushed by the task loop only: a result is reported once its row is written
            self._part_writer = ResultWriter(sink.results, sink.run.run_id, flush_rows=1 << 30,
                                             flush_seconds=float("inf"), name=new_id()[:8])
            self._writer_key = key
        return self._part_writer

    def _check_health(self) -> None:
        """A device left in an error state (a lost CUDA context) poisons every later task: restart (in-process:
        the run fails; the same command resumes it)."""
        try:
            self.device.synchronize()
        except Exception as exc:
            if self.in_process:
                raise WorkerFailed(f"{self.name} is unusable after a task: {exc}") from None
            log.error("farm: %s is unusable after a task (%s); restarting the worker", self.name, exc)
            os._exit(3)

    def with_device(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(device, *args, **kwargs)`` on this worker's device (farm tune's verification runs so)."""
        return fn(self.device, *args, **kwargs)

    def close(self) -> None:
        self.device.runtime.synchronize()


def expand_problems(problems: Sequence[tuple[int, WorkloadProblem]], device: Device,
                    registry: EngineRegistry) -> dict[int, list[Candidate] | str]:
    """Each problem's candidates on ``device``, or why there are none."""
    out: dict[int, list[Candidate] | str] = {}
    for index, wp in problems:
        tuner = Autotuner(wp.problem, device, registry=registry)
        try:
            specs = plan_specs_for(wp, tuner)
        except FarmError as exc:
            out[index] = str(exc)
            continue
        if not specs:
            reasons = "; ".join(f"{c.engine_name}: {c.reason}" for c in registry.explain(wp.problem, device)
                                if wp.engines.selects(c.engine_name)) or "no engine implements this op"
            out[index] = f"no applicable engine ({reasons})"
            continue
        cands = []
        for i, s in enumerate(specs):
            engine = registry.get(s.engine_id)
            cands.append(Candidate(s, engine.name, i, bool(engine.supports_exhaustive),
                                   tuner._collection.estimated_workspace(s)))
        out[index] = cands
    return out


def _open(kind: str, slot: int, sim: SimConfig | None, sim_group: SimGroup | None = None) -> Device:
    """The worker's device: a GPU Ray assigned, the CPU, or a simulated one (``slot`` of the config's devices, or
    one of kind ``sim_group`` numbered ``slot`` when a node carries it)."""
    if kind == "sim" and sim is not None and sim_group is not None:
        return sim_device(sim, sim_group, slot)
    if kind in ("sim", "cpu"):
        return open_device(kind, slot, sim=sim)
    import ray

    ids = ray.get_gpu_ids()  # Ray made the assigned GPU the only visible one: index 0 here
    try:
        return open_device("gpu", 0, physical_index=int(ids[0]) if ids and str(ids[0]).isdigit() else None)
    except RuntimeUnavailable as exc:
        raise WorkerFailed(f"a GPU worker found no GPU: {exc}") from None


class _TaskWork:
    """What a task's thread runs: the main (or finalist) round of its candidates, or its confirmation stage; every
    row onto ``items``, then a TaskEnd."""

    def __init__(self, worker: "DeviceWorkerImpl", task: Task, wp: WorkloadProblem, index: dict[PlanSpec, int],
                 config: AutotuneConfig, seed: int, items: queue.Queue, session: str, t0: float) -> None:
        self.worker, self.task, self.wp, self.index, self.config, self.seed = worker, task, wp, index, config, seed
        self.items, self.session, self.t0 = items, session, t0

    def run(self) -> None:
        if self.task.round == CONFIRM:
            self.confirm()
            return
        w, items = self.worker, self.items
        tuner = Autotuner(self.wp.problem, w.device, registry=w.registry)
        if w.watch is not None:
            w.watch.watch(tuner)
        error = ""
        ranked: list[AutotuneResult] = []
        try:
            for spec in self.task.specs:
                tuner.add_engine(spec.engine_id, dict(spec.knobs))
            # the engines were prepared as the worker started and for this task's candidates
            ranked = tuner.autotune(config=self.config, seed=self.seed, listener=items.put, phases=w.phases,
                                    prepare=False)
        except AutotuneError as exc:
            ranked, error = exc.results, "" if exc.results else str(exc)
        except ENGINE_ERRORS as exc:  # an engine bug (SystemExit included) must not end the task silently
            error = f"{type(exc).__name__}: {exc}"
        finally:
            tuner.close()
        ranks = {candidate_key(r.engine_id, r.knobs): r.rank for r in ranked}
        items.put(TaskEnd(self.session, ranks, error, (time.perf_counter() - self.t0) * 1e3))

    def confirm(self) -> None:
        """The confirmation stage (farm.tuner.judging.confirm): its rows all come at its end (paired samples)."""
        task, w, error = self.task, self.worker, ""
        try:
            run = run_confirmation(self.wp.problem, w.device, w.registry, [(s, self.index[s]) for s in task.specs],
                                   reference=task.reference, incumbent=task.incumbent, call=CallMode(task.call),
                                   config=self.config, seed=self.seed, phases=w.phases, probe=task.probe,
                                   by_host=self.wp.host_bound, watch=w.watch)
            for r in run.results:
                if not (task.probe and r.succeeded):  # a probe's measurement is no stage's: only a failure counts
                    self.items.put(r)
        except ENGINE_ERRORS as exc:  # an engine bug must not end the task silently
            error = f"{type(exc).__name__}: {exc}"
        self.items.put(TaskEnd(self.session, {}, error, (time.perf_counter() - self.t0) * 1e3))
