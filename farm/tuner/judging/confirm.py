"""The confirmation stage: the leader, the default, the incumbent and the leader's near rivals re-measured
together, in rounds, before a winner is published.

Every round times each participant once, in a fresh random order, on one device, so drift and contention
hit them all alike; the samples are paired by round (farm.tuner.judging.paired). The rounds stop when the paired
test separates the leader from the default at 99 % (or shows that nothing can beat the default by the
margin), or when the budget ends. The decision itself is farm.tuner.judging.winner.decide_confirmed, which the
reducer runs on the stage's rows, so every surface shows it.

What a sample times depends on how production calls the op (``CallMode``):

* ``eager``: back-to-back calls through the path replay runs (the plan's ``produce`` when it has one and
  needs no workspace, else a fresh output and ``run``), on the caller's stream, with device events and no
  lead before them: a call's launch cost is in its time when the host cannot keep ahead of the device.
* ``graph``: replays of a captured device graph of the calls (device time; no launch cost), as
  ``graph_repeats`` times the main round.

Both executors run it (farm.fleet.job in-process, a ``confirm`` task on a Ray worker).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from farm.devices.arrays import make_tensors
from farm.devices.device import Device, eager_device
from farm.devices.timing import Timer, timed_section
from farm.model.engine import EngineRegistry
from farm.model.measurement import summarize, usable_time
from farm.model.plans import PlanSpec
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig, AutotuneResult, CallMode, ConfirmSettings, Disposition
from farm.tuner.callers import (Caller, calls_per_sample, estimate_ms, eager_sampler, graph_sampler,
                                input_set_count, input_sets, participant_caller)
from farm.tuner.candidate import CandidateRun, close_plan, error_text, started_iso
from farm.tuner.interrupts import reraise_user_interrupt
from farm.tuner.interrupts import ENGINE_ERRORS
from farm.tuner.judging.paired import CONFIDENCE, min_rounds
from farm.tuner.phases import COMPILE, CONFIRM, PhaseClock, timed
from farm.tuner.watchdog import HangWatch
from farm.tuner.judging.winner import NOISE_SIGMAS, RELATIVE_FLOOR, decide_confirmed, noise_sigma

log = logging.getLogger("farm.tuner.autotuner")  # the tuner's lines

GRAPH_REPEATS = 20  # calls per captured graph when the workload's graph_repeats is 0
MAX_CALLS_PER_SAMPLE = 4096
GPU_SAMPLE_MS = 2.0  # an eager sample on a GPU (device events): a hundred microsecond calls or more, so the
# sample's fixed cost (its first launch) is a percent or less of it
DEVICE_SAMPLE_MS = 1.0  # on other devices with a clock of their own (simulated: virtual time, each call real Python)
CPU_SAMPLE_MS = 10.0  # on a CPU: several scheduler periods, so a busy machine's preemptions average out


@dataclass(frozen=True)
class Measured:
    """A candidate's main-round result, as the stage's choice of participants reads it."""

    spec: PlanSpec
    index: int  # discovery order
    session: str
    median_ms: float
    mad_ms: float = 0.0


def participants(measured: Sequence[Measured], *, default: PlanSpec | None, incumbent: PlanSpec | None,
                 max_candidates: int, runners_up: int = 0, engine_leaders: bool = False) -> tuple[PlanSpec, ...]:
    """Who is re-measured: each session's leader, its next ``runners_up`` fastest and every candidate within its
    noise band, the default and the incumbent, at most ``max_candidates`` (the leaders, the default and the
    incumbent first, then the nearest to their session's leader). ``engine_leaders``: every engine's fastest
    too (an eager stage: engines differ in host cost a call, which a main round of device time does not see).
    Empty when there is nothing to compare."""
    by_session: dict[str, list[Measured]] = {}
    for m in measured:
        if m.median_ms is not None and math.isfinite(m.median_ms) and m.median_ms > 0:
            by_session.setdefault(m.session, []).append(m)
    ranked: list[tuple[float, int, PlanSpec]] = []  # (median over its session leader's, index, spec) of the band
    leaders: list[PlanSpec] = []
    for rows in by_session.values():
        rows.sort(key=lambda m: (m.median_ms, m.index))
        lead = rows[0]
        leaders.append(lead.spec)
        sig = noise_sigma(np.array([lead.mad_ms] + [m.mad_ms for m in rows]))
        for place, (m, s) in enumerate(zip(rows, sig[1:])):
            band = NOISE_SIGMAS * math.sqrt(sig[0] ** 2 + s ** 2) + RELATIVE_FLOOR * lead.median_ms
            # one main-round median on a busy machine can be far off: the next few are looked at again anyway
            if m.median_ms - lead.median_ms <= band or place <= runners_up:
                ranked.append((m.median_ms / lead.median_ms if lead.median_ms else 1.0, m.index, m.spec))
    present = {m.spec for m in measured}
    best_of: dict[int, Measured] = {}
    if engine_leaders:
        for m in sorted(measured, key=lambda m: (m.median_ms, m.index)):
            best_of.setdefault(m.spec.engine_id, m)
    must = [s for s in (*sorted(set(leaders), key=lambda s: leaders.index(s)), default, incumbent,
                        *(m.spec for m in best_of.values()))
            if s is not None and s in present]
    chosen = list(dict.fromkeys(must))
    for _, _, spec in sorted(ranked):
        if len(chosen) >= max(max_candidates, len(must)):
            break
        if spec not in chosen:
            chosen.append(spec)
    index = {m.spec: m.index for m in measured}
    return tuple(sorted(chosen, key=lambda s: index[s])) if len(chosen) > 1 else ()


@dataclass(frozen=True)
class ConfirmRun:
    """One stage: a result per participant (samples in round order), and how it ended."""

    call: CallMode
    results: tuple[AutotuneResult, ...]
    rounds: int
    settled: bool
    wall_ms: float

    @staticmethod
    def of(call: str, results: Sequence[AutotuneResult]) -> "ConfirmRun":
        """A stage rebuilt from its rows (what a farm worker streamed)."""
        ok = [r for r in results if r.succeeded]
        return ConfirmRun(CallMode(call), tuple(results), max((r.iterations for r in ok), default=0),
                          any(r.converged for r in ok), sum(r.tuning_ms for r in results))


def _looks(max_rounds: int) -> tuple[list[int], float]:
    """The round counts at which the stage checks whether it can stop (about 1.4x apart, the last at
    ``max_rounds``), and the confidence each check uses: Bonferroni over the checks, so that looking early
    does not make a false win likelier than at one look of 99 %."""
    count = 1
    while True:
        conf = 1.0 - (1.0 - CONFIDENCE) / count
        n, looks = min(min_rounds(conf), max_rounds), []
        while n < max_rounds:
            looks.append(n)
            n = max(n + 1, int(round(n * 1.4)))
        looks.append(max_rounds)
        if len(looks) <= count:
            return looks, conf
        count = len(looks)


def run_confirmation(problem: Problem, device: Device, registry: EngineRegistry,
                     entries: Sequence[tuple[PlanSpec, int]], *, reference: PlanSpec | None,
                     incumbent: PlanSpec | None = None, call: CallMode = CallMode.EAGER,
                     config: AutotuneConfig | None = None, seed: int = 0,
                     tensors: Mapping[str, Any] | None = None, phases: PhaseClock | None = None,
                     watch: HangWatch | None = None, probe: bool = False, by_host: bool = False) -> ConfirmRun:
    """Re-measure ``entries`` ((plan spec, discovery index) each) in paired rounds; never raises for a
    candidate's failure: a participant that raises anything (SystemExit and an engine's KeyboardInterrupt
    included; a user's Ctrl-C goes on up) or gives an unusable time gets a failed row and leaves the rounds.
    ``reference`` with default knobs is timed as its engine's direct library call (farm.tuner.callers), every
    other participant through farm.ops' entry point; every participant's sample holds the same number of calls.
    ``phases`` learns the time spent building the participants' plans and in the rounds. ``watch`` (in-process
    tuning) sees the participant being compiled, warmed up or sampled. ``probe``: the rounds run to the budget
    even for one participant (a participant alone, run again to find which one killed its worker). ``by_host``
    (eager): the samples are the host's time a call, what a model step the host bounds pays (farm capture's
    steps), not the calls' time; every eager row records its host time a call either way."""
    config = config or AutotuneConfig()
    stage = _Stage(problem, device, registry, call, config, phases, by_host)
    if watch is not None:
        watch.watch(stage.tuner)
    try:
        stage.inputs(tensors, seed)
        for spec, index in entries:
            stage.build(spec, index, reference)
        n, samplers, notes = stage.samplers(reference)
        order = [s for s, _ in entries if s in samplers]
        samples: dict[PlanSpec, list[float]] = {s: [] for s in order}
        with timed(phases, CONFIRM):
            rounds, settled = _rounds(problem, {c.spec: c for c in stage.cands}, order, samplers, samples,
                                      stage.results, reference, incumbent, config.confirm, stage.device, stage.timer,
                                      config, seed, call, stage.tuner.in_flight, probe)
        wall = (time.perf_counter() - stage.t_start) * 1e3
        for cand in stage.cands:
            if cand.spec not in stage.results:
                stage.results[cand.spec] = stage.result(cand, samples[cand.spec], n, rounds, settled, wall,
                                                        notes.get(cand.spec, ""))
        log.info("autotune: confirmation (%s) of %s: %d candidate(s), %d round(s) of %d call(s) a sample, %s, %.0f ms",
                 call.value, problem.label(), len(order), rounds, n, "settled" if settled else "budget ended", wall)
        return ConfirmRun(call, tuple(stage.results[s] for s, _ in entries), rounds, settled, wall)
    finally:
        stage.close()


