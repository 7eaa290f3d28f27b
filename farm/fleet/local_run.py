"""The in-process executor: ``farm tune --in-process`` tunes every problem on one device of this process into a job
folder (farm.fleet.job.JobRun) through the Ray farm's own planner, scheduler and driver with one worker in this
process (farm.fleet.local_loop): the same rounds, confirmation stages and rows as on Ray. What only a process of
one's own needs is here: a hang watch that records a stuck candidate (the process is then restarted: a thread
cannot be taken back), and a journal that quarantines a candidate that ended the process twice."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

from farm.devices.device import Device
from farm.errors import FarmError
from farm.model.engine import EngineRegistry
from farm.model.records import AutotuneConfig, AutotuneResult
from farm.model.workload import Workload
from farm.store.results import MeasurementContext, now_iso
from farm.model.plans import spec_of
from farm.fleet.driver import Driver
from farm.fleet.on_ray.event_loop import worker_handle
from farm.fleet.executor import InProcessCalls, StartedJob, finish_job, start_job, verify_on_workers
from farm.fleet.job import JobRun
from farm.fleet.local_loop import LocalLoop
from farm.fleet.options import FarmOptions
from farm.fleet.planner import Planner
from farm.fleet.report import TuneReport
from farm.fleet.tasks import CONFIRM
from farm.fleet.scheduler import Scheduler
from farm.fleet.on_ray.worker import DeviceWorkerImpl
from farm.tuner.journal import InFlightJournal
from farm.tuner.problem_tuning import ProblemOutcome
from farm.tuner.watchdog import HangWatch

log = logging.getLogger("farm.fleet.local_run")

JOURNAL = ".in-flight"  # farm.tuner.journal's file in an in-process run's output folder
ONE_SHARD = 1 << 30  # one device: a problem is not split into shards (they spread a problem over devices)


def run_local(
    workload: Workload,
    out: str | Path,
    device: Device,
    registry: EngineRegistry,
    *,
    options: FarmOptions | None = None,
    config: AutotuneConfig | None = None,
    on_problem: Callable[[ProblemOutcome], None] | None = None,
    on_hang: Callable[[str], None] | None = None,
) -> TuneReport:
    """Tune every problem on one in-process device into ``out``; resume what is there.

    ``options``: the tune's settings, as the Ray farm reads them (farm.fleet.options.FarmOptions; None: the
    defaults, and no candidate timeout). Of them this executor reads ``reduce`` and ``top_k``; ``incumbents``
    (an override file or published root whose winners are kept within noise) and ``check_decided`` (a problem
    they decide has its winner and the default measured, nothing else); ``candidate_timeout_s``: a candidate
    compiling or measured for longer gets a ``timed_out`` row (written at once, with every row before it), then
    ``on_hang(message)`` is called from the watch's thread: the process cannot take the candidate back, so the
    caller ends or restarts it, and a resume goes on after the candidate; ``verifier(device, override file text,
    problem keys)``: after the reduce, the decisions are replayed beside the direct call on ``device``
    (farm.replay.verify.verify_for_job).
    """
    candidate_timeout_s = options.candidate_timeout_s if options is not None else None
    options = options or FarmOptions()
    job = start_job(workload, out, options, config, {"executor": "in-process", "device": device.signature},
                    timeout_s=candidate_timeout_s)
    jr, config = job.run, job.config
    journal = InFlightJournal(jr.job.root / JOURNAL) if not jr.job.remote else None
    if journal is not None:
        _after_an_unfinished_run(jr, journal, workload, device, registry, config)
    current: dict[str, Any] = {}  # the task running, for the hang watch
    watch = _hang_watch(jr, current, config, candidate_timeout_s, on_hang, journal) \
        if candidate_timeout_s or journal is not None else None
    worker = DeviceWorkerImpl.in_process_on(device, registry, watch)
    try:
        report = _tune(job, workload, worker, options, current, on_problem)
    except BaseException as exc:
        jr.fail(exc)
        raise
    finally:
        if watch is not None:
            watch.close()
        if journal is not None:  # this run ended in Python (finished, an error, a Ctrl-C): nothing to attribute
            journal.settle(None)
            journal.close()
    verify = verify_on_workers(report.handles, InProcessCalls(), options.verifier) if options.verifier else None
    report.summary = finish_job(job, options, verify, device=device.properties.to_dict())
    report.pruning = job.pruning.record() if job.pruning else None
    report.reduce, report.wall_s = report.summary.reduce, report.summary.wall_s
    return report


def _tune(job: StartedJob, workload: Workload, worker: DeviceWorkerImpl, settings: FarmOptions,
          current: dict[str, Any], on_problem: Callable[[ProblemOutcome], None] | None) -> TuneReport:
    """The Ray farm's planning, scheduling and driving, with ``worker`` the only device."""
    jr, config = job.run, job.config
    handle = worker_handle(0, worker.info(), worker)
    options = dataclasses.replace(settings, shard_size=ONE_SHARD, keep_results=True)
    sched = Scheduler(shard_size=options.shard_size, finalist_k=options.finalist_k, max_strikes=options.max_strikes,
                      confirm=config.confirm)
    planner = Planner(workload, jr, sched, [handle], InProcessCalls(), settings.incumbents, job.pruning)
    driver = Driver(sched, [handle], jr, config, options, planner=planner)
    try:
        outcomes = LocalLoop(driver, planner, worker, workload, config, current, jr.writer.flush, on_problem).run()
    finally:
        jr.writer.flush()
    tuning = time.perf_counter() - driver.t0
    return TuneReport(jr.run.job_id, jr.run.run_id, [handle.info], [handle.status], planner.skipped, jr.counts,
                      wall_s=tuning, total=sched.total, remeasured=sched.remeasured, tuning_s=tuning,
                      results=driver.results, confirmations=driver.confirmations, handles=[handle],
                      outcomes=outcomes)


