"""What the reducer decides, as values: a problem's winner on one signature, how its confirmation stage and farm
verify's replay found it, every winner of a dataset, and a candidate that failed in a stage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from farm.model.knobs import KnobSettings, candidate_label
from farm.tuner.judging.paired import CONFIDENCE
from farm.tuner.judging.winner import ConfirmedRule, Rule

CONFIRM = "confirm"  # the round of the confirmation stage's rows (farm.tuner.judging.confirm)
VERIFY = "verify"  # the round of farm verify's rows (farm.replay.verify)
# a round as the tables name it: the figures of a row come from one round, and the tables say which
ROUND_NAMES = {"main": "main", "finalist": "finalist", CONFIRM: "stage", VERIFY: "verify"}


@dataclass(frozen=True)
class Confirmation:
    """How a problem's confirmation stage (farm.tuner.judging.confirm) decided, for one calling mode."""

    call: str  # eager | graph
    rounds: int  # paired rounds
    settled: bool  # the decision was separated at the confidence before the budget ended
    cost_ms: float  # the stage's time on the device for this problem and calling mode
    speedup: float | None  # the winner's paired speed-up over the default (None: the default won)
    low: float | None  # its interval at ``confidence``
    high: float | None
    best: str  # the strongest challenger (what the default was compared with when it won)
    best_speedup: float | None  # that challenger's paired speed-up over the default, and its interval
    best_low: float | None
    best_high: float | None
    ties: tuple[str, ...]  # candidates whose paired interval against the winner includes 1
    confidence: float = CONFIDENCE
    host_cpus: tuple[str, ...] = ()  # the CPU models of the hosts its rounds ran on (eager: part of the time)
    calls_per_sample: int | None = None  # back-to-back calls a sample (eager) or calls in the graph (graph)
    input_sets: int | None = None  # the input sets the calls rotated over
    default_call: str = ""  # what the default's samples called: 'direct' (the library call), 'plan', 'replay'
    default_failed: str = ""  # the default failed in the stage (why): the rest were compared, none over it
    failed: tuple[str, ...] = ()  # 'label (call): why' of each participant that failed in a stage: never published
    tie: bool = False  # the budget ended with the default kept and no challenger faster at the confidence

    @property
    def decided(self) -> bool:
        """Settled before the budget ended, or a tie within the measured noise when it did (not undecided)."""
        return self.settled or self.tie

    def as_dict(self) -> dict[str, Any]:
        return {"call": self.call, "rounds": self.rounds, "settled": self.settled, "tie": self.tie,
                "cost_ms": self.cost_ms,
                "default_failed": self.default_failed or None, "failed": list(self.failed),
                "confidence": self.confidence, "speedup": self.speedup,
                "interval": [self.low, self.high] if self.speedup is not None else None,
                "best_challenger": self.best or None, "best_speedup": self.best_speedup,
                "best_interval": [self.best_low, self.best_high] if self.best_speedup is not None else None,
                "ties": list(self.ties), "host_cpus": list(self.host_cpus), "calls_per_sample": self.calls_per_sample,
                "input_sets": self.input_sets, "default_call": self.default_call or None}


@dataclass(frozen=True)
class Verification:
    """What farm verify found of a decision where it is replayed: farm.ops beside the direct call, paired."""

    call: str
    delivered: float | None  # direct time / farm.ops time (the paired median); None: nothing usable
    low: float | None  # its interval at ``confidence``
    high: float | None
    rounds: int
    verdict: str  # 'holds', 'flagged: why', 'fixed: why'
    host_cpu: str
    direct: str  # the direct side's candidate (the default), e.g. 'torch.matmul[default]'
    calls_per_sample: int | None
    input_sets: int | None
    verified_at: str
    confidence: float = CONFIDENCE

    @property
    def fixed(self) -> bool:
        return self.verdict.startswith("fixed")

    @property
    def flagged(self) -> bool:
        return self.verdict.startswith(("flagged", "fixed"))

    def as_dict(self) -> dict[str, Any]:
        return {"call": self.call, "delivered": self.delivered,
                "interval": [self.low, self.high] if self.delivered is not None else None, "rounds": self.rounds,
                "confidence": self.confidence, "verdict": self.verdict, "host_cpu": self.host_cpu,
                "direct": self.direct, "calls_per_sample": self.calls_per_sample, "input_sets": self.input_sets,
                "verified_at": self.verified_at}


