"""How a candidate is timed (farm.tuner.session.TuningRun measures with these): the function one measurement
runs (plain runs over the input sets, or a device graph of several), the samples until the stop rule says stop,
and whether a candidate is noisy near the top (measured again then)."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from farm.devices.device import Device
from farm.devices.timing import timed_section
from farm.model.measurement import summarize, usable_time
from farm.model.engine import Plan
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig
from farm.tuner.candidate import error_text
from farm.tuner.interrupts import ENGINE_ERRORS, reraise_user_interrupt
from farm.tuner.judging.winner import NOISE_SIGMAS, RELATIVE_FLOOR, is_noisy, noise_sigma

log = logging.getLogger("farm.tuner.autotuner")


def sample(dev: Device, cfg: AutotuneConfig, rule: Any, timed: Callable[[int], Callable[[], None]], per_call: int,
           samples: list[float], label: str = "") -> bool:
    """Timed runs appended to ``samples`` until the stop ``rule`` (counted from this call) says stop; -> converged."""
    first = len(samples)
    with timed_section():  # compile threads of this process wait: see farm.devices.timing
        t0 = time.perf_counter()
        while True:
            if cfg.cold_cache:
                dev.runtime.flush_l2(dev.stream)
            t = dev.timer.measure(timed(len(samples))) / per_call
            if not usable_time(t):  # a broken timer or engine: the candidate fails, its time is no result
                raise ValueError(f"unusable time {t!r} ms")
            samples.append(t)
            stop, converged = rule.done(samples[first:], (time.perf_counter() - t0) * 1e3)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("autotune: %s iteration %d: %.4f ms%s", label, len(samples), samples[-1],
                          cov_progress(cfg, samples[first:]))
            if stop:
                return converged


def cov_progress(cfg: AutotuneConfig, samples: Sequence[float]) -> str:
    """', CoV of the last W x.x % (target y %)' under run_until_stable, once a window is full."""
    w = cfg.window
    if cfg.strategy.value != "run_until_stable" or len(samples) < w:
        return ""
    tail = np.asarray(samples[-w:])
    cov = float(tail.std() / tail.mean()) if tail.mean() > 0 else float("inf")
    return f", CoV of the last {w} {cov:.1%} (target {cfg.stability_threshold:.0%})"


def noisy_near_top(samples: Sequence[float], best: tuple[float, float] | None) -> bool:
    """Noisy, and within noise of (or faster than) ``best``, the (median, MAD) of the fastest candidate so far."""
    if len(samples) < 3:
        return False
    stats = summarize(samples)
    if stats.median is None or not is_noisy(np.array([stats.median]), np.array([stats.mad]))[0]:
        return False
    if best is None:
        return True
    best_median, best_mad = best
    sigma = noise_sigma(np.array([best_mad, stats.mad]))
    band = NOISE_SIGMAS * float(np.sqrt((sigma ** 2).sum())) + RELATIVE_FLOOR * best_median
    return stats.median - best_median <= band


def timed_call(dev: Device, problem: Problem, repeats: int, rotations: Sequence[Mapping[str, Any]], plan: Plan,
               workspace: Any, label: str) -> tuple[Callable[[int], Callable[[], None]], int, str]:
    """(sample index -> the function one measurement times, runs per measurement, a note).

    A plan whose ``run`` copies the library's output into the given one (``copies_output``) is timed
    through ``produce``, as replay without ``out=`` runs it; ``run`` is what the warm-up checks.
    With graph_repeats, one measurement is a replay of a device graph holding that many runs
    (the device must offer ``capture_graph``), which take the input sets (rotating_buffers) in turn as
    plain runs do: a graph of one set would time weights that sit in L2, which a model streaming its
    layers' weights does not get. A failed capture falls back to plain runs.
    """
    produce = getattr(plan, "produce", None) if workspace is None and getattr(plan, "copies_output", False) else None
    if produce is not None and all(problem.tensor(o).is_contiguous for o in problem.output_ids):
        # run() would copy the library's output into ours; a replay without out= hands it back instead.
        # (Plans that write in place are timed as they are: allocating in timed runs contends with
        # compile threads for the allocator and adds noise production does not have.)
        def call(tensors: Mapping[str, Any]) -> None:
            produce(tensors)
    else:
        def call(tensors: Mapping[str, Any]) -> None:
            plan.run(tensors, workspace, dev.stream)
    capture = dev.extras.get("capture_graph")
    if repeats and capture is not None:
        sets, turn = rotations, itertools.count()
        try:
            replay = capture(dev, lambda: call(sets[next(turn) % len(sets)]), repeats)
            return (lambda i: replay), repeats, ""
        except ENGINE_ERRORS as exc:
            reraise_user_interrupt(exc)
            note = f"graph capture failed, timed without graphs: {error_text(exc)}"
            log.info("autotune: %s: %s", label, note)
            dev.synchronize()
    elif repeats:
        note = f"{dev.runtime.name} devices offer no graph capture; timed without graphs"
    else:
        note = ""
    sets = rotations

    def timed(i: int) -> Callable[[], None]:
        tensors = sets[i % len(sets)]
        return lambda: call(tensors)

    return timed, 1, note
