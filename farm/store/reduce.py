"""The reducer: a results dataset in, one ranked override file and one winners table per device signature out.

Per (device signature, problem), among the successful measurements (the latest
row of each candidate; only the finalist round's rows when the problem had one),
the winner is decided by :mod:`farm.tuner.judging.winner` (the one rule every surface shows):
the faster median wins, except that the default candidate or the incumbent (the
winner already in the override file being appended to) is kept when a faster one
is within measurement noise, and a noisy candidate loses ties.

Outputs, per signature, in the output folder:

* ``<signature>.json``: the v2 override file; ``autotune_metadata.selection``
  says which rule decided and why (one phrase), ``top_k`` the runners-up;
* ``<signature>.winners.parquet``: one row per problem with the same decision
  (``WINNERS_SCHEMA``), for SQL: ``SELECT * FROM 'DIR/overrides/*.winners.parquet'``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from farm._version import __version__
from farm.errors import InputError
from farm.fsutil import fsync_dir, remove_stale_temps, temp_path
from farm.store.dataset import ResultsDataset, safe_signature
from farm.store.overrides.files import ISO_SECONDS_FORMAT, WriteReport, autotune_metadata, render, write_overrides
from farm.store.overrides.entries import OVERRIDE_VERSION, OverrideEntry, OverrideFile, knob_list
from farm.store.results import KNOB_TYPE, knobs_to_structs
from farm.store.overrides.tunableop_csv import write_tunableop_csv

log = logging.getLogger("farm.store.reduce")

WINNERS_SUFFIX = ".winners.parquet"
from farm.store.deciding.records import Decisions, Winner
from farm.store.deciding.loading import knobs_of
from farm.store.deciding.rule import decide_results
from farm.store.deciding.incumbents import load_incumbents


@dataclass
class SignatureReport:
    signature: str
    problems: int = 0
    entries: int = 0
    kept_over_fastest: int = 0  # winners that are not the fastest measured candidate (rule != fastest)
    no_winner: list[str] = field(default_factory=list)
    write: WriteReport | None = None
    winners_path: str = ""
    csv_path: str = ""


def relocated(rep: SignatureReport, where: Callable[[str], str]) -> SignatureReport:
    """The report with its files' paths renamed by ``where(file name)`` (written elsewhere, then moved)."""
    return dataclasses.replace(
        rep, write=dataclasses.replace(rep.write, path=where(Path(rep.write.path).name)) if rep.write else None,
        winners_path=where(Path(rep.winners_path).name) if rep.winners_path else "",
        csv_path=where(Path(rep.csv_path).name) if rep.csv_path else "")


@dataclass
class ReduceReport:
    signatures: list[SignatureReport]
    skipped_files: list[tuple[str, str]]
    rows: int
    decisions: Decisions | None = None


def reduce_results(results_dir: Any, out_dir: str | Path, *, top_k: int = 3, mode: str = "append",
                   tunableop_csv: bool = False, incumbents: str | Path | None = None,
                   decisions: Decisions | None = None, signatures: Sequence[str] | None = None,
                   measurement_warning: str = "", unreadable: str = "refuse") -> ReduceReport:
    """Write ``<out_dir>/<device_signature>.json`` and ``.winners.parquet`` for every signature in the results
    (a local folder or a ``pyarrow.fs`` URI; ``signatures``: only these partitions are read and written).

    ``incumbents`` (an override file, folder or published root): winners there are kept when a new
    candidate is faster only within noise (see :func:`load_incumbents`). ``measurement_warning`` (e.g. more CPU
    workers than cores) goes into each file's ``generated_by``; ``farm publish`` refuses such a file unless forced.
    ``unreadable``: what an existing file's entries no reader can read do to an append (farm.store.overrides.files:
    ``refuse``, or ``set_aside``).
    """
    out = Path(out_dir)
    if decisions is None:
        data = ResultsDataset(results_dir, signatures)
        decisions = decide_results(data, incumbents=load_incumbents(incumbents, data), top_k=top_k)
    reports = []
    for signature in sorted(s for s, keys in decisions.tuned.items() if keys):
        if not safe_signature(signature):  # the rows' own signature (see decide_results): never a path
            raise InputError("not a device signature; refusing to write a file named after it",
                             field="device_signature", value=signature, source=str(results_dir))
        rep = SignatureReport(signature, problems=len(decisions.tuned[signature]))
        picked = decisions.of(signature)
        rep.no_winner = sorted(decisions.tuned[signature] - {w.problem_key for w in picked})
        entries, device, job_ids = _entries(decisions, picked, top_k)
        rep.entries = len(entries)
        rep.kept_over_fastest = sum(w.label != w.fastest for w in picked)
        if entries:
            extra = {"generated_by": {"tool": "tunefarm", "version": __version__, "job_ids": job_ids,
                                      **({"measurement_warning": measurement_warning} if measurement_warning else {})}}
            rep.write = write_overrides(out / f"{signature}.json", entries,
                                        device={"signature": signature, "properties": device}, mode=mode, extra=extra,
                                        unreadable=unreadable)
            rep.winners_path = str(write_winners_table(out / f"{signature}{WINNERS_SUFFIX}", decisions, picked))
            if tunableop_csv:
                rep.csv_path = str(out / f"tunableop_results_{signature}.csv")
                write_tunableop_csv(rep.csv_path, entries, device={"signature": signature, "properties": device},
                                    mode="replace")
        reports.append(rep)
    return ReduceReport(reports, decisions.skipped_files, decisions.rows, decisions)


