"""The reducer's decisions: the winner of every (signature, problem) in a results dataset, by farm.tuner.winner's rule."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from farm.model.ids import engine_name_to_id
from farm.model.knobs import KnobSettings, candidate_label
from farm.store.dataset import ResultsDataset
from farm.store.override_files import load_overrides
from farm.store.overrides import OverrideEntry
from farm.store.model_checks import apply_model_checks
from farm.store.results import CHECK_ROUNDS, candidate_key, spec_of
from farm.tuner.paired import CONFIDENCE, paired_ratio
from farm.tuner.winner import ConfirmedRule, Rule, confirmed_why, decide_groups, decide_stage, is_noisy, noise_sigma, why

log = logging.getLogger("farm.store.decisions")


CONFIRM = "confirm"  # the round of the confirmation stage's rows (farm.tuner.confirm)
VERIFY = "verify"  # the round of farm verify's rows (farm.replay.verify)
# a round as the tables name it: the figures of a row come from one round, and the tables say which
ROUND_NAMES = {"main": "main", "finalist": "finalist", CONFIRM: "stage", VERIFY: "verify"}

_DICT_COLUMNS = ("problem_json", "problem_name", "engine_name", "device_json", "round", "mode", "strategy", "job_id",
                 "session_id")


_COLUMNS = ("device_signature", "problem_key", "candidate_key", "candidate_index", "engine_name", "problem_json",
            "problem_name", "device_json", "round", "session_id", "mode", "strategy", "job_id", "measured_at", "min_ms", "avg_ms",
            "stddev_ms", "median_ms", "mad_ms", "iterations", "converged", "workspace_bytes", "ran_exhaustive",
            "supports_exhaustive", "exhaustive_not_run_reason", "op")


@dataclass(frozen=True)
class Confirmation:
    """How a problem's confirmation stage (farm.tuner.confirm) decided, for one calling mode."""

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

    def as_dict(self) -> dict[str, Any]:
        return {"call": self.call, "rounds": self.rounds, "settled": self.settled, "cost_ms": self.cost_ms,
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
    model_check: Any = None  # farm.store.model_checks.ModelCheck: the model step checked with this decision

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
        if self.confirmed is not None:
            return self.confirmed.speedup if self.confirmed.speedup is not None else 1.0
        return self.default_ms / self.median_ms if self.default_ms and self.median_ms else None

    @property
    def speedup_interval(self) -> tuple[float, float] | None:
        c = self.confirmed
        return (c.low, c.high) if c is not None and c.speedup is not None and c.low is not None and c.high is not None \
            else None

    @property
    def trusted(self) -> bool:
        """False when the speed-up shown is doubtful: measured without a confirmation stage, by one whose budget
        ended before it could separate the leader from the default, or short of it where replayed (farm verify)."""
        return self.confirmed is not None and self.confirmed.settled and not self.short_where_replayed

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


def _strings(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col


def _changes(col: pa.ChunkedArray) -> np.ndarray:
    """Boolean array: row i differs from row i-1 (row 0 always True)."""
    arr = _strings(col).combine_chunks()
    n = len(arr)
    out = np.ones(n, dtype=bool)
    if n > 1:
        out[1:] = pc.not_equal(arr.slice(1), arr.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return out


def load_successes(data: ResultsDataset) -> pa.Table:
    """Successful rows of the main and finalist rounds, latest per (signature, problem, candidate), grouped by
    signature and problem (the confirmation stage's rows are read apart: load_confirmations)."""
    return _load_successes(data)[0]


def _usable(*cols: pa.ChunkedArray) -> np.ndarray:
    """Rows whose times are all usable measurements (finite, above zero; a null is not)."""
    ok = np.ones(len(cols[0]), dtype=bool)
    for col in cols:
        v = col.to_numpy(zero_copy_only=False).astype(float)  # nulls read as NaN
        ok &= np.isfinite(v) & (v > 0)
    return ok


def _load_successes(data: ResultsDataset) -> tuple[pa.Table, bool, dict[str, set[str]], int,
                                                  dict[tuple[str, str], set[str]]]:
    """One scan for the decision: :func:`load_successes`' table, whether the dataset has confirmation rows,
    signature -> every problem key with rows of any disposition, the rows read, and (signature, problem key) ->
    the candidate keys that failed in a confirmation stage since their main-round row (left out of the table:
    never published until measured again)."""
    t = data.table([*_COLUMNS, "succeeded"], dictionary=_DICT_COLUMNS)
    rows = t.num_rows
    sig, pkey = _codes(t["device_signature"]), _codes(t["problem_key"])
    tuned: dict[str, set[str]] = {}
    if rows:
        combo = sig.astype(np.int64) * (int(pkey.max()) + 1) + pkey
        at = pa.array(np.unique(combo, return_index=True)[1])  # a row of each (signature, problem)
        for s, p in zip(_strings(t["device_signature"].take(at)).to_pylist(), _strings(t["problem_key"].take(at)).to_pylist()):
            tuned.setdefault(s, set()).add(p)
    keep = t["succeeded"].to_numpy(zero_copy_only=False).astype(bool) if rows else np.zeros(0, bool)
    rounds = _strings(t["round"])
    stage = pc.equal(rounds, CONFIRM).to_numpy(zero_copy_only=False).astype(bool) if rows else keep
    verify = pc.is_in(rounds, pa.array(CHECK_ROUNDS)).to_numpy(zero_copy_only=False).astype(bool) if rows else keep
    has_stage = bool(((stage | verify) & keep).any())
    # a stage's row that failed, or whose times are unusable (an old part): its candidate failed in the stage
    stage_failed = stage & ~(keep & _usable(t["median_ms"], t["min_ms"], t["avg_ms"])) if stage.any() else stage
    keep &= ~(stage | verify)
    keep |= stage_failed
    # latest first within each (signature, problem, candidate), a failure first at one instant: a sort on integer
    # codes, not on the strings
    idx = np.flatnonzero(keep)
    sig, pkey, ckey = sig[idx], pkey[idx], _codes(t["candidate_key"])[idx]
    when = pc.cast(t["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)[idx]
    order = np.lexsort((~stage_failed[idx], -when, ckey, pkey, sig))
    sig, pkey, ckey = sig[order], pkey[order], ckey[order]
    first_row = np.ones(len(order), dtype=bool)
    first_row[1:] = (sig[1:] != sig[:-1]) | (pkey[1:] != pkey[:-1]) | (ckey[1:] != ckey[:-1])
    chosen = idx[order[first_row]]
    dropped: dict[tuple[str, str], set[str]] = {}
    failed_rows = chosen[stage_failed[chosen]]
    if len(failed_rows):
        at = pa.array(failed_rows)
        for s_, p_, c_ in zip(*(_strings(t[c].take(at)).to_pylist()
                                for c in ("device_signature", "problem_key", "candidate_key"))):
            dropped.setdefault((s_, p_), set()).add(c_)
        chosen = chosen[~stage_failed[chosen]]
    return t.take(pa.array(chosen)).drop(["succeeded"]), has_stage, tuned, rows, dropped


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


def _stage_failures(data: ResultsDataset, dropped: dict[tuple[str, str], set[str]]
                    ) -> dict[tuple[str, str], dict[str, StageFailure]]:
    """(signature, problem key) -> candidate key -> the stage failure that dropped it (its newest failed row)."""
    t = data.table(["device_signature", "problem_key", "candidate_key", "engine_name", "call", "error", "disposition",
                    "measured_at", "candidate_index", "succeeded", "median_ms", "min_ms", "avg_ms"],
                   filter=ds.field("round") == CONFIRM, dictionary=_DICT_COLUMNS)
    if t.num_rows == 0:
        return {}
    bad = ~(t["succeeded"].to_numpy(zero_copy_only=False).astype(bool) & _usable(t["median_ms"], t["min_ms"], t["avg_ms"]))
    t = t.filter(pa.array(bad)).sort_by([("measured_at", "descending")])
    out: dict[tuple[str, str], dict[str, StageFailure]] = {}
    cols = [_strings(t[c]).to_pylist() for c in ("device_signature", "problem_key", "candidate_key", "engine_name",
                                                   "call", "error", "disposition")]
    for sig, pkey, ckey, engine, call, error, disp, index, ok in zip(*cols, t["candidate_index"].to_pylist(),
                                                                     t["succeeded"].to_pylist()):
        if ckey not in dropped.get((sig, pkey), ()) or ckey in out.get((sig, pkey), {}):
            continue
        reason = (error or disp or "failed") if not ok else "unusable times (not finite, or not above zero)"
        prefix = f"confirmation ({call}): "
        reason = reason[len(prefix):] if reason.startswith(prefix) else reason
        out.setdefault((sig, pkey), {})[ckey] = StageFailure(ckey, _label(engine, ckey), call or "", reason,
                                                             int(index) if index is not None else 1 << 30)
    return out


def _codes(col: pa.ChunkedArray) -> np.ndarray:
    """An integer per distinct value (first appearance first): equal strings, equal codes."""
    return pc.dictionary_encode(_strings(col).combine_chunks()).indices.to_numpy(zero_copy_only=False)


def _float(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


@functools.lru_cache(maxsize=4096)
def _label(engine_name: str, key: str) -> str:
    """The candidate's label from its engine and candidate key (few distinct ones: each made once)."""
    return candidate_label(engine_name, knobs_of(key))


@functools.lru_cache(maxsize=4096)
def knobs_of(key: str) -> tuple[tuple[str, Any], ...]:
    """A candidate key's knobs (a few hundred distinct keys stand behind a million rows)."""
    return spec_of(key).knobs


def _incumbent_keys(table: pa.Table, first_rows: np.ndarray, signatures: list[str], keys: list[str],
                    incumbents: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(signature, problem key) -> the candidate key the incumbent override file names for that problem."""
    from farm.model.problem import Problem

    out: dict[tuple[str, str], str] = {}
    by_key: dict[str, dict[str, OverrideEntry]] = {}
    for sig, f in incumbents.items():
        if f is not None:
            by_key[sig] = {(e.metadata or {}).get("problem_key"): e for e in f.entries if e.metadata}
    for row, sig, key in zip(first_rows.tolist(), signatures, keys):
        f = incumbents.get(sig)
        if f is None:
            continue
        entry = by_key[sig].get(key)
        if entry is None:
            try:
                entry = f.match(Problem.from_canonical(json.loads(table["problem_json"][row].as_py())))
            except Exception:  # a problem the file cannot describe has no incumbent
                entry = None
        if entry is not None:
            out[(sig, key)] = candidate_key(engine_name_to_id(entry.engine_name), tuple(sorted(entry.knobs)))
    return out


def decide_results(data: ResultsDataset | str | Path, *, incumbents: dict[str, Any] | None = None,
                   top_k: int = 3) -> Decisions:
    """The winner of every (signature, problem) in a results dataset (no file is written).

    ``incumbents`` maps a signature to its current override file (an :class:`~farm.store.overrides.OverrideFile`):
    the candidate it names for a problem gets the incumbent's benefit of the doubt.
    """
    data = data if isinstance(data, ResultsDataset) else ResultsDataset(data)
    table, has_stage, tuned, read, dropped = _load_successes(data)
    skipped = [(f.path, f.reason) for f in data.skipped]
    median = table["median_ms"].to_numpy(zero_copy_only=False).astype(float)
    fallback = table["min_ms"].to_numpy(zero_copy_only=False).astype(float)
    median = np.where(np.isnan(median), fallback, median)
    # a row without a usable time (NaN, infinite, zero, negative) cannot be compared: it never wins
    usable = np.isfinite(median) & (median > 0)
    table = table.filter(pa.array(usable))
    median = median[usable]
    if table.num_rows == 0:
        return Decisions(table, {}, {}, tuned, skipped, read)
    group = np.cumsum(_changes(table["device_signature"]) | _changes(table["problem_key"])) - 1
    rows = _compared_rows(table, group)
    c = _Compared(table, rows, median, np.unique(group[rows], return_inverse=True)[1])
    failures = _stage_failures(data, dropped) if dropped else {}
    default_failed = c.drop_failed_defaults(failures) if failures else {}
    d = decide_groups(c.group, median[rows], c.mad[rows], c.order[rows], default=c.default[rows],
                      incumbent=c.incumbent_flags(incumbents)[rows], top_k=max(top_k, 1))
    top: dict[tuple[str, str], list[int]] = {}
    for g, row in zip(c.group[d.ranking_rows].tolist(), rows[d.ranking_rows].tolist()):
        top.setdefault((c.sigs[g], c.pkeys[g]), []).append(row)
    winners = _winners(c, d, tuned)
    if has_stage:
        table, winners = _apply_confirmations(data, table, c, d, winners, failures, default_failed, top)
        table, winners = _apply_verifications(data, table, winners, top)
    winners = apply_model_checks(data, table, winners, top)
    if failures:
        winners = _note_failures(winners, failures, default_failed)
    return Decisions(table, winners, top, tuned, skipped, read)


def _note_failures(winners: dict[tuple[str, str], Winner], failures: dict[tuple[str, str], dict[str, StageFailure]],
                   default_failed: dict[tuple[str, str], StageFailure]) -> dict[tuple[str, str], Winner]:
    """Decisions of problems whose stage dropped candidates say so (a stage's own decision says it already)."""
    out = dict(winners)
    for key, found in failures.items():
        w = out.get(key)
        if w is None:
            continue
        labels = tuple(f.label for f in found.values())
        w = dataclasses.replace(w, stage_failed=labels,
                                others=tuple(dataclasses.replace(o, stage_failed=labels) for o in w.others))
        out[key] = w
        if w.confirmed is not None:
            continue
        gone = default_failed.get(key)
        note = "; ".join(f.describe() for f in found.values())
        why = (f"the default, {gone.label}, failed in the confirmation stage; decided on the main round without it "
               f"({w.why or 'the fastest'})" if gone is not None else
               f"{w.why or 'the fastest'}; decided on the main round")
        out[key] = dataclasses.replace(w, why=f"{why}; failed in the confirmation stage, never published: {note}",
                                       **({"default": gone.label, "default_ms": None} if gone is not None else {}))
    return out


def _compared_rows(table: pa.Table, group: np.ndarray) -> np.ndarray:
    """The rows each problem's decision compares: all, or the latest finalist round's where it had one.

    A finalist round measures the candidates of several sessions together on one device; an earlier
    round may have been cut short, or have missed later candidates.
    """
    finalist = pc.equal(_strings(table["round"]), "finalist").to_numpy(zero_copy_only=False).astype(bool)
    if not finalist.any():
        return np.arange(table.num_rows)
    final_rows = np.flatnonzero(finalist)
    keep = ~_in_groups(group, finalist)
    keep[final_rows[_latest_session(table, group, final_rows)]] = True
    return np.flatnonzero(keep)


class _Compared:
    """The columns a decision reads, and per compared group its signature and problem key."""

    def __init__(self, table: pa.Table, rows: np.ndarray, median: np.ndarray, group: np.ndarray) -> None:
        self.table, self.rows, self.median, self.group = table, rows, median, group
        self.mad = table["mad_ms"].to_numpy(zero_copy_only=False).astype(float)
        self.order = table["candidate_index"].to_numpy(zero_copy_only=False).astype(np.int64)
        self._keys = _strings(table["candidate_key"])
        # default knobs; the earliest per group counts
        self.default = np.array(pc.ends_with(self._keys, ":[]").to_numpy(zero_copy_only=False), dtype=bool)
        self.first = rows[np.r_[True, group[1:] != group[:-1]]]
        self.sigs = _strings(table["device_signature"].take(pa.array(self.first))).to_pylist()
        self.pkeys = _strings(table["problem_key"].take(pa.array(self.first))).to_pylist()
        self._names = _strings(table["engine_name"])
        self.names: dict[int, str] = {}  # row -> engine name, for the rows a decision names (filled by name_rows)
        self.keys: dict[int, str] = {}  # row -> candidate key, likewise
        self.incumbent_keys: dict[tuple[str, str], str] = {}  # (signature, problem key) -> the incumbent's key

    def incumbent_flags(self, incumbents: dict[str, Any] | None) -> np.ndarray:
        flags = np.zeros(self.table.num_rows, dtype=bool)
        if incumbents:
            named = _incumbent_keys(self.table, self.first, self.sigs, self.pkeys, incumbents)
            self.incumbent_keys = named
            if named:
                wanted = pa.array([named.get((self.sigs[g], self.pkeys[g]), "") for g in self.group.tolist()],
                                  pa.string())
                flags[self.rows] = pc.equal(self._keys.take(pa.array(self.rows)), wanted).to_numpy(
                    zero_copy_only=False)
        return flags

    def drop_failed_defaults(self, failures: dict[tuple[str, str], dict[str, StageFailure]]
                             ) -> dict[tuple[str, str], StageFailure]:
        """Where the problem's default (its first default-knob candidate, dropped ones counted) failed in a
        confirmation stage, no other candidate takes its place: the default flags of that group are cleared.
        Returns (signature, problem key) -> the failed default's failure."""
        out: dict[tuple[str, str], StageFailure] = {}
        for g, (sig, pkey) in enumerate(zip(self.sigs, self.pkeys)):
            gone = [f for f in failures.get((sig, pkey), {}).values() if f.is_default]
            if not gone:
                continue
            first = min(gone, key=lambda f: f.index)
            mine = self.rows[self.group == g]
            present = self.order[mine][self.default[mine]]
            if present.size == 0 or first.index < int(present.min()):
                self.default[mine] = False
                out[(sig, pkey)] = first
        return out

    def name_rows(self, *rows: np.ndarray) -> None:
        """Read the engine names and candidate keys of these rows (the others are never shown)."""
        wanted = np.unique(np.concatenate([np.asarray(r)[np.asarray(r) >= 0] for r in rows]))
        idx = pa.array(wanted)
        self.names.update(zip(wanted.tolist(), self._names.take(idx).to_pylist()))
        self.keys.update(zip(wanted.tolist(), self._keys.take(idx).to_pylist()))

    def label(self, i: int) -> str:
        return _label(self.names[i], self.keys[i])


def _winners(c: _Compared, d: Any, tuned: dict[str, set[str]]) -> dict[tuple[str, str], Winner]:
    """One Winner per group of ``decide_groups``' answer ``d``; groups whose rows name another device are left out."""
    rows, median, table = c.rows, c.median, c.table
    winner, fastest = rows[d.winner], rows[d.fastest]
    dflt = np.where(d.default >= 0, rows[np.maximum(d.default, 0)], -1)
    counts = np.bincount(c.group)
    problem_names = _strings(table["problem_name"].take(pa.array(winner))).to_pylist()
    mins = table["min_ms"].to_numpy(zero_copy_only=False).astype(float)
    noisy, sigma = is_noisy(median, c.mad), noise_sigma(c.mad)
    c.name_rows(winner, fastest, dflt)
    devices = _strings(table["device_json"].take(pa.array(winner))).to_pylist()
    rounds = _strings(table["round"].take(pa.array(winner))).to_pylist()
    row_sigs = [_signature_in(x) for x in devices]
    out: dict[tuple[str, str], Winner] = {}
    for g, (w, f, df) in enumerate(zip(winner.tolist(), fastest.tolist(), dflt.tolist())):
        sig, pkey = c.sigs[g], c.pkeys[g]
        if row_sigs[g] != sig:
            # the folder's name and the rows disagree: trust neither with an override file
            log.warning("reduce: rows under device_signature=%s are for device %r; problem %s skipped",
                        sig, row_sigs[g], pkey)
            tuned.get(sig, set()).discard(pkey)
            continue
        rule = Rule(d.rule[g])
        phrase = why(rule, winner_ms=float(median[w]), fastest_ms=float(median[f]), fastest_label=c.label(f),
                     threshold_ms=float(d.threshold_ms[g]),
                     fastest_noise=float(sigma[f] / median[f]) if median[f] else 0.0)
        out[(sig, pkey)] = Winner(
            signature=sig, problem_key=pkey, problem_name=problem_names[g], engine_name=c.names[w],
            knobs=knobs_of(c.keys[w]), median_ms=float(median[w]), min_ms=_float(mins[w]), mad_ms=_float(c.mad[w]),
            noisy=bool(noisy[w]), rule=rule, why=phrase, fastest=c.label(f), fastest_ms=float(median[f]),
            default=c.label(df) if df >= 0 else None, default_ms=float(median[df]) if df >= 0 else None,
            candidates=int(counts[g]), row=w, default_noisy=bool(noisy[df]) if df >= 0 else False,
            round=rounds[g] or "main", default_row=df)
    return out


_CONFIRM_COLUMNS = (*_COLUMNS, "call", "samples_ms", "tuning_ms", "session_size", "succeeded", "host_cpu",
                    "calls_per_sample", "input_sets", "call_path")
_VERIFY_COLUMNS = (*_CONFIRM_COLUMNS, "verdict")


def load_confirmations(data: ResultsDataset, round: str = CONFIRM) -> pa.Table:
    """The successful rows of every whole confirmation stage (``round``: or verify session), with their samples
    (paired by position within a session). A stage with fewer rows on disk than its ``session_size`` was cut
    short: its rows are left out."""
    columns = _VERIFY_COLUMNS if round == VERIFY else _CONFIRM_COLUMNS
    t = data.table(list(columns), filter=ds.field("round") == round, dictionary=_DICT_COLUMNS)
    if t.num_rows == 0:
        return t
    sessions = _strings(t["session_id"]).combine_chunks()
    counts = pa.table({"s": sessions}).group_by("s").aggregate([("s", "count")])
    rows_on_disk = pc.take(counts["s_count"], pc.index_in(sessions, counts["s"]))
    whole = pc.greater_equal(rows_on_disk, pc.fill_null(t["session_size"], 0))
    usable = pa.array(_usable(t["median_ms"], t["min_ms"], t["avg_ms"]))  # an old part's NaN or negative times
    return t.filter(pc.and_(pc.and_(whole, t["succeeded"]), usable))


def _apply_confirmations(data: ResultsDataset, table: pa.Table, c: "_Compared", d: Any,
                         winners: dict[tuple[str, str], Winner],
                         failures: dict[tuple[str, str], dict[str, StageFailure]] | None = None,
                         default_failed: dict[tuple[str, str], StageFailure] | None = None,
                         top: dict[tuple[str, str], list[int]] | None = None,
                         ) -> tuple[pa.Table, dict[tuple[str, str], Winner]]:
    """Decide every problem that has a confirmation stage from its latest session per calling mode
    (farm.tuner.winner.decide_confirmed); its rows join the decided table so the winner's row is there.
    A candidate in ``failures`` (failed in a stage) is in no decision; where the default is one of them
    (``default_failed``), the rest are compared with no one given the default's benefit of the doubt.
    ``top`` (the main round's ranking per problem) is updated in place: a decided problem's ranking is its stage's."""
    failures, default_failed = failures or {}, default_failed or {}
    conf = load_confirmations(data)
    if conf.num_rows == 0:
        return table, winners
    conf = conf.sort_by([("device_signature", "ascending"), ("problem_key", "ascending"), ("call", "ascending"),
                         ("measured_at", "descending")])
    sigs = _strings(conf["device_signature"]).to_pylist()
    pkeys = _strings(conf["problem_key"]).to_pylist()
    calls = _strings(conf["call"]).to_pylist()
    sessions = _strings(conf["session_id"]).to_pylist()
    keys = _strings(conf["candidate_key"]).to_pylist()
    names = _strings(conf["engine_name"]).to_pylist()
    costs = conf["tuning_ms"].to_numpy(zero_copy_only=False).astype(float)
    cpus = _strings(conf["host_cpu"]).to_pylist()
    per_sample = conf["calls_per_sample"].to_pylist()
    set_counts = conf["input_sets"].to_pylist()
    paths = _strings(conf["call_path"]).to_pylist()
    lists = conf["samples_ms"].combine_chunks()
    values = lists.values.to_numpy(zero_copy_only=False).astype(float)
    offsets = lists.offsets.to_numpy()
    groups: dict[tuple[str, str, str], list[int]] = {}
    latest: dict[tuple[str, str, str], str] = {}
    for i, key in enumerate(zip(sigs, pkeys, calls)):
        if key not in latest:
            latest[key] = sessions[i]  # rows are sorted newest first within a problem and mode
        if sessions[i] == latest[key] and keys[i] not in failures.get(key[:2], ()):
            groups.setdefault(key, []).append(i)
    defaults = {(c.sigs[g], c.pkeys[g]): c.keys[c.rows[r]] for g, r in enumerate(d.default.tolist()) if r >= 0}
    offset = table.num_rows
    decided: dict[tuple[str, str], list[Winner]] = {}
    stage_top: dict[tuple[str, str, str], list[int]] = {}
    for (sig, pkey, call), rows in groups.items():
        main = winners.get((sig, pkey))
        if main is None or len(rows) < 2:
            continue
        want, inc_key = defaults.get((sig, pkey)), c.incumbent_keys.get((sig, pkey))
        gone = default_failed.get((sig, pkey))
        dec, order = decide_stage([keys[i] for i in rows], [values[offsets[i]:offsets[i + 1]] for i in rows],
                                  default_key=want, incumbent_key=inc_key,
                                  default_flags=[keys[i].endswith(":[]") for i in rows], default_failed=gone is not None)
        rows = [rows[j] for j in order]
        samples = [values[offsets[i]:offsets[i + 1]] for i in rows]
        row_keys = [keys[i] for i in rows]
        ref = dec.reference

        def label(j: int) -> str:
            return _label(names[rows[j]], row_keys[j]) if j >= 0 else ""

        med = [float(np.median(x)) if len(x) else math.nan for x in samples]
        mad = [float(np.median(np.abs(x - m))) if len(x) else math.nan for x, m in zip(samples, med)]
        w = dec.winner
        fastest = min(range(len(rows)), key=lambda j: (med[j], j))
        versus = dec.versus
        best = dec.challengers.get(dec.best) if dec.best >= 0 else None
        ties = tuple(label(j) for j in range(len(rows))
                     if j != w and paired_ratio(samples[j], samples[w]).includes_one())
        won = w != ref
        confirmation = Confirmation(
            call=call, rounds=min((len(x) for x in samples), default=0), settled=dec.settled,
            cost_ms=float(np.nansum(costs[rows])), speedup=versus.speedup if won and versus else None,
            low=versus.speedup_low if won and versus else None, high=versus.speedup_high if won and versus else None,
            best=label(dec.best), best_speedup=best.speedup if best else None,
            best_low=best.speedup_low if best else None, best_high=best.speedup_high if best else None, ties=ties,
            host_cpus=tuple(sorted({cpus[i] for i in rows if cpus[i]})), calls_per_sample=per_sample[rows[ref]],
            input_sets=set_counts[rows[ref]], default_call=paths[rows[ref]] or "",
            default_failed=gone.reason if gone is not None else "",
            failed=tuple(f.describe() for f in failures.get((sig, pkey), {}).values()))
        phrase = confirmed_why(dec, label)
        if gone is not None:
            phrase = (f"the default, {gone.label}, failed in the confirmation stage ({gone.reason}): "
                      f"{label(w)} is the fastest of the rest ({dec.versus.describe() + ' against ' + label(dec.best) if dec.versus and dec.best >= 0 else 'nothing else finished'})")
        elif confirmation.failed:
            phrase = f"{phrase}; failed in the confirmation stage, never published: {'; '.join(confirmation.failed)}"
        decided.setdefault((sig, pkey), []).append(dataclasses.replace(
            main, engine_name=names[rows[w]], knobs=knobs_of(row_keys[w]), median_ms=med[w],
            min_ms=float(np.min(samples[w])) if len(samples[w]) else None, mad_ms=mad[w],
            noisy=bool(is_noisy(np.array([med[w]]), np.array([mad[w]]))[0]), rule=dec.rule,
            why=phrase, fastest=label(fastest), fastest_ms=med[fastest],
            default=gone.label if gone is not None else label(ref), default_ms=None if gone is not None else med[ref],
            row=offset + rows[w], confirmed=confirmation, round=CONFIRM,
            default_row=offset + rows[ref] if ref >= 0 and gone is None else -1))
        # the stage's ranking, winner first: what top_k lists for this decision (its figures are the stage's)
        stage_top[(sig, pkey, call)] = [offset + rows[w]] + [offset + rows[j] for j in sorted(
            range(len(rows)), key=lambda j: (med[j], j)) if j != w]
    if not decided:
        return table, winners
    out = dict(winners)
    for key, found in decided.items():
        found.sort(key=lambda w: CALL_ORDER.get(w.call, len(CALL_ORDER)))
        out[key] = dataclasses.replace(found[0], others=tuple(found[1:]))
        if top is not None:  # the stage's ranking first, then the main round's candidates the stage did not measure
            mine = stage_top[(*key, found[0].call)]
            measured = {keys[i - offset] for i in mine}
            top[key] = mine + [i for i in top.get(key, []) if _key_at(table, i) not in measured]
    return pa.concat_tables([table, conf.select(list(_COLUMNS))], promote_options="permissive"), out


CALL_ORDER = {"eager": 0, "graph": 1}  # the primary decision of a problem: its eager one, when it has one


def _apply_verifications(data: ResultsDataset, table: pa.Table, winners: dict[tuple[str, str], Winner],
                         top: dict[tuple[str, str], list[int]] | None = None,
                         ) -> tuple[pa.Table, dict[tuple[str, str], Winner]]:
    """Attach farm verify's checks to the decisions they checked (per calling mode). The newest check of the
    decision the stage made, not older than the stage, decides: where it fixed the decision, the default is
    published in its place (rule ``not_delivered``), and the newest check of that default (a later farm verify)
    is attached to it. A check of a candidate that is not the decision (a later tune changed it) is left aside."""
    ver = load_confirmations(data, VERIFY)
    if ver.num_rows == 0:
        return table, winners
    ver = ver.sort_by([("device_signature", "ascending"), ("problem_key", "ascending"), ("call", "ascending"),
                       ("measured_at", "descending")])
    col = {name: _strings(ver[name]).to_pylist() for name in ("device_signature", "problem_key", "call", "session_id",
                                                              "candidate_key", "engine_name", "call_path", "verdict",
                                                              "host_cpu")}
    per_sample, set_counts = ver["calls_per_sample"].to_pylist(), ver["input_sets"].to_pylist()
    stamps = pc.cast(ver["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)
    when = pc.strftime(ver["measured_at"].cast(pa.timestamp("s", tz="UTC"), safe=False),
                       format="%Y-%m-%dT%H:%M:%SZ").to_pylist()
    lists = ver["samples_ms"].combine_chunks()
    values = lists.values.to_numpy(zero_copy_only=False).astype(float)
    offsets = lists.offsets.to_numpy()
    # (signature, problem, call) -> its sessions, newest first: (replay row, direct row)
    sessions: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    by_id: dict[str, list[int]] = {}
    for i, sid in enumerate(col["session_id"]):
        by_id.setdefault(sid, []).append(i)
    for rows in sorted(by_id.values(), key=lambda r: r[0]):
        replay = next((i for i in rows if col["call_path"][i] == "replay"), None)
        direct = next((i for i in rows if i != replay), None)
        if replay is not None and direct is not None:
            key = (col["device_signature"][replay], col["problem_key"][replay], col["call"][replay])
            sessions.setdefault(key, []).append((replay, direct))
    made_at = pc.cast(table["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)
    offset = table.num_rows

    def check_of(call: str, replay: int, direct: int) -> Verification:
        mine, theirs = values[offsets[replay]:offsets[replay + 1]], values[offsets[direct]:offsets[direct + 1]]
        r = paired_ratio(mine, theirs)
        ok = r.rounds > 0 and math.isfinite(r.ratio)
        return Verification(call=call, delivered=r.speedup if ok else None, low=r.speedup_low if ok else None,
                            high=r.speedup_high if ok else None, rounds=r.rounds, verdict=col["verdict"][replay],
                            host_cpu=col["host_cpu"][replay],
                            direct=_label(col["engine_name"][direct], col["candidate_key"][direct]),
                            calls_per_sample=per_sample[replay], input_sets=set_counts[replay],
                            verified_at=when[replay])

    def newest(found: list[tuple[int, int]], decision: Winner, since: int) -> tuple[int, int] | None:
        want = candidate_key(engine_name_to_id(decision.engine_name), decision.knobs)
        return next(((r, d) for r, d in found if col["candidate_key"][r] == want and stamps[r] >= since), None)

    out = dict(winners)
    for (sig, pkey, call), found in sessions.items():
        main = out.get((sig, pkey))
        decision = main.for_call(call) if main is not None else None
        if decision is None:
            continue
        since = int(made_at[decision.row]) if 0 <= decision.row < len(made_at) else 0  # the stage's own time
        hit = newest(found, decision, since)
        if hit is None:
            continue
        check = check_of(call, *hit)
        if check.fixed:
            decision = _fixed(decision, check, col["engine_name"][hit[1]], knobs_of(col["candidate_key"][hit[1]]),
                              values[offsets[hit[1]]:offsets[hit[1] + 1]], offset + hit[1])
            later = newest(found, decision, int(stamps[hit[0]]))  # the default's own check since, if any
            if later is not None and later != hit:
                decision = dataclasses.replace(decision, verified=check_of(call, *later))
            if top is not None and main.for_call(call) is main:  # the published default ranks first
                top[(sig, pkey)] = [decision.row] + [i for i in top.get((sig, pkey), [])
                                                     if _key_at(table, i) != col["candidate_key"][hit[1]]]
        else:
            decision = dataclasses.replace(decision, verified=check)
        out[(sig, pkey)] = main.with_call(call, decision)  # type: ignore[union-attr]
    return pa.concat_tables([table, ver.select(list(_COLUMNS))], promote_options="permissive"), out


def _fixed(decision: Winner, check: Verification, engine: str, knobs: KnobSettings, samples: np.ndarray,
           row: int) -> Winner:
    """The default in place of a decision farm verify fixed, timed by that check's direct calls."""
    from farm.tuner.winner import ConfirmedRule

    med = float(np.median(samples)) if len(samples) else math.nan
    conf = decision.confirmed
    return dataclasses.replace(
        decision, engine_name=engine, knobs=knobs, median_ms=med, min_ms=float(np.min(samples)) if len(samples) else None,
        mad_ms=float(np.median(np.abs(samples - med))) if len(samples) else None, noisy=False,
        rule=ConfirmedRule.NOT_DELIVERED,
        why=f"default published by farm verify: {decision.label} {check.verdict.split(': ', 1)[-1]}",
        row=row, verified=check, round=VERIFY,
        confirmed=dataclasses.replace(conf, speedup=None, low=None, high=None) if conf is not None else None)


def _key_at(table: pa.Table, row: int) -> str:
    """The candidate key of one row of the decided table."""
    return str(table["candidate_key"][row].as_py())


def _in_groups(group: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Per row: some row of its group has ``flag``."""
    has = np.zeros(int(group.max()) + 1 if len(group) else 0, dtype=bool)
    has[group[flag]] = True
    return has[group]


def _latest_session(table: pa.Table, group: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For ``rows``: the row belongs to its group's most recently measured session among ``rows``."""
    sessions = _strings(table["session_id"].take(pa.array(rows))).to_numpy(zero_copy_only=False).astype(str)
    when = pc.cast(table["measured_at"].take(pa.array(rows)), pa.int64()).to_numpy(zero_copy_only=False)
    g = group[rows]
    last: dict[int, tuple[int, str]] = {}
    for gi, t, s in zip(g.tolist(), when.tolist(), sessions.tolist()):
        if gi not in last or (t, s) > last[gi]:
            last[gi] = (t, s)
    return np.array([s == last[gi][1] for gi, s in zip(g.tolist(), sessions.tolist())], dtype=bool)


def decide_folder(results_dir: str | Path) -> Decisions:
    """The reducer's decisions for a results folder, with the incumbents its job used (job.json), if any.

    ``farm report`` and ``farm diff`` call this, so they show what ``farm tune`` wrote.
    """
    data = ResultsDataset(results_dir)
    record = job_record(data)
    if not isinstance(record.get("settings"), dict):
        record = {"settings": {}}
    return decide_results(data, incumbents=load_incumbents((record.get("settings") or {}).get("incumbents"), data))


def job_record(data: ResultsDataset) -> dict[str, Any]:
    """The record (job.json) of the job folder holding these results, local or on shared storage; {} when there is
    none or it is not a JSON object (farm tune moves a corrupt record aside when it resumes)."""
    if data.location.name != "results":
        return {}
    try:
        text = data.location.parent().read_text("job.json")
        record = json.loads(text) if text is not None else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


@functools.lru_cache(maxsize=1024)
def _signature_in(device_json: str) -> str:
    try:
        value = json.loads(device_json).get("signature")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def load_incumbents(source: str | Path | None, data: ResultsDataset) -> dict[str, Any]:
    """signature -> the override file whose winners are the incumbents for it (exact signatures only).

    ``source`` is one override file, a folder of ``<signature>.json`` files, or a published root
    (``farm publish``'s layout, local or ``s3://``/``gs://``); None means no incumbents.
    """
    if not source:
        return {}
    from farm.devices.properties import DeviceProperties

    source = str(source)
    if "://" not in source and not os.path.exists(source):
        log.warning("reduce: incumbents %s not found; no incumbents", source)
        return {}
    t = data.table(["device_signature", "device_json"]) if data.files else None
    devices = {} if t is None else dict(zip(t["device_signature"].to_pylist(), t["device_json"].to_pylist()))
    found: dict[str, Any] = {}
    for sig, device_json in devices.items():
        f = incumbent_file(source, DeviceProperties.from_dict(json.loads(device_json)))
        if f is not None:
            found[sig] = f
    return found


def incumbent_file(source: str | Path | None, props: Any) -> Any:
    """The override file (an :class:`~farm.store.overrides.OverrideFile`) holding the incumbents for the device
    ``props`` describes, from one file, a folder of ``<signature>.json`` files or a published root; None
    when there is none for that exact signature (or it cannot be read: a warning says so)."""
    from farm.errors import FarmError
    from farm.store.published import find_published

    if not source:
        return None
    source, sig = str(source), props.signature
    path = ""
    if "://" not in source and os.path.isfile(source):
        path = source
    elif "://" not in source and os.path.isfile(os.path.join(source, f"{sig}.json")):
        path = os.path.join(source, f"{sig}.json")
    elif "://" in source or os.path.isdir(source):
        hit = find_published(source, props)
        path = hit[0] if hit is not None and not hit[1] else ""  # another signature is no incumbent
    if not path:
        return None
    try:
        f = load_overrides(path)
    except FarmError as exc:
        log.warning("reduce: incumbents file %s unreadable (%s); none for %s", path, exc, sig)
        return None
    return f if path != source or f.device_signature == sig else None  # one file: for its own signature only


def incumbent_spec(f: Any, problem: Any) -> Any:
    """The plan spec the incumbent file names for ``problem`` (by its problem key, else by matching), or None."""
    from farm.model.plans import PlanSpec

    if f is None:
        return None
    entry = next((e for e in f.entries if (e.metadata or {}).get("problem_key") == problem.key), None) \
        or f.match(problem)
    return PlanSpec(engine_name_to_id(entry.engine_name), tuple(sorted(entry.knobs))) if entry is not None else None
