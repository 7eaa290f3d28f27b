"""The reducer: a results dataset in, one ranked override file per device signature out.

Per (device signature, problem), among the successful measurements (the latest
row of each candidate; only the finalist round's rows when the problem had one):

1. Each candidate's time is the median of its samples, its noise the robust
   sigma 1.4826 x MAD of its samples.
2. The fastest candidate F and every candidate within noise of it form the
   tie set: median(c) - median(F) <= 2 * sqrt(sigma_F^2 + sigma_c^2) + 0.5 % of median(F).
3. The winner is the tie-set member that comes first in discovery order (the
   default / heuristic-first candidate), so re-tunes do not flip between
   equivalent engines. When that is not F, the entry says so in
   ``autotune_metadata.selection``.
4. The top-k (winner first, then by median) are kept in ``autotune_metadata.top_k``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from . import __version__
from .fsutil import atomic_write_text
from .overrides import OverrideEntry, WriteReport, autotune_metadata, write_overrides
from .results import DATASET_SCHEMA, PARTITIONING, ResultsDataset, spec_of

log = logging.getLogger("farm.reduce")

NOISE_SIGMAS = 2.0
RELATIVE_FLOOR = 0.005
MAD_TO_SIGMA = 1.4826
_DICT_COLUMNS = ("problem_json", "problem_name", "engine_name", "device_json", "round", "mode", "strategy", "job_id")
_COLUMNS = ("device_signature", "problem_key", "candidate_key", "candidate_index", "engine_name", "problem_json",
            "problem_name", "device_json", "round", "mode", "strategy", "job_id", "measured_at", "min_ms", "avg_ms",
            "stddev_ms", "median_ms", "mad_ms", "iterations", "converged", "workspace_bytes", "ran_exhaustive")


@dataclass(frozen=True)
class Choice:
    """The reducer's decision for one problem on one signature (row indices into the reduced table)."""

    winner: int
    fastest: int
    ranked: tuple[int, ...]
    noise_ms: float

    @property
    def preferred_over_fastest(self) -> bool:
        return self.winner != self.fastest


def choose(median: np.ndarray, mad: np.ndarray, order: np.ndarray) -> tuple[int, int, np.ndarray, float]:
    """(winner, fastest, ranking, noise) among one problem's candidates.

    ``median`` and ``mad`` come from each candidate's samples; ``order`` is
    discovery order (lower first), which breaks ties. The reducer runs the same
    rule for all problems at once (:func:`choose_groups`).
    """
    sigma = MAD_TO_SIGMA * np.nan_to_num(mad, nan=0.0)
    by_time = np.lexsort((order, median))
    fastest = int(by_time[0])
    threshold = NOISE_SIGMAS * np.sqrt(sigma[fastest] ** 2 + sigma ** 2) + RELATIVE_FLOOR * median[fastest]
    ties = np.flatnonzero(median - median[fastest] <= threshold)
    winner = int(ties[np.argmin(order[ties])])
    ranked = np.concatenate(([winner], by_time[by_time != winner]))
    return winner, fastest, ranked, float(threshold[winner])


