"""The one rule that decides a problem's winner among its measured candidates.

Every surface shows this decision: the reducer writes it into the override files
and the winners table, ``farm report``, ``farm diff``, ``farm tune`` and the
in-process :class:`~farm.tuner.autotuner.Autotuner` ranking all call :func:`decide_groups`.

Per candidate: its median time, its noise (sigma = 1.4826 x MAD of its samples),
its discovery order, and whether it is the *default* (what production runs with
nothing tuned: the earliest-discovered candidate with default knobs) or the
*incumbent* (the winner an earlier reduce or publish recorded for this signature).

1. A candidate is *noisy* when sigma > ``NOISY_RELATIVE`` x its median.
2. The fastest F has the lowest median (discovery order breaks exact ties).
3. If F is noisy, the fastest stable candidate S takes the lead when it is within
   noise of F: a noisy candidate loses ties, its noise never helps it win.
4. The incumbent, then the default, keeps the win when it is stable and within
   noise of the leader L (the benefit of the doubt goes to these two only).
5. Otherwise the leader wins. Among all other candidates the faster median wins.

"Within noise of L": median(c) - median(L) <= 2 x sqrt(sigma_L^2 + sigma_c^2) + 0.5 % of median(L).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from farm.tuner.judging.paired import CONFIDENCE, PairedRatio, paired_ratio

NOISE_SIGMAS = 2.0
RELATIVE_FLOOR = 0.005
MAD_TO_SIGMA = 1.4826
NOISY_RELATIVE = 0.05  # sigma above 5 % of the median: too noisy to get (or give) the benefit of the doubt


class Rule(str, enum.Enum):
    """Why the winner won (the ``rule`` field of every surface)."""

    FASTEST = "fastest"
    STABLE_OVER_NOISY = "stable_over_noisy"
    INCUMBENT_WITHIN_NOISE = "incumbent_within_noise"
    DEFAULT_WITHIN_NOISE = "default_within_noise"


@dataclass(frozen=True)
class GroupDecisions:
    """:func:`decide_groups` per group (arrays indexed by group ordinal; row indices into the input)."""

    winner: np.ndarray
    fastest: np.ndarray
    default: np.ndarray  # -1 where the group has no default candidate
    rule: np.ndarray  # Rule values (str objects)
    threshold_ms: np.ndarray  # the noise band the deciding comparison used (0 for plain "fastest")
    ranking_rows: np.ndarray  # rows of the top-k per group, group by group, winner first
    ranking_pos: np.ndarray  # their positions (0 = winner)


def noise_sigma(mad: np.ndarray) -> np.ndarray:
    return MAD_TO_SIGMA * np.nan_to_num(np.asarray(mad, dtype=float), nan=0.0)


def is_noisy(median: np.ndarray, mad: np.ndarray) -> np.ndarray:
    median = np.asarray(median, dtype=float)
    return noise_sigma(mad) > NOISY_RELATIVE * np.abs(median)


def _within(med: np.ndarray, sig: np.ndarray, leader: np.ndarray, other: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(other within noise of leader, the band), elementwise over row-index arrays."""
    band = NOISE_SIGMAS * np.sqrt(sig[leader] ** 2 + sig[other] ** 2) + RELATIVE_FLOOR * med[leader]
    return med[other] - med[leader] <= band, band