def _hang_watch(jr: JobRun, current: dict[str, Any], config: AutotuneConfig, timeout_s: float | None,
                on_hang: Callable[[str], None] | None, journal: InFlightJournal | None = None) -> HangWatch:
    """A watch that records a stuck candidate as timed out (with every row before it) and ends the run's record;
    with ``journal``, it keeps the candidates in flight there."""

    def hung(tuner: Any, spec: Any, seconds: float) -> None:
        row = _timed_out_row(tuner, spec, seconds, config, current.get("index", {}).get(spec, -1))
        where = current["where"]
        stage = getattr(tuner.in_flight, "stage", "")
        if stage:  # in a confirmation stage: a failed row of the stage (no session size: no stage ran)
            where = MeasurementContext(where.device, round=CONFIRM, call=stage)
            row = dataclasses.replace(row, error=f"confirmation ({stage}): {row.error}")
        jr.write([(row, current["wp"], where)])
        jr.writer.flush()
        if journal is not None:
            journal.settle(None)  # recorded: the restart has nothing to attribute
        message = (f"{current['wp'].name}: {row.engine_name} {dict(spec.knobs)} hung for {seconds:.0f} s "
                   f"{'in the confirmation stage ' if stage else ''}"
                   f"(candidate timeout {timeout_s:g} s); recorded as timed_out")
        jr.job.finish(jr.record, jr.run, state="failed", error=message, rows_written=jr.writer.rows_written)
        if on_hang is not None:
            on_hang(message)

    return HangWatch(timeout_s or None, hung, journal)


def _after_an_unfinished_run(jr: JobRun, journal: InFlightJournal, workload: Workload, device: Device,
                             registry: EngineRegistry, config: AutotuneConfig) -> None:
    """The last in-process run into this folder ended without finishing (a native crash of a candidate, or the
    process killed) while one candidate ran: the first time it runs again (a kill names nobody), the second time
    in a row it gets a ``crashed`` row (of the stage it was in), and the run goes on after it."""
    from farm.model.records import Disposition
    from farm.tuner.autotuner import Autotuner
    from farm.tuner.problem_tuning import plan_specs_for

    now, suspect = journal.read()
    wp = next((w for w in workload.problems if now is not None and w.problem.key == now.problem_key), None)
    if now is None or wp is None or len(now.candidates) != 1:
        journal.settle(None)
        return
    spec = spec_of(now.candidates[0])
    engine = registry.get(spec.engine_id) if spec is not None else None
    where = f"{' confirmation stage (' + now.stage + ')' if now.stage else ' main round'}"
    label = f"{engine.name if engine else now.candidates[0]} {dict(spec.knobs) if spec else ''}".strip()
    if spec is None or engine is None or suspect != now:
        log.warning("farm: the last run into this folder ended while %s ran in the%s of %s (a native crash, or the "
                    "process was killed); it runs again, and is recorded as crashed if the run ends so again",
                    label, where, wp.name)
        journal.settle(now)
        return
    tuner = Autotuner(wp.problem, device, registry=registry)
    try:
        specs = plan_specs_for(wp, tuner)
    except FarmError:
        specs = []
    finally:
        tuner.close()
    stage = f"confirmation ({now.stage}): " if now.stage else ""
    row = AutotuneResult(
        problem_key=wp.problem.key, engine_id=spec.engine_id, engine_name=engine.name, knobs=spec.knobs,
        disposition=Disposition.CRASHED, mode=config.mode, strategy=config.strategy,
        candidate=specs.index(spec) if spec in specs else -1,
        error=f"{stage}the process ended while it ran, in two runs in a row (a native crash: in-process, nothing "
              "survives it to say more); quarantined", started_at=now_iso())
    context = MeasurementContext(device.properties, round=CONFIRM if now.stage else "main", call=now.stage)
    jr.write([(row, wp, context)])
    jr.writer.flush()
    log.warning("farm: %s ended the process twice in the%s of %s: recorded as crashed; the run goes on without it",
                label, where, wp.name)
    journal.settle(None)


def _timed_out_row(tuner: Any, spec: Any, seconds: float, config: AutotuneConfig, candidate: int) -> AutotuneResult:
    from farm.model.records import Disposition

    engine = tuner.registry.get(spec.engine_id)
    return AutotuneResult(
        problem_key=tuner.problem.key, engine_id=spec.engine_id, engine_name=engine.name if engine else "?",
        knobs=spec.knobs, disposition=Disposition.TIMED_OUT, mode=config.mode, strategy=config.strategy,
        candidate=candidate,
        error=f"no result within the candidate timeout ({seconds:.0f} s in-process); the run was restarted",
        started_at=now_iso())