@dataclass(frozen=True)
class Winner:
    """The reducer's decision for one problem on one signature: what every surface shows.

    With a confirmation stage the decision and its times come from its paired rounds (``confirmed``);
    ``others`` are the decisions for the problem's other calling modes (a graph winner beside the eager one).
    """

    signature: str
    problem_key: str
    problem_name: str
    engine_name: str
    knobs: KnobSettings
    median_ms: float
    min_ms: float | None
    mad_ms: float | None
    noisy: bool
    rule: Rule | ConfirmedRule
    why: str  # '' when the winner is the fastest measured candidate
    fastest: str  # label of the fastest measured candidate
    fastest_ms: float
    default: str | None  # label of the default candidate (None: none measured)
    default_ms: float | None
    candidates: int  # candidates compared
    row: int  # index into the decided table
    confirmed: Confirmation | None = None
    others: tuple["Winner", ...] = ()
    default_noisy: bool = False  # the default's own noise makes a speed-up over it doubtful (no stage measured it)
    verified: Verification | None = None  # farm verify's replay of this decision beside the direct call
    stage_failed: tuple[str, ...] = ()  # labels of the candidates that failed in a confirmation stage: never published
    # the round its figures (median, min, MAD, default and fastest medians) come from, as the Parquet's ``round``
    # column names it: main or finalist (no stage), confirm (the stage's paired rounds), verify (farm verify fixed it)
    round: str = "main"
    default_row: int = -1  # the default's row in the decided table, in the decision's round (-1: none)
    model_check: Any = None  # farm.store.deciding.model_checks.ModelCheck: the model step checked with this decision

    @property
    def label(self) -> str:
        return candidate_label(self.engine_name, self.knobs)

    @property
    def call(self) -> str:
        """The calling mode this decision is for ('' when no confirmation stage ran)."""
        return self.confirmed.call if self.confirmed is not None else ""

    @property
    def speedup_over_default(self) -> float | None:
        """The paired speed-up of the confirmation stage (1.0 when the default won), else the ratio of medians."""
        if self.confirmed is not None and self.confirmed.default_failed:
            return None  # nothing to compare with
        if self.figure_corrected:  # farm verify --fix: what a caller gets where it is replayed
            return self.verified.delivered  # type: ignore[union-attr]
        if self.confirmed is not None:
            return self.confirmed.speedup if self.confirmed.speedup is not None else 1.0
        return self.default_ms / self.median_ms if self.default_ms and self.median_ms else None

    @property
    def figure_corrected(self) -> bool:
        """farm verify --fix found this decision short of its figure but still beating the direct call beyond
        noise: it stays, and the figure published is the delivered one."""
        v = self.verified
        return v is not None and v.verdict.startswith("corrected") and v.delivered is not None

    @property
    def speedup_interval(self) -> tuple[float, float] | None:
        v = self.verified
        if self.figure_corrected and v is not None and v.low is not None and v.high is not None:
            return (v.low, v.high)
        c = self.confirmed
        return (c.low, c.high) if c is not None and c.speedup is not None and c.low is not None and c.high is not None \
            else None

    @property
    def trusted(self) -> bool:
        """False when the speed-up shown is doubtful: measured without a confirmation stage, by one whose budget
        ended undecided (a challenger faster at the confidence, not separated by the margin), or short of it where
        replayed (farm verify). A default kept as a tie within the measured noise is trusted: no one beat it."""
        return self.confirmed is not None and self.confirmed.decided and not self.short_where_replayed

    @property
    def short_where_replayed(self) -> bool:
        """farm verify flagged the decision (not fixed) and it delivers less than the speed-up it publishes, or
        nothing usable: its figure is not what a caller gets. Delivering more than published is no doubt."""
        v = self.verified
        if v is None or not v.verdict.startswith("flagged"):
            return False
        published = self.speedup_over_default
        return v.delivered is None or published is None or v.delivered < published

    def for_call(self, call: str) -> "Winner | None":
        """The decision for calls of kind ``call``; a decision no confirmation stage made is the eager one."""
        if self.call == call or (call == "eager" and not self.call):
            return self
        return next((w for w in self.others if w.call == call), None)

    def with_call(self, call: str, decision: "Winner") -> "Winner":
        """This decision with the one for ``call`` replaced by ``decision``."""
        if self.for_call(call) is self:
            return dataclasses.replace(decision, others=self.others)
        return dataclasses.replace(self, others=tuple(decision if w.call == call else w for w in self.others))

    def default_in_place(self, engine: str, knobs: KnobSettings, *, median_ms: float, min_ms: float | None,
                         mad_ms: float | None, row: int, rule: ConfirmedRule, why: str, **checked: Any) -> "Winner":
        """The default published in this decision's place (a check withdrew or fixed it), timed as given; the
        stage's published comparison is dropped (its speed-up was the decision's), ``checked`` records the check."""
        conf = self.confirmed
        return dataclasses.replace(
            self, engine_name=engine, knobs=knobs, median_ms=median_ms, min_ms=min_ms, mad_ms=mad_ms, noisy=False,
            rule=rule, row=row, why=why,
            confirmed=dataclasses.replace(conf, speedup=None, low=None, high=None) if conf is not None else None,
            **checked)

    def as_dict(self) -> dict[str, Any]:
        out = {"engine_name": self.engine_name, "knobs": dict(self.knobs), "label": self.label,
               "median_ms": self.median_ms, "min_ms": self.min_ms, "mad_ms": self.mad_ms, "noisy": self.noisy,
               "rule": self.rule.value, "why": self.why, "fastest": self.fastest, "fastest_ms": self.fastest_ms,
               "default": self.default, "default_ms": self.default_ms,
               "speedup_over_default": self.speedup_over_default,
               "speedup_interval": list(self.speedup_interval) if self.speedup_interval else None,
               "trusted": self.trusted, "candidates": self.candidates, "call": self.call,
               "confirmation": self.confirmed.as_dict() if self.confirmed is not None else None,
               "verified": self.verified.as_dict() if self.verified is not None else None,
               "failed_in_stage": list(self.stage_failed), "round": self.round}
        if self.others:
            out["other_calls"] = {w.call: w.as_dict() for w in self.others}
        return out


@dataclass
class Decisions:
    """Every winner of a results dataset, with the rows they were decided from."""

    table: pa.Table  # latest successful rows (see load_successes)
    winners: dict[tuple[str, str], Winner]  # (signature, problem key) -> winner
    top: dict[tuple[str, str], list[int]]  # (signature, problem key) -> top-k rows, the winner first
    tuned: dict[str, set[str]]  # signature -> every problem key with rows (any disposition)
    skipped_files: list[tuple[str, str]]
    rows: int

    def of(self, signature: str) -> list[Winner]:
        return sorted((w for (s, _), w in self.winners.items() if s == signature), key=lambda w: w.problem_name)


@dataclass(frozen=True)
class StageFailure:
    """A candidate's failure in a confirmation stage (its newest row): it is never published."""

    key: str  # candidate key
    label: str
    call: str
    reason: str
    index: int  # discovery order

    @property
    def is_default(self) -> bool:
        return self.key.endswith(":[]")

    def describe(self) -> str:
        return f"{self.label} ({self.call or 'stage'}): {self.reason}"
