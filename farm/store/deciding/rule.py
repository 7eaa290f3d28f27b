"""The reducer's decisions: the winner of every (signature, problem) in a results dataset, by farm.tuner.judging.winner's
rule over the main (or latest finalist) round, then each problem's confirmation stage, farm verify's checks and
the model checks, in that order (farm.store.deciding's modules, one each)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from farm.store.dataset import ResultsDataset
from farm.store.deciding.confirmations import apply_confirmations
from farm.store.deciding.incumbents import incumbent_keys, job_record, load_incumbents
from farm.store.deciding.loading import as_float, changes, knobs_of, label_of, scan_successes, stage_failures, strings
from farm.store.deciding.model_checks import apply_model_checks
from farm.store.deciding.records import Decisions, StageFailure, Winner
from farm.store.deciding.verifications import apply_verifications
from farm.tuner.judging.winner import Rule, decide_groups, is_noisy, noise_sigma, why

log = logging.getLogger("farm.store.deciding")


def decide_results(data: ResultsDataset | str | Path, *, incumbents: dict[str, Any] | None = None,
                   top_k: int = 3) -> Decisions:
    """The winner of every (signature, problem) in a results dataset (no file is written).

    ``incumbents`` maps a signature to its current override file (an :class:`~farm.store.overrides.OverrideFile`):
    the candidate it names for a problem gets the incumbent's benefit of the doubt.
    """
    data = data if isinstance(data, ResultsDataset) else ResultsDataset(data)
    table, has_stage, tuned, read, dropped = scan_successes(data)
    skipped = [(f.path, f.reason) for f in data.skipped]
    median = table["median_ms"].to_numpy(zero_copy_only=False).astype(float)
    fallback = table["min_ms"].to_numpy(zero_copy_only=False).astype(float)
    median = np.where(np.isnan(median), fallback, median)
    # a row without a usable time (NaN, infinite, zero, negative) cannot be compared: it never wins
    timed = np.isfinite(median) & (median > 0)
    table = table.filter(pa.array(timed))
    median = median[timed]
    if table.num_rows == 0:
        return Decisions(table, {}, {}, tuned, skipped, read)
    group = np.cumsum(changes(table["device_signature"]) | changes(table["problem_key"])) - 1
    rows = compared_rows(table, group)
    c = Compared(table, rows, median, np.unique(group[rows], return_inverse=True)[1])
    failures = stage_failures(data, dropped) if dropped else {}
    default_failed = c.drop_failed_defaults(failures) if failures else {}
    d = decide_groups(c.group, median[rows], c.mad[rows], c.order[rows], default=c.default[rows],
                      incumbent=c.incumbent_flags(incumbents)[rows], top_k=max(top_k, 1))
    top: dict[tuple[str, str], list[int]] = {}
    for g, row in zip(c.group[d.ranking_rows].tolist(), rows[d.ranking_rows].tolist()):
        top.setdefault((c.sigs[g], c.pkeys[g]), []).append(row)
    winners = winners_of(c, d, tuned)
    if has_stage:
        table, winners = apply_confirmations(data, table, c, d, winners, failures, default_failed, top)
        table, winners = apply_verifications(data, table, winners, top)
    winners = apply_model_checks(data, table, winners, top)
    if failures:
        winners = note_failures(winners, failures, default_failed)
    return Decisions(table, winners, top, tuned, skipped, read)


def note_failures(winners: dict[tuple[str, str], Winner], failures: dict[tuple[str, str], dict[str, StageFailure]],
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


def compared_rows(table: pa.Table, group: np.ndarray) -> np.ndarray:
    """The rows each problem's decision compares: all, or the latest finalist round's where it had one.

    A finalist round measures the candidates of several sessions together on one device; an earlier
    round may have been cut short, or have missed later candidates.
    """
    finalist = pc.equal(strings(table["round"]), "finalist").to_numpy(zero_copy_only=False).astype(bool)
    if not finalist.any():
        return np.arange(table.num_rows)
    final_rows = np.flatnonzero(finalist)
    keep = ~in_groups(group, finalist)
    keep[final_rows[latest_session(table, group, final_rows)]] = True
    return np.flatnonzero(keep)


class Compared:
    """The columns a decision reads, and per compared group its signature and problem key."""

    def __init__(self, table: pa.Table, rows: np.ndarray, median: np.ndarray, group: np.ndarray) -> None:
        self.table, self.rows, self.median, self.group = table, rows, median, group
        self.mad = table["mad_ms"].to_numpy(zero_copy_only=False).astype(float)
        self.order = table["candidate_index"].to_numpy(zero_copy_only=False).astype(np.int64)
        self._keys = strings(table["candidate_key"])
        # default knobs; the earliest per group counts
        self.default = np.array(pc.ends_with(self._keys, ":[]").to_numpy(zero_copy_only=False), dtype=bool)
        self.first = rows[np.r_[True, group[1:] != group[:-1]]]
        self.sigs = strings(table["device_signature"].take(pa.array(self.first))).to_pylist()
        self.pkeys = strings(table["problem_key"].take(pa.array(self.first))).to_pylist()
        self._names = strings(table["engine_name"])
        self.names: dict[int, str] = {}  # row -> engine name, for the rows a decision names (filled by name_rows)
        self.keys: dict[int, str] = {}  # row -> candidate key, likewise
        self.incumbent_keys: dict[tuple[str, str], str] = {}  # (signature, problem key) -> the incumbent's key

    def incumbent_flags(self, incumbents: dict[str, Any] | None) -> np.ndarray:
        flags = np.zeros(self.table.num_rows, dtype=bool)
        if incumbents:
            named = incumbent_keys(self.table, self.first, self.sigs, self.pkeys, incumbents)
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
        return label_of(self.names[i], self.keys[i])


def winners_of(c: Compared, d: Any, tuned: dict[str, set[str]]) -> dict[tuple[str, str], Winner]:
    """One Winner per group of ``decide_groups``' answer ``d``; groups whose rows name another device are left out."""
    rows, median, table = c.rows, c.median, c.table
    winner, fastest = rows[d.winner], rows[d.fastest]
    dflt = np.where(d.default >= 0, rows[np.maximum(d.default, 0)], -1)
    counts = np.bincount(c.group)
    problem_names = strings(table["problem_name"].take(pa.array(winner))).to_pylist()
    mins = table["min_ms"].to_numpy(zero_copy_only=False).astype(float)
    noisy, sigma = is_noisy(median, c.mad), noise_sigma(c.mad)
    c.name_rows(winner, fastest, dflt)
    devices = strings(table["device_json"].take(pa.array(winner))).to_pylist()
    rounds = strings(table["round"].take(pa.array(winner))).to_pylist()
    row_sigs = [signature_in(x) for x in devices]
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
            knobs=knobs_of(c.keys[w]), median_ms=float(median[w]), min_ms=as_float(mins[w]), mad_ms=as_float(c.mad[w]),
            noisy=bool(noisy[w]), rule=rule, why=phrase, fastest=c.label(f), fastest_ms=float(median[f]),
            default=c.label(df) if df >= 0 else None, default_ms=float(median[df]) if df >= 0 else None,
            candidates=int(counts[g]), row=w, default_noisy=bool(noisy[df]) if df >= 0 else False,
            round=rounds[g] or "main", default_row=df)
    return out


def in_groups(group: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Per row: some row of its group has ``flag``."""
    has = np.zeros(int(group.max()) + 1 if len(group) else 0, dtype=bool)
    has[group[flag]] = True
    return has[group]


def latest_session(table: pa.Table, group: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For ``rows``: the row belongs to its group's most recently measured session among ``rows``."""
    sessions = strings(table["session_id"].take(pa.array(rows))).to_numpy(zero_copy_only=False).astype(str)
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


@functools.lru_cache(maxsize=1024)
def signature_in(device_json: str) -> str:
    try:
        value = json.loads(device_json).get("signature")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""