def choose_groups(group: np.ndarray, median: np.ndarray, mad: np.ndarray, order: np.ndarray,
                  top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`choose` for every group at once (rows sorted by group).

    Returns per group: winner row, fastest row, noise, and (rows, ranks) of the top-k rows.
    """
    n = len(group)
    sigma = MAD_TO_SIGMA * np.nan_to_num(mad, nan=0.0)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    by_time = np.lexsort((order, median, group))  # within each group: fastest first, ties by discovery order
    fastest = by_time[starts]
    g = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))  # group ordinal of each (sorted) row
    f_med, f_sig = median[fastest][g], sigma[fastest][g]
    threshold = NOISE_SIGMAS * np.sqrt(f_sig ** 2 + sigma ** 2) + RELATIVE_FLOOR * f_med
    tie = median - f_med <= threshold
    by_pref = np.lexsort((order, ~tie, group))  # ties first, then discovery order
    winner = by_pref[starts]
    is_winner = np.zeros(n, dtype=bool)
    is_winner[winner] = True
    ranking = np.lexsort((order, median, ~is_winner, group))  # the winner, then by time
    pos = np.arange(n) - starts[g]
    keep = pos < top_k
    return winner, fastest, threshold[winner], ranking[keep], pos[keep]


@dataclass
class SignatureReport:
    signature: str
    problems: int = 0
    entries: int = 0
    preferred_default: int = 0
    no_winner: list[str] = field(default_factory=list)
    write: WriteReport | None = None
    csv_path: str = ""


@dataclass
class ReduceReport:
    signatures: list[SignatureReport]
    skipped_files: list[tuple[str, str]]
    rows: int


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
    """Successful rows, latest per (signature, problem, candidate), sorted by signature and problem."""
    schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in _DICT_COLUMNS else f
                        for f in DATASET_SCHEMA])
    fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=set(_DICT_COLUMNS)))
    if not data.files:
        return schema.empty_table().select(list(_COLUMNS))
    dataset = ds.dataset(data.files, schema=schema, format=fmt, partitioning=PARTITIONING,
                         partition_base_dir=str(data.root))
    t = dataset.to_table(columns=list(_COLUMNS), filter=ds.field("succeeded") == True)  # noqa: E712
    t = t.sort_by([("device_signature", "ascending"), ("problem_key", "ascending"),
                   ("candidate_key", "ascending"), ("measured_at", "descending")])
    first = _changes(t["device_signature"]) | _changes(t["problem_key"]) | _changes(t["candidate_key"])
    return t.filter(pa.array(first))


def _float(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _knobs_of(key: str) -> tuple[tuple[str, Any], ...]:
    return spec_of(key).knobs


def reduce_results(results_dir: str | Path, out_dir: str | Path, *, top_k: int = 3, mode: str = "append",
                   tunableop_csv: bool = False) -> ReduceReport:
    """Write ``<out_dir>/<device_signature>.json`` for every signature in the results."""
    data = ResultsDataset(results_dir)
    out = Path(out_dir)
    everything = data.table(["device_signature", "problem_key"])
    pairs = everything.group_by(["device_signature", "problem_key"]).aggregate([])
    tuned: dict[str, set[str]] = {}
    for s, p in zip(pairs["device_signature"].to_pylist(), pairs["problem_key"].to_pylist()):
        tuned.setdefault(s, set()).add(p)

    table = load_successes(data)
    n = table.num_rows
    new_group = _changes(table["device_signature"]) | _changes(table["problem_key"])
    group = np.cumsum(new_group) - 1
    median = table["median_ms"].to_numpy(zero_copy_only=False).astype(float)
    fallback = table["min_ms"].to_numpy(zero_copy_only=False).astype(float)
    median = np.where(np.isnan(median), fallback, median)
    mad = table["mad_ms"].to_numpy(zero_copy_only=False).astype(float)
    order = table["candidate_index"].to_numpy(zero_copy_only=False).astype(np.int64)
    finalist = (pc.equal(_strings(table["round"]), "finalist").to_numpy(zero_copy_only=False).astype(bool)
                if n else np.zeros(0, dtype=bool))
    if finalist.any():
        # problems that had a finalist round compare only the finalists (measured together on one device)
        has_final = np.zeros(int(group[-1]) + 1, dtype=bool)
        has_final[group[finalist]] = True
        rows = np.flatnonzero(finalist | ~has_final[group])
    else:
        rows = np.arange(n)
    k = max(top_k, 1)
    winner, fastest, noise, ranked_rows, ranked_pos = choose_groups(group[rows], median[rows], mad[rows], order[rows], k)
    winner, fastest, ranked_rows = rows[winner], rows[fastest], rows[ranked_rows]
    ranked_group = group[ranked_rows]
    top: dict[int, list[int]] = {}
    for grp, row in zip(ranked_group.tolist(), ranked_rows.tolist()):
        top.setdefault(grp, []).append(row)
    first = pa.array(winner, type=pa.int64())
    sig_at = _strings(table["device_signature"].take(first)).to_pylist()
    key_at = _strings(table["problem_key"].take(first)).to_pylist()
    choices: dict[str, list[Choice]] = {}
    won: dict[str, set[str]] = {}
    for i, (w, f) in enumerate(zip(winner.tolist(), fastest.tolist())):
        choice = Choice(w, f, tuple(top[group[w]]), float(noise[i]))
        choices.setdefault(sig_at[i], []).append(choice)
        won.setdefault(sig_at[i], set()).add(key_at[i])

    reports = []
    for signature in sorted(tuned):
        rep = SignatureReport(signature, problems=len(tuned[signature]))
        picked = choices.get(signature, [])
        rep.no_winner = sorted(tuned[signature] - won.get(signature, set()))
        entries, device, job_ids = _entries(table, picked, top_k)
        rep.entries = len(entries)
        rep.preferred_default = sum(c.preferred_over_fastest for c in picked)
        if entries:
            extra = {"generated_by": {"tool": "tunefarm", "version": __version__, "job_ids": job_ids}}
            rep.write = write_overrides(out / f"{signature}.json", entries,
                                        device={"signature": signature, "properties": device}, mode=mode, extra=extra)
            if tunableop_csv:
                rep.csv_path = str(out / f"tunableop_results_{signature}.csv")
                write_tunableop_csv(rep.csv_path, signature, device, entries)
        reports.append(rep)
    return ReduceReport(reports, [(s.path, s.reason) for s in data.skipped], everything.num_rows)


def _entries(table: pa.Table, picked: Sequence[Choice], top_k: int) -> tuple[list[OverrideEntry], dict[str, Any], list[str]]:
    """Override entries of the chosen rows, the device properties, and the job ids behind them."""
    if not picked:
        return [], {}, []
    winners = table.take(pa.array([c.winner for c in picked], type=pa.int64())).to_pylist()
    ranked_idx = sorted({i for c in picked for i in c.ranked} | {c.fastest for c in picked})
    slim = table.select(["engine_name", "candidate_key", "min_ms", "median_ms"]).take(pa.array(ranked_idx, type=pa.int64()))
    by_row = dict(zip(ranked_idx, slim.to_pylist()))

    def brief(i: int) -> dict[str, Any]:
        r = by_row[i]
        return {"engine_name": r["engine_name"], "knobs": dict(_knobs_of(r["candidate_key"])),
                "median_time_ms": _float(r["median_ms"]), "min_time_ms": _float(r["min_ms"])}

    device = json.loads(winners[0]["device_json"])
    entries = []
    for choice, row in zip(picked, winners):
        selection: dict[str, Any] = {"rule": "fastest", "noise_ms": choice.noise_ms}
        if choice.preferred_over_fastest:
            selection = {"rule": "heuristic_first_within_noise", "noise_ms": choice.noise_ms,
                         "fastest": brief(choice.fastest),
                         "note": "the fastest candidate was not faster than this one beyond the measured noise"}
        meta = autotune_metadata(
            rank=0, min_ms=_float(row["min_ms"]), avg_ms=_float(row["avg_ms"]), stddev_ms=_float(row["stddev_ms"]),
            workspace=int(row["workspace_bytes"] or 0), mode=row["mode"], ran_exhaustive=bool(row["ran_exhaustive"]),
            strategy=row["strategy"], iterations=int(row["iterations"]), converged=bool(row["converged"]),
            device=device.get("arch", ""), timestamp=row["measured_at"].isoformat().replace("+00:00", "Z"),
            median_time_ms=_float(row["median_ms"]), mad_ms=_float(row["mad_ms"]), problem_key=row["problem_key"],
            problem_name=row["problem_name"], job_id=row["job_id"], selection=selection,
            top_k=[{"rank": r, **brief(i)} for r, i in enumerate(choice.ranked[:top_k])],
        )
        # rows were written from validated Problems: their canonical JSON needs no second validation
        entries.append(OverrideEntry.from_canonical(json.loads(row["problem_json"]), row["engine_name"],
                                                    _knobs_of(row["candidate_key"]), meta))
    return entries, device, sorted({row["job_id"] for row in winners})


def write_tunableop_csv(path: str | Path, signature: str, device: dict[str, Any], entries: Sequence[OverrideEntry]) -> None:
    """TunableOp-style results: Validator lines, then ``op,params,kernel,time_ms`` per problem."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["Validator", "FARM_VERSION", __version__])
    w.writerow(["Validator", "DEVICE_SIGNATURE", signature])
    w.writerow(["Validator", "DEVICE_NAME", device.get("name", "")])
    w.writerow(["Validator", "ARCH", device.get("arch", "")])
    if device.get("driver_version"):
        w.writerow(["Validator", "DRIVER_VERSION", device["driver_version"]])
    if device.get("runtime_version"):
        w.writerow(["Validator", "RUNTIME_VERSION", device["runtime_version"]])
    for name, version in sorted((device.get("libraries") or {}).items()):
        w.writerow(["Validator", f"{name.upper()}_VERSION", version])
    for e in entries:
        dtype = next((t.data_type for t in e.tensors if t.data_type), "")
        params = "_".join(f"{t.tensor_id}{'x'.join(map(str, t.dims))}" for t in e.tensors)
        crit = "_".join(f"{k}{v}" for k, v in e.criteria if v)
        kernel = e.engine_name + ("[" + ";".join(f"{k}={v}" for k, v in e.knobs) + "]" if e.knobs else "")
        time_ms = (e.metadata or {}).get("median_time_ms") or (e.metadata or {}).get("min_time_ms")
        w.writerow([f"{e.op}_{dtype}", params + (f"_{crit}" if crit else ""), kernel, f"{time_ms:.6f}" if time_ms else ""])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())