def rendered(decisions: Decisions, signature: str, top_k: int = 3) -> str:
    """The override file of ``signature``'s decisions as the reducer would write its entries (the text alone,
    nothing written): what a check of them reads before they are written once."""
    entries, device, job_ids = _entries(decisions, decisions.of(signature), top_k)
    doc = OverrideFile(OVERRIDE_VERSION, entries, {"signature": signature, "properties": device},
                       {"generated_by": {"tool": "tunefarm", "version": __version__, "job_ids": job_ids}}, "")
    return render(doc, [e.to_json() for e in entries])


def _entries(decisions: Decisions, picked: Sequence[Winner], top_k: int) -> tuple[list[OverrideEntry], dict[str, Any], list[str]]:
    """Override entries of the winners, the device properties, and the job ids behind them."""
    if not picked:
        return [], {}, []
    table = decisions.table
    columns = ["min_ms", "avg_ms", "stddev_ms", "workspace_bytes", "mode", "ran_exhaustive", "strategy", "iterations",
               "converged", "measured_at", "supports_exhaustive", "exhaustive_not_run_reason", "mad_ms", "problem_key",
               "problem_name", "job_id", "problem_json", "engine_name"]
    taken = table.take(pa.array([w.row for w in picked], type=pa.int64()))
    # whole columns to Python at once: floats with NaN as None, timestamps already in the file's text form
    c = {name: _floats(taken[name]) if name.endswith("_ms") else taken[name].to_pylist()
         for name in columns if name != "measured_at"}
    c["measured_at"] = pc.strftime(taken["measured_at"].cast(pa.timestamp("s", tz="UTC"), safe=False),
                                      format=ISO_SECONDS_FORMAT).to_pylist()
    ranked_idx = sorted({i for w in picked for i in decisions.top[(w.signature, w.problem_key)]})
    slim = table.select(["engine_name", "candidate_key", "min_ms", "median_ms", "round"]).take(
        pa.array(ranked_idx, type=pa.int64()))
    # each with the round its figures come from: the decision's first, the main round's after what a stage measured
    briefs = {i: {"engine_name": name, "knobs": _knob_dict(key), "median_time_ms": med, "min_time_ms": low,
                  "round": rnd}
              for i, name, key, med, low, rnd in zip(ranked_idx, slim["engine_name"].to_pylist(),
                                                     slim["candidate_key"].to_pylist(), _floats(slim["median_ms"]),
                                                     _floats(slim["min_ms"]), slim["round"].to_pylist())}
    device = json.loads(taken["device_json"][0].as_py())
    entries = []
    for j, w in enumerate(picked):
        selection = _selection(w)
        extra: dict[str, Any] = {}
        if w.call:
            extra["call"] = w.call
        library = _library(c["problem_json"][j])
        if library:  # a torch model's call: its default is torch's own kernel (farm verify and farm.apply read it)
            extra["library"] = library
        if w.others:  # the other calling modes' decisions: fields hipDNN does not read (docs/overrides.md)
            extra["calls"] = {o.call: {"engine_name": o.engine_name, "knobs": knob_list(o.knobs),
                                       "median_time_ms": o.median_ms, "min_time_ms": o.min_ms,
                                       "selection": _selection(o)} for o in w.others}
        meta = autotune_metadata(
            rank=0, min_ms=c["min_ms"][j], avg_ms=c["avg_ms"][j], stddev_ms=c["stddev_ms"][j],
            workspace=int(c["workspace_bytes"][j] or 0), mode=c["mode"][j], ran_exhaustive=bool(c["ran_exhaustive"][j]),
            strategy=c["strategy"][j], iterations=int(c["iterations"][j]), converged=bool(c["converged"][j]),
            device=device.get("arch", ""), timestamp=c["measured_at"][j],
            supports_exhaustive=bool(c["supports_exhaustive"][j]), not_run_reason=c["exhaustive_not_run_reason"][j],
            median_time_ms=w.median_ms, mad_ms=c["mad_ms"][j], problem_key=c["problem_key"][j],
            problem_name=c["problem_name"][j], job_id=c["job_id"][j], selection=selection,
            top_k=[{"rank": r, **briefs[i]} for r, i in enumerate(decisions.top[(w.signature, w.problem_key)][:top_k])],
            **extra,
        )
        # rows were written from validated Problems: their canonical JSON needs no second validation
        entries.append(dataclasses.replace(_pattern(c["problem_json"][j]), engine_name=c["engine_name"][j],
                                           knobs=tuple(sorted(w.knobs)), metadata=meta))
    return entries, device, sorted(set(c["job_id"]))