class _Stage:
    """One confirmation stage's participants on its device: their plans, callers, samplers, and rows."""

    def __init__(self, problem: Problem, device: Device, registry: EngineRegistry, call: CallMode,
                 config: AutotuneConfig, phases: PhaseClock | None, by_host: bool) -> None:
        from farm.tuner.autotuner import Autotuner

        self.problem, self.origin, self.call, self.config, self.phases = problem, device, call, config, phases
        self.t_start = time.perf_counter()
        self.started_at = started_iso()
        self.device, self.timer = eager_device(device) if call is CallMode.EAGER else (device, device.timer)
        self.tuner = Autotuner(problem, self.device, registry=registry)
        self.tuner.in_flight.stage = call.value  # what a hang watch's row and the journal say
        self.by_host = by_host and call is CallMode.EAGER
        self.results: dict[PlanSpec, AutotuneResult] = {}
        self.cands: list[CandidateRun] = []
        self.callers: dict[PlanSpec, Caller] = {}
        self.estimates: dict[PlanSpec, float] = {}
        self.hosts: dict[PlanSpec, list[float]] = {}
        self.sets: Any = None

    def inputs(self, tensors: Mapping[str, Any] | None, seed: int) -> None:
        """The input sets the participants' calls rotate over (``tensors`` the first, else made)."""
        problem, device, config = self.problem, self.device, self.config
        if tensors is None:
            tensors = make_tensors(problem, device.arrays, seed)
        count = input_set_count(problem, device, rotating_buffers=config.rotating_buffers, cold_cache=config.cold_cache)
        self.sets = input_sets(problem, device, tensors, count)

    def build(self, spec: PlanSpec, index: int, reference: PlanSpec | None) -> None:
        """A participant's plan and caller, warmed up (a failure is its row)."""
        problem, call, config = self.problem, self.call, self.config
        cand = self.tuner._candidate(index, spec)
        cand.started_at = self.started_at
        self.cands.append(cand)
        with timed(self.phases, COMPILE):
            plan = self.tuner.compile_candidate(cand)
        if plan is None:
            self.results[spec] = _failed(problem, cand, Disposition.FAILED_COMPILE, cand.error, config, call)
            return
        name = cand.engine.name if cand.engine else str(spec.engine_id)
        self.tuner.in_flight[spec] = time.monotonic()
        try:
            workspace = self.tuner.workspace_for(int(getattr(plan, "workspace_size", 0) or 0))
            finalize = getattr(plan, "finalize", None)
            if callable(finalize):
                finalize(workspace)
            with timed(self.phases, CONFIRM):  # a warm-up call, and how long one call takes
                self.device.synchronize()
                caller = participant_caller(problem, self.device, cand.engine, name, spec.knobs, plan, workspace,
                                            self.sets, direct=spec == reference and not spec.knobs)
                self.device.synchronize()
                if call is CallMode.EAGER:
                    self.estimates[spec] = estimate_ms(self.timer, caller)
                    if not usable_time(self.estimates[spec]):
                        raise ValueError(f"unusable time {self.estimates[spec]!r} ms for one call")
        except ENGINE_ERRORS as exc:
            reraise_user_interrupt(exc)
            self.results[spec] = _failed(problem, cand, Disposition.FAILED_WARMUP,
                                         f"{name}: confirmation warm-up: {error_text(exc)}", config, call)
            return
        finally:
            self.tuner.in_flight.pop(spec, None)
        self.callers[spec] = caller

    def samplers(self, reference: PlanSpec | None
                 ) -> tuple[int, dict[PlanSpec, Callable[[], float]], dict[PlanSpec, str]]:
        """(calls a sample, each participant's sampler, notes): eager loops of back-to-back calls, or replays of a
        captured graph (a participant whose capture fails gets its row)."""
        self.hosts = {spec: [] for spec in self.callers}
        if self.call is CallMode.EAGER:
            target = self.config.confirm.sample_ms or {"cpu": CPU_SAMPLE_MS, "nvidia": GPU_SAMPLE_MS,
                                                       "amd": GPU_SAMPLE_MS}.get(self.device.vendor, DEVICE_SAMPLE_MS)
            n = calls_per_sample(self.estimates, reference, target, most=MAX_CALLS_PER_SAMPLE)
            return n, {spec: eager_sampler(self.timer, c, n, self.hosts[spec], by_host=self.by_host)
                       for spec, c in self.callers.items()}, {}
        n = self.config.graph_repeats or GRAPH_REPEATS
        samplers: dict[PlanSpec, Callable[[], float]] = {}
        notes: dict[PlanSpec, str] = {}
        for spec, c in self.callers.items():
            self.tuner.in_flight[spec] = time.monotonic()
            try:
                with timed(self.phases, CONFIRM):
                    samplers[spec], notes[spec] = graph_sampler(self.device, c, n)
            except ENGINE_ERRORS as exc:
                reraise_user_interrupt(exc)
                cand = next(x for x in self.cands if x.spec == spec)
                self.results[spec] = _failed(self.problem, cand, Disposition.FAILED_WARMUP,
                                             f"{c.label}: graph capture: {error_text(exc)}", self.config, self.call)
            finally:
                self.tuner.in_flight.pop(spec, None)
        return n, samplers, notes

    def result(self, cand: CandidateRun, samples: list[float], n: int, rounds: int, settled: bool, wall: float,
               note: str) -> AutotuneResult:
        """A participant's row of the stage: its paired samples and how they were taken."""
        spec, config, call = cand.spec, self.config, self.call
        stats = summarize(samples)
        caller = self.callers[spec]
        how = "; ".join(x for x in (f"confirmation ({call.value}): {rounds} paired rounds of {n} call(s) a sample over "
                                    f"{len(self.sets)} input set(s), {caller.describe()}",
                                    "ranked by the host's time a call (a model step the host bounds)"
                                    if self.by_host else "", note) if x)
        return AutotuneResult(
            problem_key=self.problem.key, engine_id=spec.engine_id,
            engine_name=cand.engine.name if cand.engine else str(spec.engine_id), knobs=spec.knobs,
            disposition=Disposition.SUCCEEDED, mode=config.mode, strategy=config.strategy,
            candidate=cand.index, min_ms=stats.min, avg_ms=stats.mean, stddev_ms=stats.stddev,
            median_ms=stats.median, mad_ms=stats.mad, samples=tuple(samples), iterations=len(samples),
            warmups=1, converged=settled, error=how,
            workspace_size=int(getattr(cand.plan, "workspace_size", 0) or 0),
            estimated_workspace=cand.estimated_workspace,
            supports_exhaustive=bool(cand.engine.supports_exhaustive) if cand.engine else False,
            device_name=self.origin.properties.name, compile_ms=cand.compile_ms,
            tuning_ms=wall / max(len(self.cands), 1), started_at=self.started_at,
            calls_per_sample=n, call_path=caller.path, input_sets=len(self.sets),
            host_ms=float(np.median(self.hosts[spec])) if self.hosts.get(spec) else None,
            ranked_by="host" if self.by_host else "")

    def close(self) -> None:
        for cand in self.cands:
            if cand.plan is not None:
                close_plan(cand.plan)
        self.tuner.close()