def _first_per_group(rows: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """The first of ``rows`` (already in preference order) in each group, -1 where a group has none."""
    out = np.full(n_groups, -1, dtype=np.int64)
    if len(rows):
        g = group[rows]
        first = np.r_[True, g[1:] != g[:-1]]
        out[g[first]] = rows[first]
    return out


def decide_groups(group: np.ndarray, median: np.ndarray, mad: np.ndarray, order: np.ndarray, *,
                  default: np.ndarray | None = None, incumbent: np.ndarray | None = None,
                  top_k: int = 3) -> GroupDecisions:
    """The winner of every group at once (``group``: ordinals 0..G-1, rows sorted by group or not).

    ``default`` / ``incumbent`` flag at most one row per group each. NaN medians must be removed first.
    """
    group = np.asarray(group, dtype=np.int64)
    med = np.asarray(median, dtype=float)
    order = np.asarray(order, dtype=np.int64)
    n = len(group)
    n_groups = int(group.max()) + 1 if n else 0
    sig = noise_sigma(mad)
    noisy = sig > NOISY_RELATIVE * np.abs(med)
    no = np.zeros(n, dtype=bool)
    default = no if default is None else np.asarray(default, dtype=bool)
    incumbent = no if incumbent is None else np.asarray(incumbent, dtype=bool)

    by_time = np.lexsort((order, med, group))  # per group: fastest first, exact ties by discovery order
    fastest = _first_per_group(by_time, group, n_groups)
    rule = np.full(n_groups, Rule.FASTEST.value, dtype=object)
    threshold = np.zeros(n_groups)
    leader = fastest.copy()

    stable_first = by_time[~noisy[by_time]]
    stable = _first_per_group(stable_first, group, n_groups)
    take = (stable >= 0) & noisy[fastest]
    if take.any():
        ok, band = _within(med, sig, fastest[take], stable[take])
        idx = np.flatnonzero(take)[ok]
        leader[idx] = stable[take][ok]
        rule[idx] = Rule.STABLE_OVER_NOISY.value
        threshold[idx] = band[ok]

    winner = leader.copy()
    pref = np.lexsort((order, group))  # per group in discovery order
    decided = np.zeros(n_groups, dtype=bool)
    defaults = _first_per_group(pref[default[pref]], group, n_groups)
    incumbents = _first_per_group(pref[incumbent[pref]], group, n_groups)
    for holder, name in ((incumbents, Rule.INCUMBENT_WITHIN_NOISE), (defaults, Rule.DEFAULT_WITHIN_NOISE)):
        has = (holder >= 0) & ~decided
        decided |= has & (holder == leader)  # it leads already: nothing to keep
        cand = has & (holder != leader)
        cand[cand] = ~noisy[holder[cand]]
        if not cand.any():
            continue
        ok, band = _within(med, sig, leader[cand], holder[cand])
        idx = np.flatnonzero(cand)[ok]
        winner[idx] = holder[idx]
        rule[idx] = name.value
        threshold[idx] = band[ok]
        decided[idx] = True

    ranking, pos = _ranked(group, med, order, winner, n_groups, top_k)
    return GroupDecisions(winner, fastest, defaults, rule, threshold, ranking, pos)


def _ranked(group: np.ndarray, med: np.ndarray, order: np.ndarray, winner: np.ndarray, n_groups: int,
            top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each group's top ``top_k`` rows, its winner first, then by time: (rows, their position in the group)."""
    n = len(group)
    is_winner = np.zeros(n, dtype=bool)
    is_winner[winner[winner >= 0]] = True
    ranking = np.lexsort((order, med, ~is_winner, group))
    rank_groups = group[ranking]
    starts = np.searchsorted(rank_groups, np.arange(n_groups))
    pos = np.arange(n) - starts[rank_groups] if n else np.zeros(0, dtype=np.int64)
    keep = pos < max(top_k, 1)
    return ranking[keep], pos[keep]


@dataclass(frozen=True)
class Decision:
    """The winner of one group of candidates (indices into the caller's sequence)."""

    winner: int
    fastest: int
    default: int  # -1: no default candidate
    rule: Rule
    threshold_ms: float
    ranked: tuple[int, ...]  # every candidate, the winner first, then by median


def decide(median: Sequence[float], mad: Sequence[float], order: Sequence[int], *,
           default: Sequence[bool] | None = None, incumbent: Sequence[bool] | None = None) -> Decision:
    """:func:`decide_groups` for one problem's candidates."""
    n = len(median)
    d = decide_groups(np.zeros(n, dtype=np.int64), np.asarray(median, dtype=float), np.asarray(mad, dtype=float),
                      np.asarray(order), default=None if default is None else np.asarray(default, dtype=bool),
                      incumbent=None if incumbent is None else np.asarray(incumbent, dtype=bool), top_k=n)
    return Decision(int(d.winner[0]), int(d.fastest[0]), int(d.default[0]), Rule(d.rule[0]),
                    float(d.threshold_ms[0]), tuple(int(i) for i in d.ranking_rows))


def why(rule: Rule | str, *, winner_ms: float, fastest_ms: float, fastest_label: str, threshold_ms: float,
        fastest_noise: float = 0.0) -> str:
    """One short phrase saying why the winner is not the fastest measured candidate ('' when it is)."""
    rule = Rule(rule)
    if rule is Rule.FASTEST:
        return ""
    gain = 100.0 * (winner_ms - fastest_ms) / winner_ms if winner_ms else 0.0
    band = 100.0 * threshold_ms / winner_ms if winner_ms else 0.0
    if rule is Rule.STABLE_OVER_NOISY:
        return (f"stable kept: {fastest_label} was {gain:.1f} % faster but noisy "
                f"(±{100.0 * fastest_noise:.1f} %), within noise")
    who = "incumbent" if rule is Rule.INCUMBENT_WITHIN_NOISE else "default"
    return f"{who} kept: {fastest_label} {gain:.1f} % faster is within noise (±{band:.1f} %)"


# -- the confirmation stage's decision (paired rounds: farm.tuner.judging.confirm) ---------------------------------
CONFIRM_MARGIN = RELATIVE_FLOOR  # a challenger must be faster than the default by more than this, at the confidence


class ConfirmedRule(str, enum.Enum):
    """How a confirmation stage decided (the ``rule`` field of a confirmed winner)."""

    CONFIRMED = "confirmed"  # a challenger beat the default in paired rounds
    DEFAULT_NOT_BEATEN = "default_not_beaten"  # no challenger beat it: the default is published
    INCUMBENT_NOT_BEATEN = "incumbent_not_beaten"  # the incumbent beat the default, and nothing beat the incumbent
    NOT_DELIVERED = "not_delivered"  # farm verify found the winner short of what it promised where it is replayed:
    # the default is published instead
    DEFAULT_FAILED = "default_failed"  # the default failed in the stage: the fastest of the rest is published
    WITHDRAWN_IN_MODEL = "withdrawn_in_model"  # the model check found the step slower with it (farm apply): the
    # default is published instead


@dataclass(frozen=True)
class ConfirmedDecision:
    """The winner of one confirmation stage (indices into the caller's candidates).

    ``versus`` is the published comparison: the winner against the default (or, when the default wins,
    the best challenger against it); ``challengers`` every candidate's paired ratio against the reference.
    """

    winner: int
    reference: int  # the default (or, without one, the main round's leader)
    rule: ConfirmedRule
    versus: PairedRatio | None
    best: int  # the challenger with the lowest paired ratio (-1: none)
    challengers: dict[int, PairedRatio]
    settled: bool  # the comparison that decides is separated at the confidence (not cut by the budget)

    @property
    def tie(self) -> bool:
        """The budget ended with the default kept and no challenger faster than it at the confidence (each one's
        interval reaches 1 or lies above it): a tie within the measured noise, a decision. Not settled, and not
        a tie: some challenger is faster at the confidence, but not shown to be by the margin (undecided)."""
        # a bounded interval each (too few rounds bound nothing: that is no measured noise, and no tie)
        return (self.rule is ConfirmedRule.DEFAULT_NOT_BEATEN and not self.settled and bool(self.challengers)
                and all(1.0 <= r.high < math.inf and r.low > 0 for r in self.challengers.values()))


def decide_confirmed(samples: Sequence[Sequence[float]], reference: int, *, incumbent: int = -1,
                     confidence: float | None = None, margin: float = CONFIRM_MARGIN) -> ConfirmedDecision:
    """The confirmation stage's rule, from each candidate's samples taken in the same rounds.

    The reference (the default) is published unless a challenger is faster than it by more than ``margin``
    at ``confidence`` (paired, round by round). Among those that are, the lowest paired ratio wins, except
    that the incumbent keeps the win unless the winner is also faster than the incumbent by the margin.
    A candidate's noise widens its own interval only: it can lose a win to it, never gain one.
    """
    conf = CONFIDENCE if confidence is None else confidence
    ref = np.asarray(samples[reference], dtype=float)
    ratios = {i: paired_ratio(s, ref, conf) for i, s in enumerate(samples) if i != reference}
    ranked = sorted((r.ratio, i) for i, r in ratios.items() if r.ratio == r.ratio)
    best = ranked[0][1] if ranked else -1
    beat = [i for _, i in ranked if ratios[i].faster_by_more_than(margin)]
    if not beat:
        settled = all(r.cannot_be_faster_by(margin) for r in ratios.values())
        return ConfirmedDecision(reference, reference, ConfirmedRule.DEFAULT_NOT_BEATEN,
                                 ratios.get(best), best, ratios, settled or not ratios)
    winner = beat[0]
    if 0 <= incumbent != winner and incumbent in beat:
        over = paired_ratio(samples[winner], samples[incumbent], conf)
        if not over.faster_by_more_than(margin):
            return ConfirmedDecision(incumbent, reference, ConfirmedRule.INCUMBENT_NOT_BEATEN, ratios[incumbent],
                                     best, ratios, True)
    return ConfirmedDecision(winner, reference, ConfirmedRule.CONFIRMED, ratios[winner], best, ratios, True)


def confirmed_why(d: ConfirmedDecision, label_of: Callable[[int], str]) -> str:
    """One phrase saying how the confirmation stage decided."""
    if d.versus is None:
        return "default kept: nothing else was confirmed"
    if d.rule is ConfirmedRule.CONFIRMED:
        return f"confirmed: {d.versus.describe()} over the default"
    if d.rule is ConfirmedRule.INCUMBENT_NOT_BEATEN:
        return (f"incumbent kept: {d.versus.describe()} over the default; {label_of(d.best)} "
                "not faster than it beyond the margin")
    gain = 100.0 * (1.0 - d.versus.ratio)
    how = f"{gain:.1f} % faster" if gain >= 0 else f"{-gain:.1f} % slower"
    if d.tie:
        return (f"default kept: a tie within the measured noise, no challenger faster at the confidence ("
                f"{label_of(d.best)} {how}: {d.versus.describe()})")
    if not d.settled:
        return f"default kept: {label_of(d.best)} {how}, not confirmed when the budget ended ({d.versus.describe()})"
    if gain < 0:
        return f"default kept: the fastest other, {label_of(d.best)}, is {how} ({d.versus.describe()})"
    return (f"default kept: {label_of(d.best)} {how}, not beyond the {100 * CONFIRM_MARGIN:g} % margin "
            f"({d.versus.describe()})")


def decide_stage(keys: Sequence[str], samples: Sequence[Sequence[float]], *, default_key: str | None,
                 incumbent_key: str | None, default_flags: Sequence[bool],
                 default_failed: bool = False) -> tuple[ConfirmedDecision, list[int]]:
    """:func:`decide_confirmed` on one stage's rows as every surface reads them: in the order of their candidate
    keys, the reference being ``default_key`` (else the first default-knob row, else the first row). With
    ``default_failed`` (the default failed in the stage) the reference is the fastest by median: nobody gets
    the default's benefit of the doubt, and the rule says so. Returns the decision (indices into that order)
    and the order (indices into the caller's rows)."""
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    ks = [keys[i] for i in order]
    ordered = [samples[i] for i in order]
    if default_failed:
        ref = min(range(len(ks)), key=lambda j: (float(np.median(ordered[j])) if len(ordered[j]) else math.inf, j))
    else:
        ref = ks.index(default_key) if default_key in ks else next((j for j, i in enumerate(order) if default_flags[i]), 0)
    inc = ks.index(incumbent_key) if incumbent_key in ks else -1
    dec = decide_confirmed(ordered, ref, incumbent=inc)
    if default_failed:
        dec = dataclasses.replace(dec, rule=ConfirmedRule.DEFAULT_FAILED)
    return dec, order