def _selection(w: Winner) -> dict[str, Any]:
    """``autotune_metadata.selection``: how the winner was decided (and, confirmed, its paired speed-up)."""
    selection: dict[str, Any] = {"rule": w.rule.value, "why": w.why, "noisy": w.noisy, "trusted": w.trusted,
                                 "round": w.round, "fastest": {"label": w.fastest, "median_time_ms": w.fastest_ms}}
    if not w.trusted:  # marked, so farm publish can count it, refuse it (--trusted-only), and never compare with it
        selection["untrusted"] = ("no confirmation stage measured it against the default" if w.confirmed is None
                                  else "the confirmation stage's budget ran out before it decided"
                                  if not w.confirmed.decided else f"farm verify: {w.verified.verdict}")
    if w.default is not None:
        selection["default"] = {"label": w.default, "median_time_ms": w.default_ms}
    if w.confirmed is not None:
        selection["speedup_over_default"] = w.speedup_over_default
        selection["confirmation"] = w.confirmed.as_dict()
    if w.verified is not None:  # farm verify's replay beside the direct call: delivered next to published
        selection["verified"] = w.verified.as_dict()
    if w.model_check is not None:  # farm apply's check of a model's step with and without it
        selection["model_check"] = w.model_check.as_dict()
    return selection


@functools.lru_cache(maxsize=1 << 16)
def _pattern(problem_json: str) -> OverrideEntry:
    """The exact entry of a problem's canonical JSON, engine and metadata left to fill in (parsed once for all
    the signatures that tuned this problem; entries are frozen, so they share the tensor rules)."""
    return OverrideEntry.from_canonical(json.loads(problem_json), "")


@functools.lru_cache(maxsize=1 << 16)
def _library(problem_json: str) -> str:
    return str(json.loads(problem_json).get("library") or "") if '"library"' in problem_json else ""


def _floats(col: Any) -> list[float | None]:
    """A float column as Python floats, NaN and null as None (what the JSON writes as null)."""
    return pc.if_else(pc.is_nan(col), None, col).to_pylist()


@functools.lru_cache(maxsize=4096)
def _knob_dict(key: str) -> dict[str, Any]:
    return dict(knobs_of(key))  # shared by the entries that rank this candidate: read only


@functools.lru_cache(maxsize=4096)
def _knob_structs(knobs: tuple[tuple[str, Any], ...]) -> list[dict[str, str]]:
    return knobs_to_structs(knobs)  # a few hundred distinct settings behind every winner: convert each once