def _rounds(problem: Problem, cands: dict[PlanSpec, CandidateRun], order: list[PlanSpec],
            samplers: dict[PlanSpec, Callable[[], float]],
            samples: dict[PlanSpec, list[float]], failed: dict[PlanSpec, AutotuneResult],
            reference: PlanSpec | None, incumbent: PlanSpec | None, settings: ConfirmSettings, device: Device,
            timer: Timer, config: AutotuneConfig, seed: int, call: CallMode, in_flight: dict[PlanSpec, float],
            probe: bool = False) -> tuple[int, bool]:
    """Timed rounds in a random order each; (rounds run, whether the decision settled before the budget).
    ``in_flight`` holds the participant being sampled (what a hang watch reads); ``probe``: no early stop."""
    looks, look_confidence = _looks(settings.max_rounds)
    floor = min_rounds(CONFIDENCE)
    rng = np.random.default_rng([seed, int(problem.key[:12], 16), 1 if call is CallMode.GRAPH else 0])
    flush = getattr(device.runtime, "flush_l2", None) if config.cold_cache else None
    stream = getattr(timer, "stream", device.stream)
    live = list(order)
    rounds, settled = 0, False
    t0 = time.perf_counter()
    with timed_section():  # compile threads of this process wait, as during the main round's timing
        while live and rounds < settings.max_rounds:
            for i in rng.permutation(len(live)):
                spec = live[i]
                if spec not in samplers:
                    continue
                in_flight[spec] = time.monotonic()
                try:
                    if flush is not None:
                        flush(stream)
                    t = samplers[spec]()
                    if not usable_time(t):
                        raise ValueError(f"unusable time {t!r} ms")
                    samples[spec].append(t)
                except ENGINE_ERRORS as exc:  # it leaves the rounds; the others go on
                    reraise_user_interrupt(exc)
                    del samplers[spec]
                    failed[spec] = _failed(problem, cands[spec], Disposition.FAILED_RUN,
                                           f"round {rounds + 1}: {error_text(exc)}", config, call)
                finally:
                    in_flight.pop(spec, None)
            live = [s for s in live if s in samplers]  # the others keep one sample a round: still paired
            rounds += 1
            spent = (time.perf_counter() - t0) * 1e3
            ref = reference if reference in samplers else (live[0] if live else None)
            if probe:
                if not live or (spent >= settings.budget_ms and rounds >= floor):
                    break
                continue
            if len(live) < 2 or ref is None:
                settled = True
                break
            if rounds in looks:
                rows = [samples[s] for s in live]
                d = decide_confirmed(rows, live.index(ref), incumbent=live.index(incumbent) if incumbent in live else -1,
                                     confidence=look_confidence)
                # a win goes on until its speed-up is known to +-precision: the published figure, not only the sign
                if d.settled and (d.winner == d.reference or _precise(d.versus, settings.precision)):
                    settled = True
                    break
            if spent >= settings.budget_ms and rounds >= floor:
                break
    return rounds, settled


def _precise(r: Any, precision: float) -> bool:
    """The interval of a paired ratio spans at most +-``precision`` of its median."""
    return r is not None and r.ratio > 0 and (r.high - r.low) / (2.0 * r.ratio) <= precision


def _failed(problem: Problem, cand: CandidateRun, disposition: Disposition, error: str, config: AutotuneConfig,
            call: CallMode) -> AutotuneResult:
    return AutotuneResult(
        problem_key=problem.key, engine_id=cand.spec.engine_id,
        engine_name=cand.engine.name if cand.engine else str(cand.spec.engine_id), knobs=cand.spec.knobs,
        disposition=disposition, mode=config.mode, strategy=config.strategy, candidate=cand.index,
        error=f"confirmation ({call.value}): {error}", compile_ms=cand.compile_ms, started_at=cand.started_at,
        estimated_workspace=cand.estimated_workspace)
