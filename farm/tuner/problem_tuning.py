"""Tuning workload problems on one device: expand into plan specs, autotune, collect results.

This is the unit of work a farm device actor runs; ``farm tune`` without a
cluster runs it in-process, one problem after another.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from farm.devices.device import Device
from farm.devices.properties import DeviceProperties
from farm.errors import AutotuneError, FarmError
from farm.model.engine import EngineRegistry
from farm.model.plans import PlanSpec
from farm.model.problem import Problem
from farm.model.records import CALL_ORDER, AutotuneConfig, AutotuneResult, CallMode
from farm.model.workload import Workload, WorkloadProblem
from farm.tuner.autotuner import Autotuner
from farm.tuner.confirm import ConfirmRun, Measured, confirm_problem, stage_winner
from farm.tuner.watchdog import HangWatch

log = logging.getLogger("farm.tune")


@dataclass(frozen=True)
class ProblemOutcome:
    """What tuning one problem on one device produced."""

    problem: WorkloadProblem
    results: tuple[AutotuneResult, ...]
    error: str = ""  # set when the problem could not be tuned at all (no engine, every candidate failed)
    wall_ms: float = 0.0
    skipped: int = 0  # candidates measured before (resume)
    confirmations: tuple[ConfirmRun, ...] = ()  # the confirmation stage, per calling mode
    pruned: int = 0  # candidates a cost model ranked out (farm tune --prune): not measured

    @property
    def winner(self) -> AutotuneResult | None:
        return self.results[0] if self.results and self.results[0].succeeded else None


def memory_shortfall(problem: Problem, props: DeviceProperties) -> str:
    """'' when the problem's tensors fit in the device's memory, else why not (nothing is allocated to find out)."""
    need = sum(t.nbytes for t in problem.tensors)
    if props.vendor == "sim" or not props.total_memory or need <= props.total_memory:
        return ""
    return (f"its tensors need {need / 2**30:.1f} GiB; {props.name} has {props.total_memory / 2**30:.1f} GiB "
            "of memory")


def plan_specs_for(wp: WorkloadProblem, tuner: Autotuner) -> list[PlanSpec]:
    """Add the workload's candidates for this problem to ``tuner``; returns them in order.

    Engines that do not apply on the tuner's device are left out (discovery
    happens where the device is); sweeps of such engines are skipped. A problem
    that cannot fit in the device's memory raises FarmError (before any allocation).
    """
    too_big = memory_shortfall(wp.problem, tuner.device.properties)
    if too_big:
        raise FarmError(f"{wp.name}: {too_big}")
    sel = wp.engines
    configs = [c for c in tuner.engine_configs() if sel.selects(c.engine_name)]
    applicable = {c.engine_name for c in configs}
    if sel.defaults and configs:
        tuner.add_engine_configs(configs)
    sweeps = []
    for sweep in sel.sweeps:
        if str(sweep.engine) in applicable:
            sweeps.append(sweep)
        elif sel.selects(str(sweep.engine)) and str(sweep.engine) in {e.name for e in tuner.registry.for_op(wp.problem.op)}:
            # a top-level sweep meets problems of other ops too: only an engine that serves this op is news
            log.info("autotune: sweep of %s skipped for %s: not applicable on %s", sweep.engine, wp.name,
                     tuner.device.properties.name)
    if sweeps:
        tuner.add_engine_sweep(sweeps)
    return list(tuner.specs)


def tune_problem(
    wp: WorkloadProblem,
    device: Device,
    config: AutotuneConfig,
    registry: EngineRegistry,
    *,
    seed: int = 0,
    done: Iterable[PlanSpec] = (),
    listener: Callable[[AutotuneResult], None] | None = None,
    watch: HangWatch | None = None,
    prior: Sequence[Measured] = (),
    confirmed: Iterable[CallMode] = (),
    incumbent: PlanSpec | None = None,
    on_confirm: Callable[[ConfirmRun], None] | None = None,
    select: Callable[[list[PlanSpec]], Sequence[PlanSpec]] | None = None,
) -> ProblemOutcome:
    """Tune one workload problem on ``device``; never raises for a candidate's or problem's failure.

    ``done`` lists plan specs measured before (resume); they are not measured again. ``watch``
    looks for a candidate that hangs. Then the confirmation stage (farm.tuner.confirm) runs for each of
    the problem's calling modes not in ``confirmed`` (stages of an earlier run), over this run's successes
    and ``prior`` (earlier runs' successes); ``on_confirm`` receives each stage. ``select`` (a pruned tune)
    picks, from the discovered specs, those to measure.
    """
    t0 = time.perf_counter()
    tuner = Autotuner(wp.problem, device, registry=registry)
    if watch is not None:
        watch.watch(tuner)
    try:
        specs = plan_specs_for(wp, tuner)
        if not specs:
            return _no_engine(wp, device, registry, t0)
        wanted, done = set(select(list(specs))) if select is not None else None, set(done)
        todo = [s for s in specs if s not in done and (wanted is None or s in wanted)]
        results: Sequence[AutotuneResult] = ()
        error = ""
        if todo:
            try:
                results = tuner.autotune(config=config, seed=seed, listener=listener,
                                         only=todo if len(todo) < len(specs) else None)
            except AutotuneError as exc:
                results, error = exc.results, str(exc)
        tuner.close()
        measured = _measured(specs, prior, results)
        # new main-round rows make an earlier stage stale: every calling mode is confirmed again then
        left = list(wp.calls) if todo else [c for c in wp.calls if c not in set(confirmed)]
        runs = confirm_problem(wp.problem, device, registry, config, left, measured, incumbent=incumbent, seed=seed,
                               watch=watch, by_host=wp.host_bound)
        for run in runs:
            if on_confirm is not None:
                on_confirm(run)
        if runs:
            results = _ranked_by_stages(results, runs, measured, incumbent)
        pruned = len(specs) - len(wanted) if wanted is not None else 0
        return ProblemOutcome(wp, tuple(results), error, (time.perf_counter() - t0) * 1e3,
                              len(specs) - len(todo) - pruned, tuple(runs), pruned)
    except FarmError as exc:
        return ProblemOutcome(wp, (), str(exc), (time.perf_counter() - t0) * 1e3)
    finally:
        tuner.close()


def _no_engine(wp: WorkloadProblem, device: Device, registry: EngineRegistry, t0: float) -> ProblemOutcome:
    reasons = "; ".join(f"{c.engine_name}: {c.reason}" for c in registry.explain(wp.problem, device)
                        if wp.engines.selects(c.engine_name)) or "no engine implements this op"
    return ProblemOutcome(wp, (), f"no applicable engine ({reasons})", (time.perf_counter() - t0) * 1e3)


def _measured(specs: Sequence[PlanSpec], prior: Sequence[Measured], results: Sequence[AutotuneResult]
              ) -> list[Measured]:
    """What the confirmation stage chooses its participants from: earlier runs' successes (``prior``) not measured
    again, and this run's."""
    index = {s: i for i, s in enumerate(specs)}
    session = f"run:{id(results)}"
    fresh = {r.spec for r in results}
    return [*(dataclasses.replace(m, index=index[m.spec]) for m in prior if m.spec in index and m.spec not in fresh),
            *(Measured(r.spec, index.get(r.spec, r.candidate), session, r.median_ms, r.mad_ms or 0.0)
              for r in results if r.succeeded and r.median_ms is not None)]


def _ranked_by_stages(results: Sequence[AutotuneResult], runs: Sequence[ConfirmRun], measured: Sequence[Measured],
                      incumbent: PlanSpec | None) -> list[AutotuneResult]:
    """The main round's rows ranked as published: the primary calling mode's stage winner first (as the reducer
    reads it, CALL_ORDER), a candidate that failed in a stage never first, whatever its main-round time."""
    defaults = [m for m in measured if not m.spec.knobs]
    default = min(defaults, key=lambda m: m.index).spec if defaults else None
    primary = min(runs, key=lambda r: CALL_ORDER[r.call.value])
    first = stage_winner(primary, default=default, incumbent=incumbent)
    dropped = {r.spec for run in runs for r in run.results if not r.succeeded}
    ok = sorted((r for r in results if r.succeeded), key=lambda r: (r.spec in dropped, r.spec != first, r.rank))
    return [dataclasses.replace(r, rank=i) for i, r in enumerate(ok)] + [r for r in results if not r.succeeded]


def tune_workload(
    workload: Workload,
    device: Device,
    registry: EngineRegistry,
    *,
    on_problem: Callable[[ProblemOutcome], None] | None = None,
    config: AutotuneConfig | None = None,
) -> list[ProblemOutcome]:
    """Every problem of ``workload`` on one device, in order (the in-process path)."""
    outcomes = []
    for wp in workload.problems:
        outcome = tune_problem(wp, device, config or workload.autotune, registry, seed=workload.seed)
        outcomes.append(outcome)
        if on_problem is not None:
            on_problem(outcome)
    return outcomes