WINNERS_SCHEMA = pa.schema([
    ("device_signature", pa.string()), ("arch", pa.string()), ("device_name", pa.string()),
    ("problem_key", pa.string()), ("problem_name", pa.string()), ("op", pa.string()),
    ("engine_name", pa.string()), ("knobs", pa.list_(KNOB_TYPE)), ("label", pa.string()),
    ("candidate_key", pa.string()),
    ("median_ms", pa.float64()), ("min_ms", pa.float64()), ("mad_ms", pa.float64()), ("noisy", pa.bool_()),
    ("rule", pa.string()), ("why", pa.string()),
    ("fastest", pa.string()), ("fastest_median_ms", pa.float64()),
    ("default", pa.string()), ("default_median_ms", pa.float64()), ("speedup_over_default", pa.float64()),
    ("candidates", pa.int32()), ("job_id", pa.string()), ("measured_at", pa.timestamp("ms", tz="UTC")),
    ("call", pa.string()), ("primary", pa.bool_()), ("speedup_low", pa.float64()), ("speedup_high", pa.float64()),
    ("trusted", pa.bool_()), ("confirm_rounds", pa.int32()), ("confirm_ms", pa.float64()),
    ("delivered_speedup", pa.float64()), ("delivered_low", pa.float64()), ("delivered_high", pa.float64()),
    ("verdict", pa.string()), ("verified_on_cpu", pa.string()), ("round", pa.string()),
    ("step_speedup", pa.float64()), ("model_verdict", pa.string()),
], metadata={b"tunefarm.table": b"winners", b"tunefarm.schema_version": b"5"})


def write_winners_table(path: Path, decisions: Decisions, picked: Sequence[Winner]) -> Path:
    """One row per problem and calling mode: the decisions the override file holds (temp file, then rename).
    ``primary`` marks the one its entry names (``engine_name``); a graph decision beside an eager one is the other."""
    shown = [x for w in picked for x in (w, *w.others)]
    primary = [x is w for w in picked for x in (w, *w.others)]
    taken = decisions.table.take(pa.array([w.row for w in shown], type=pa.int64()))
    device = json.loads(taken["device_json"][0].as_py()) if shown else {}
    n = len(shown)

    def col(get: Callable[[Winner], Any]) -> list[Any]:
        return [get(w) for w in shown]

    intervals = col(lambda w: w.speedup_interval or (None, None))
    columns: dict[str, Any] = {
        "device_signature": col(lambda w: w.signature), "arch": [device.get("arch", "")] * n,
        "device_name": [device.get("name", "")] * n, "problem_key": col(lambda w: w.problem_key),
        "problem_name": col(lambda w: w.problem_name), "op": taken["op"], "engine_name": col(lambda w: w.engine_name),
        "knobs": col(lambda w: _knob_structs(w.knobs)), "label": col(lambda w: w.label),
        "candidate_key": taken["candidate_key"],
        "median_ms": col(lambda w: w.median_ms), "min_ms": col(lambda w: w.min_ms), "mad_ms": col(lambda w: w.mad_ms),
        "noisy": col(lambda w: w.noisy), "rule": col(lambda w: w.rule.value), "why": col(lambda w: w.why),
        "fastest": col(lambda w: w.fastest), "fastest_median_ms": col(lambda w: w.fastest_ms),
        "default": col(lambda w: w.default), "default_median_ms": col(lambda w: w.default_ms),
        "speedup_over_default": col(lambda w: w.speedup_over_default), "candidates": col(lambda w: w.candidates),
        "job_id": taken["job_id"], "measured_at": taken["measured_at"], "call": col(lambda w: w.call),
        "primary": primary, "speedup_low": [i[0] for i in intervals], "speedup_high": [i[1] for i in intervals],
        "trusted": col(lambda w: w.trusted), "round": col(lambda w: w.round),
        "confirm_rounds": col(lambda w: w.confirmed.rounds if w.confirmed else None),
        "confirm_ms": col(lambda w: w.confirmed.cost_ms if w.confirmed else None),
        "delivered_speedup": col(lambda w: w.verified.delivered if w.verified else None),
        "delivered_low": col(lambda w: w.verified.low if w.verified else None),
        "delivered_high": col(lambda w: w.verified.high if w.verified else None),
        "verdict": col(lambda w: w.verified.verdict if w.verified else None),
        "verified_on_cpu": col(lambda w: w.verified.host_cpu if w.verified else None),
        "step_speedup": col(lambda w: w.model_check.speedup if w.model_check else None),
        "model_verdict": col(lambda w: w.model_check.verdict if w.model_check else None),
    }
    arrays = []
    for spec in WINNERS_SCHEMA:
        values = columns[spec.name]
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
            values = values.dictionary_decode() if pa.types.is_dictionary(values.type) else values
            arrays.append(values.cast(spec.type))
        else:
            arrays.append(pa.array(values, type=spec.type))
    table = pa.Table.from_arrays(arrays, schema=WINNERS_SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    pq.write_table(table, tmp)
    Path(tmp).replace(path)
    fsync_dir(path.parent)
    remove_stale_temps(path)
    return path


