"""Paired comparisons of candidates measured in the same rounds (the confirmation stage's statistics).

In a confirmation round every candidate is timed once, in a random order, so whatever slowed the
device down in that round (another process, a clock change, a thermal dip) slowed all of them. The
per-round time ratio ``challenger / reference`` cancels that drift; its median over the rounds is the
paired estimate, and its interval is the distribution-free one for a median (the sign test's order
statistics): exact coverage whatever the shape of the noise, no resampling (so every surface computes
the same interval from the same samples), and robust to the heavy tail a busy machine gives.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

CONFIDENCE = 0.99  # the stated confidence of every published interval


@functools.lru_cache(maxsize=4096)
def order_statistic_rank(n: int, confidence: float) -> int:
    """The 1-based rank k with P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2, the largest such;
    0 when none exists (too few rounds for that confidence): the interval is then unbounded."""
    alpha_half = (1.0 - confidence) / 2.0
    total = 2 ** n
    cumulative = 0
    k = 0
    for j in range(n // 2 + 1):
        cumulative += math.comb(n, j)
        if cumulative / total <= alpha_half:
            k = j + 1
        else:
            break
    return k


def median_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(median, low, high) of ``values``; [low, high] covers the median with at least ``confidence``."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return math.nan, -math.inf, math.inf
    med = float(np.median(x))
    k = order_statistic_rank(n, confidence)
    if k == 0:
        return med, -math.inf, math.inf
    return med, float(x[k - 1]), float(x[n - k])


def min_rounds(confidence: float = CONFIDENCE) -> int:
    """The fewest rounds whose interval can be bounded at ``confidence`` (8 at 99 %)."""
    n = 1
    while order_statistic_rank(n, confidence) == 0:
        n += 1
    return n


@dataclass(frozen=True)
class PairedRatio:
    """Median over rounds of challenger time / reference time, with its interval (below 1: the challenger
    is faster). ``speedup`` is its inverse: how much faster the challenger is."""

    ratio: float
    low: float
    high: float
    rounds: int
    confidence: float = CONFIDENCE

    @property
    def speedup(self) -> float:
        return 1.0 / self.ratio if self.ratio > 0 else math.inf

    @property
    def speedup_low(self) -> float:
        return 1.0 / self.high if self.high > 0 else 0.0

    @property
    def speedup_high(self) -> float:
        return 1.0 / self.low if self.low > 0 else math.inf

    def faster_by_more_than(self, margin: float) -> bool:
        """The challenger is faster by more than ``margin`` (a fraction) at this confidence."""
        return self.high < 1.0 - margin

    def cannot_be_faster_by(self, margin: float) -> bool:
        """At this confidence the challenger is not faster by ``margin`` or more."""
        return self.low >= 1.0 - margin

    def includes_one(self) -> bool:
        return self.low <= 1.0 <= self.high

    def describe(self) -> str:
        """'1.23x (99 % interval 1.18-1.29, 24 rounds)' as a speed-up of the challenger."""
        hi = "inf" if math.isinf(self.speedup_high) else f"{self.speedup_high:.3f}"
        return (f"{self.speedup:.3f}x ({100 * self.confidence:g} % interval {self.speedup_low:.3f}-{hi}, "
                f"{self.rounds} paired rounds)")


def paired_ratio(challenger: Sequence[float] | np.ndarray, reference: Sequence[float] | np.ndarray,
                 confidence: float = CONFIDENCE) -> PairedRatio:
    """The paired ratio of two candidates' samples, round by round (the common prefix if lengths differ)."""
    a, b = np.asarray(challenger, dtype=float), np.asarray(reference, dtype=float)
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    ok = (a > 0) & (b > 0) & np.isfinite(a) & np.isfinite(b)
    logs = np.log(a[ok]) - np.log(b[ok])
    med, lo, hi = median_interval(logs, confidence)
    return PairedRatio(math.exp(med) if math.isfinite(med) else math.nan, math.exp(lo), math.exp(hi),
                       int(ok.sum()), confidence)
