"""Samples and when to stop taking them: statistics and the benchmarking strategies' stop rules."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence


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


def usable_time(ms: float) -> bool:
    """A time that can be a measurement: finite and above zero (a NaN, an infinity, 0 or a negative time is a
    broken timer or engine, never a result)."""
    return isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0


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
