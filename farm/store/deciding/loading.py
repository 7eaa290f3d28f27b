"""Reading a results dataset for the reducer: the rows a decision compares (latest successful per candidate),
the confirmation stage's and farm verify's whole sessions with their samples, and the candidates that failed in
a stage. Columns are read dictionary-encoded and compared as integer codes (a million rows in seconds)."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from farm.model.knobs import candidate_label
from farm.store.dataset import ResultsDataset
from farm.store.deciding.records import CONFIRM, VERIFY, StageFailure
from farm.store.results import CHECK_ROUNDS
from farm.model.plans import spec_of

DICT_COLUMNS = ("problem_json", "problem_name", "engine_name", "device_json", "round", "mode", "strategy", "job_id",
                "session_id")
COLUMNS = ("device_signature", "problem_key", "candidate_key", "candidate_index", "engine_name", "problem_json",
           "problem_name", "device_json", "round", "session_id", "mode", "strategy", "job_id", "measured_at", "min_ms",
           "avg_ms", "stddev_ms", "median_ms", "mad_ms", "iterations", "converged", "workspace_bytes", "ran_exhaustive",
           "supports_exhaustive", "exhaustive_not_run_reason", "op")


def strings(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col


def changes(col: pa.ChunkedArray) -> np.ndarray:
    """Boolean array: row i differs from row i-1 (row 0 always True)."""
    arr = strings(col).combine_chunks()
    n = len(arr)
    out = np.ones(n, dtype=bool)
    if n > 1:
        out[1:] = pc.not_equal(arr.slice(1), arr.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return out


def usable(*cols: pa.ChunkedArray) -> np.ndarray:
    """Rows whose times are all usable measurements (finite, above zero; a null is not)."""
    ok = np.ones(len(cols[0]), dtype=bool)
    for col in cols:
        v = col.to_numpy(zero_copy_only=False).astype(float)  # nulls read as NaN
        ok &= np.isfinite(v) & (v > 0)
    return ok


def load_successes(data: ResultsDataset) -> pa.Table:
    """Successful rows of the main and finalist rounds, latest per (signature, problem, candidate), grouped by
    signature and problem (the confirmation stage's rows are read apart: load_confirmations)."""
    return scan_successes(data)[0]


def scan_successes(data: ResultsDataset) -> tuple[pa.Table, bool, dict[str, set[str]], int,
                                                  dict[tuple[str, str], set[str]]]:
    """One scan for the decision: :func:`load_successes`' table, whether the dataset has confirmation rows,
    signature -> every problem key with rows of any disposition, the rows read, and (signature, problem key) ->
    the candidate keys that failed in a confirmation stage since their main-round row (left out of the table:
    never published until measured again)."""
    t = data.table([*COLUMNS, "succeeded"], dictionary=DICT_COLUMNS)
    rows = t.num_rows
    sig, pkey = codes(t["device_signature"]), codes(t["problem_key"])
    tuned: dict[str, set[str]] = {}
    if rows:
        combo = sig.astype(np.int64) * (int(pkey.max()) + 1) + pkey
        at = pa.array(np.unique(combo, return_index=True)[1])  # a row of each (signature, problem)
        for s, p in zip(strings(t["device_signature"].take(at)).to_pylist(), strings(t["problem_key"].take(at)).to_pylist()):
            tuned.setdefault(s, set()).add(p)
    keep = t["succeeded"].to_numpy(zero_copy_only=False).astype(bool) if rows else np.zeros(0, bool)
    rounds = strings(t["round"])
    stage = pc.equal(rounds, CONFIRM).to_numpy(zero_copy_only=False).astype(bool) if rows else keep
    verify = pc.is_in(rounds, pa.array(CHECK_ROUNDS)).to_numpy(zero_copy_only=False).astype(bool) if rows else keep
    has_stage = bool(((stage | verify) & keep).any())
    # a stage's row that failed, or whose times are unusable (an old part): its candidate failed in the stage
    stage_failed = stage & ~(keep & usable(t["median_ms"], t["min_ms"], t["avg_ms"])) if stage.any() else stage
    keep &= ~(stage | verify)
    keep |= stage_failed
    # latest first within each (signature, problem, candidate), a failure first at one instant: a sort on integer
    # codes, not on the strings
    idx = np.flatnonzero(keep)
    sig, pkey, ckey = sig[idx], pkey[idx], codes(t["candidate_key"])[idx]
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
        for s_, p_, c_ in zip(*(strings(t[c].take(at)).to_pylist()
                                for c in ("device_signature", "problem_key", "candidate_key"))):
            dropped.setdefault((s_, p_), set()).add(c_)
        chosen = chosen[~stage_failed[chosen]]
    return t.take(pa.array(chosen)).drop(["succeeded"]), has_stage, tuned, rows, dropped


def stage_failures(data: ResultsDataset, dropped: dict[tuple[str, str], set[str]]
                    ) -> dict[tuple[str, str], dict[str, StageFailure]]:
    """(signature, problem key) -> candidate key -> the stage failure that dropped it (its newest failed row)."""
    t = data.table(["device_signature", "problem_key", "candidate_key", "engine_name", "call", "error", "disposition",
                    "measured_at", "candidate_index", "succeeded", "median_ms", "min_ms", "avg_ms"],
                   filter=ds.field("round") == CONFIRM, dictionary=DICT_COLUMNS)
    if t.num_rows == 0:
        return {}
    bad = ~(t["succeeded"].to_numpy(zero_copy_only=False).astype(bool) & usable(t["median_ms"], t["min_ms"], t["avg_ms"]))
    t = t.filter(pa.array(bad)).sort_by([("measured_at", "descending")])
    out: dict[tuple[str, str], dict[str, StageFailure]] = {}
    cols = [strings(t[c]).to_pylist() for c in ("device_signature", "problem_key", "candidate_key", "engine_name",
                                                   "call", "error", "disposition")]
    for sig, pkey, ckey, engine, call, error, disp, index, ok in zip(*cols, t["candidate_index"].to_pylist(),
                                                                     t["succeeded"].to_pylist()):
        if ckey not in dropped.get((sig, pkey), ()) or ckey in out.get((sig, pkey), {}):
            continue
        reason = (error or disp or "failed") if not ok else "unusable times (not finite, or not above zero)"
        prefix = f"confirmation ({call}): "
        reason = reason[len(prefix):] if reason.startswith(prefix) else reason
        out.setdefault((sig, pkey), {})[ckey] = StageFailure(ckey, label_of(engine, ckey), call or "", reason,
                                                             int(index) if index is not None else 1 << 30)
    return out


def codes(col: pa.ChunkedArray) -> np.ndarray:
    """An integer per distinct value (first appearance first): equal strings, equal codes."""
    return pc.dictionary_encode(strings(col).combine_chunks()).indices.to_numpy(zero_copy_only=False)


def as_float(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


@functools.lru_cache(maxsize=4096)
def label_of(engine_name: str, key: str) -> str:
    """The candidate's label from its engine and candidate key (few distinct ones: each made once)."""
    return candidate_label(engine_name, knobs_of(key))


@functools.lru_cache(maxsize=4096)
def knobs_of(key: str) -> tuple[tuple[str, Any], ...]:
    """A candidate key's knobs (a few hundred distinct keys stand behind a million rows)."""
    return spec_of(key).knobs


CONFIRM_COLUMNS = (*COLUMNS, "call", "samples_ms", "tuning_ms", "session_size", "succeeded", "host_cpu",
                    "calls_per_sample", "input_sets", "call_path")
VERIFY_COLUMNS = (*CONFIRM_COLUMNS, "verdict")


def load_confirmations(data: ResultsDataset, round: str = CONFIRM) -> pa.Table:
    """The successful rows of every whole confirmation stage (``round``: or verify session), with their samples
    (paired by position within a session). A stage with fewer rows on disk than its ``session_size`` was cut
    short: its rows are left out."""
    columns = VERIFY_COLUMNS if round == VERIFY else CONFIRM_COLUMNS
    t = data.table(list(columns), filter=ds.field("round") == round, dictionary=DICT_COLUMNS)
    if t.num_rows == 0:
        return t
    sessions = strings(t["session_id"]).combine_chunks()
    counts = pa.table({"s": sessions}).group_by("s").aggregate([("s", "count")])
    rows_on_disk = pc.take(counts["s_count"], pc.index_in(sessions, counts["s"]))
    whole = pc.greater_equal(rows_on_disk, pc.fill_null(t["session_size"], 0))
    timed = pa.array(usable(t["median_ms"], t["min_ms"], t["avg_ms"]))  # an old part's NaN or negative times
    return t.filter(pc.and_(pc.and_(whole, t["succeeded"]), timed))


def key_at(table: pa.Table, row: int) -> str:
    """The candidate key of one row of the decided table."""
    return str(table["candidate_key"][row].as_py())
