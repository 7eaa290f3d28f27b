"""Timers, sample statistics, and the stop rules of the benchmarking strategies.

A timer measures one call of a function in milliseconds. The host timer is
right only for synchronous work (CPU engines); GPU work is timed by an event
timer that records device events around the call (farm.devices.runtimes).
"""

from __future__ import annotations

import enum
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol, Sequence, runtime_checkable


# Timed loops and GIL-heavy work in other threads take turns, once per process (the GIL is per
# process). A thread holding the GIL between a timer's start and end events delays the launches in
# between, and the device's idle time lands in the sample; Python hands the GIL over only every
# 5 ms (sys.getswitchinterval()), far longer than the event timer's lead. Measured on the H200:
# a 0.019 ms GEMM timed at 0.39-0.82 ms (median) while compile threads loaded Triton kernels.
_TURNS = threading.Lock()


def timed_section() -> ContextManager[Any]:
    """Held by the tuner while it times one candidate."""
    return _TURNS


def gil_heavy_section() -> ContextManager[Any]:
    """Held by engines around in-process work that keeps the GIL for long (a JIT compile or load)."""
    return _TURNS


@runtime_checkable
class Timer(Protocol):
    """Measures one call of ``fn`` in milliseconds."""

    def measure(self, fn: Callable[[], None]) -> float: ...


class HostTimer:
    """perf_counter around a synchronous call."""

    def measure(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e6


class EventTimer:
    """Device events recorded on ``stream`` around the call; the time is read after the end event completes.

    The timed function must enqueue its work on the same stream. Events time what
    the device does between them, idle gaps included: if the host is still
    launching the work when the start event runs, its launch latency is counted.
    ``lead`` (when given) enqueues a short device-side wait before the start
    event, so the work is queued before the clock starts.
    """

    def __init__(self, runtime: Any, stream: Any, lead: Callable[[], None] | None = None) -> None:
        self.runtime = runtime
        self.stream = stream
        self.lead = lead
        self._start = runtime.create_event()
        self._end = runtime.create_event()

    def measure(self, fn: Callable[[], None]) -> float:
        rt = self.runtime
        if self.lead is not None:
            self.lead()
        rt.record_event(self._start, self.stream)
        fn()
        rt.record_event(self._end, self.stream)
        rt.synchronize_event(self._end)
        return rt.elapsed_ms(self._start, self._end)


@dataclass(frozen=True)
class SampleStats:
    """Summary of timing samples in ms; every field is None when there are no samples."""

    count: int
    min: float | None
    max: float | None
    mean: float | None
    stddev: float | None
    median: float | None
    mad: float | None = None  # median absolute deviation from the median

    @property
    def cov(self) -> float | None:
        return None if self.count == 0 else coefficient_of_variation_from(self.mean or 0.0, self.stddev or 0.0)


def summarize(samples: Sequence[float]) -> SampleStats:
    """min / max / mean / population stddev / median / MAD of ``samples``."""
    n = len(samples)
    if n == 0:
        return SampleStats(0, None, None, None, None, None, None)
    mean = math.fsum(samples) / n
    # float rounding can put mean a hair outside [min, max]; keep the invariant.
    lo, hi = min(samples), max(samples)
    mean = min(max(mean, lo), hi)
    var = math.fsum((s - mean) ** 2 for s in samples) / n
    ordered = sorted(samples)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    deviations = sorted(abs(s - median) for s in samples)
    mad = deviations[mid] if n % 2 else (deviations[mid - 1] + deviations[mid]) / 2
    return SampleStats(n, lo, hi, mean, math.sqrt(var), median, mad)


def coefficient_of_variation_from(mean: float, stddev: float) -> float:
    """stddev / mean; 0 for a flat series at 0, inf when the mean is 0 but values vary."""
    if mean == 0.0:
        return 0.0 if stddev == 0.0 else math.inf
    return stddev / abs(mean)


def coefficient_of_variation(samples: Sequence[float]) -> float:
    s = summarize(samples)
    if s.count == 0:
        return 0.0
    return coefficient_of_variation_from(s.mean or 0.0, s.stddev or 0.0)


class Strategy(str, enum.Enum):
    """How many timed iterations a candidate gets."""

    SINGLE_SHOT = "single_shot"
    FIXED_AVERAGE = "fixed_average"
    RUN_UNTIL_STABLE = "run_until_stable"


@dataclass(frozen=True)
class StopRule:
    """Decides, after each sample, whether the timed loop is done.

    ``done(samples, elapsed_ms)`` returns (stop, converged). Budgets bound every
    strategy: at most ``max_samples`` samples and ``max_duration_ms`` of loop
    time, whichever comes first, and never fewer than one sample.
    """

    strategy: Strategy
    iterations: int  # FIXED_AVERAGE count; RUN_UNTIL_STABLE cap
    window: int = 3
    threshold: float = 0.05
    max_samples: int | None = None
    max_duration_ms: float | None = None

    def done(self, samples: Sequence[float], elapsed_ms: float) -> tuple[bool, bool]:
        n = len(samples)
        if n == 0:
            return False, False
        if self.strategy is Strategy.SINGLE_SHOT:
            return True, True
        if self.strategy is Strategy.RUN_UNTIL_STABLE and n >= self.window:
            if coefficient_of_variation(samples[-self.window:]) < self.threshold:
                return True, True
        if n >= self.iterations:
            # FIXED_AVERAGE ran its count; RUN_UNTIL_STABLE hit its cap unconverged.
            return True, self.strategy is not Strategy.RUN_UNTIL_STABLE
        if self.max_samples is not None and n >= self.max_samples:
            return True, False
        if self.max_duration_ms is not None and elapsed_ms >= self.max_duration_ms:
            return True, False
        return False, False
