"""Tuning results as a Parquet dataset (schema documented in docs/results.md).

One row per candidate per measurement. Rows are appended as they arrive, in
small files, hive-partitioned by device signature and op::

    results/device_signature=<sig>/op=<op>/part-<run id>-<seq>.parquet

Each file is written to a hidden temp name and renamed into place, so a crash
never leaves a half-written file where readers look. pyarrow.dataset, pandas and
DuckDB read the folder directly; the partition columns come from the paths.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from farm._version import __version__
from farm.model.records import AutotuneResult
from farm.devices.properties import DeviceProperties
from farm.errors import InputError
from farm.fsutil import fsync_dir, temp_path
from farm.model.knobs import KnobSettings, KnobType, knob_type_of
from farm.model.plans import PlanSpec
from farm.model.problem import Problem

log = logging.getLogger("farm.store.results")

SCHEMA_VERSION = 1

KNOB_TYPE = pa.struct([("id", pa.string()), ("type", pa.string()), ("value", pa.string())])
TENSOR_TYPE = pa.struct([("id", pa.string()), ("dims", pa.list_(pa.int64())),
                         ("strides", pa.list_(pa.int64())), ("dtype", pa.string())])
NAMED_INT = pa.struct([("name", pa.string()), ("value", pa.int64())])
NAMED_STR = pa.struct([("name", pa.string()), ("version", pa.string())])
TIMESTAMP = pa.timestamp("ms", tz="UTC")

# (name, type, doc). The order is the column order in the files.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("schema_version", pa.int16(), "version of this schema (1)"),
    ("job_id", pa.string(), "tuning job (stable across resumes of one --out directory or Ray job)"),
    ("run_id", pa.string(), "one invocation of the job"),
    ("session_id", pa.string(), "one autotune() call: rows measured together on one device"),
    ("round", pa.string(), "'main', or 'finalist' for a re-measurement of shard winners"),
    ("run_started_at", TIMESTAMP, "when the run started"),
    ("measured_at", TIMESTAMP, "when this candidate's measurement started"),
    ("host", pa.string(), "host name of the measuring process"),
    ("actor_id", pa.string(), "Ray actor id ('' in-process)"),
    ("device_index", pa.int32(), "device index on the host"),
    ("vendor", pa.string(), "nvidia / amd / cpu / sim"),
    ("arch", pa.string(), "sm_90, gfx942, x86_64-skylakex..."),
    ("device_name", pa.string(), "model name"),
    ("device_json", pa.string(), "all device properties (JSON)"),
    ("driver_version", pa.string(), ""),
    ("runtime_version", pa.string(), ""),
    ("library_versions", pa.list_(NAMED_STR), "libraries that decide which kernel wins"),
    ("farm_version", pa.string(), "tunefarm version"),
    ("workload_name", pa.string(), ""),
    ("workload_digest", pa.string(), "hash of the workload file"),
    ("problem_name", pa.string(), "name of the problem in the workload"),
    ("problem_key", pa.string(), "hash of the canonical problem"),
    ("problem_json", pa.string(), "canonical problem (JSON); farm.Problem.from_canonical reads it"),
    ("problem_label", pa.string(), "short description, e.g. 'matmul A[512,256] B[256,128] fp32'"),
    ("op_category", pa.string(), "convolution / sdpa / matmul / ..."),
    ("dtype", pa.string(), "storage dtype of the first input"),
    ("compute_dtype", pa.string(), ""),
    ("tensors", pa.list_(TENSOR_TYPE), "every tensor: id, dims, strides, dtype"),
    ("criteria", pa.list_(NAMED_INT), "op criteria (all, defaults filled in)"),
    ("flops", pa.float64(), "floating-point operations of one execution (null where undefined)"),
    ("engine_id", pa.int64(), "FNV-1a-64 of the engine name"),
    ("engine_name", pa.string(), ""),
    ("knobs", pa.list_(KNOB_TYPE), "non-default knob settings: id, type (int/double/string), value as text"),
    ("candidate_key", pa.string(), "engine id + knobs, the plan spec's identity (resume key)"),
    ("candidate_index", pa.int32(), "position in the problem's candidate list (discovery order first)"),
    ("mode", pa.string(), "standard / exhaustive"),
    ("strategy", pa.string(), "single_shot / fixed_average / run_until_stable"),
    ("succeeded", pa.bool_(), ""),
    ("disposition", pa.string(), "succeeded, failed_compile, wrong_result, ..."),
    ("error", pa.string(), "failure reason (or a note on a success)"),
    ("rank", pa.int32(), "rank within its session by the winner rule, -1 when not succeeded; null when the row was "
                         "written before its session finished; not the published winner (see the winners table)"),
    ("min_ms", pa.float64(), ""),
    ("avg_ms", pa.float64(), ""),
    ("stddev_ms", pa.float64(), "population standard deviation"),
    ("median_ms", pa.float64(), ""),
    ("mad_ms", pa.float64(), "median absolute deviation"),
    ("samples_ms", pa.list_(pa.float64()), "every timed iteration"),
    ("iterations", pa.int32(), "timed iterations"),
    ("warmups", pa.int32(), "untimed iterations"),
    ("converged", pa.bool_(), ""),
    ("workspace_bytes", pa.int64(), "after compile"),
    ("estimated_workspace_bytes", pa.int64(), "before compile"),
    ("ran_exhaustive", pa.bool_(), "primed with the benchmarking knob"),
    ("supports_exhaustive", pa.bool_(), ""),
    ("max_rel_error", pa.float64(), "numerical check: relative error vs the reference"),
    ("compile_ms", pa.float64(), "time to compile this candidate's plan (a failed compile too)"),
    ("tuning_ms", pa.float64(), "wall time spent on this candidate: priming, compile and measurement"),
)
FILE_SCHEMA = pa.schema([pa.field(n, t) for n, t, _ in COLUMNS],
                        metadata={b"tunefarm.schema_version": str(SCHEMA_VERSION).encode()})
DATASET_SCHEMA = FILE_SCHEMA.append(pa.field("device_signature", pa.string())).append(pa.field("op", pa.string()))
PARTITIONING = ds.partitioning(pa.schema([("device_signature", pa.string()), ("op", pa.string())]), flavor="hive")


def knobs_to_structs(knobs: KnobSettings) -> list[dict[str, str]]:
    return [{"id": k, "type": knob_type_of(v).value, "value": repr(v) if isinstance(v, float) else str(v)}
            for k, v in sorted(knobs)]


def knobs_from_structs(items: Iterable[Mapping[str, str]] | None) -> KnobSettings:
    out = []
    for item in items or ():
        t = KnobType.parse(item["type"])
        raw = item["value"]
        value: Any = int(raw) if t is KnobType.INT else float(raw) if t is KnobType.FLOAT else raw
        out.append((item["id"], value))
    return tuple(sorted(out))


def candidate_key(engine_id: int, knobs: KnobSettings) -> str:
    """``<engine id>:<knobs as JSON pairs>``: a plan spec's identity, stable across runs."""
    return f"{engine_id}:" + json.dumps([[k, v] for k, v in sorted(knobs)], separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def spec_of(key: str) -> PlanSpec:
    """The plan spec a candidate key names (inverse of candidate_key)."""
    engine, knobs = key.split(":", 1)
    return PlanSpec(int(engine), tuple(sorted((k, v) for k, v in json.loads(knobs))))


def _ts(iso: str | None) -> _dt.datetime | None:
    if not iso:
        return None
    return _dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class RunContext:
    """What every row of one run shares."""

    job_id: str
    run_id: str = field(default_factory=new_id)
    run_started_at: str = field(default_factory=now_iso)
    workload_name: str = ""
    workload_digest: str = ""


@dataclass(frozen=True)
class MeasurementContext:
    """Where and in which session a batch of results was measured."""

    device: DeviceProperties
    session_id: str = field(default_factory=new_id)
    host: str = ""
    actor_id: str = ""
    round: str = "main"


def result_row(result: AutotuneResult, problem: Problem, problem_name: str, run: RunContext,
               where: MeasurementContext) -> dict[str, Any]:
    """One Parquet row (partition columns included) for one AutotuneResult."""
    dev = where.device
    return {
        "schema_version": SCHEMA_VERSION,
        "job_id": run.job_id,
        "run_id": run.run_id,
        "session_id": where.session_id,
        "round": where.round,
        "run_started_at": _ts(run.run_started_at),
        "measured_at": _ts(result.started_at) or _ts(now_iso()),
        "host": where.host or dev.host,
        "actor_id": where.actor_id,
        "device_index": dev.index,
        "vendor": dev.vendor,
        "arch": dev.arch,
        "device_name": dev.name,
        "device_json": json.dumps(dev.to_dict(), sort_keys=True),
        "driver_version": dev.driver_version,
        "runtime_version": dev.runtime_version,
        "library_versions": [{"name": n, "version": v} for n, v in dev.libraries],
        "farm_version": __version__,
        "workload_name": run.workload_name,
        "workload_digest": run.workload_digest,
        "problem_name": problem_name,
        "problem_key": problem.key,
        "problem_json": problem.canonical_json(),
        "problem_label": problem.label(),
        "op_category": problem.spec.category.value,
        "dtype": problem.dtype,
        "compute_dtype": problem.compute_dtype,
        "tensors": [t.canonical() for t in problem.tensors],
        "criteria": [{"name": k, "value": v} for k, v in problem.criteria],
        "flops": problem.flops or None,
        "engine_id": result.engine_id,
        "engine_name": result.engine_name,
        "knobs": knobs_to_structs(result.knobs),
        "candidate_key": candidate_key(result.engine_id, result.knobs),
        "candidate_index": result.candidate,
        "mode": result.mode.value,
        "strategy": result.strategy.value,
        "succeeded": result.succeeded,
        "disposition": result.disposition.value,
        "error": result.error,
        "rank": None if result.succeeded and result.rank < 0 else result.rank,
        "min_ms": result.min_ms,
        "avg_ms": result.avg_ms,
        "stddev_ms": result.stddev_ms,
        "median_ms": result.median_ms,
        "mad_ms": result.mad_ms,
        "samples_ms": list(result.samples),
        "iterations": result.iterations,
        "warmups": result.warmups,
        "converged": result.converged,
        "workspace_bytes": result.workspace_size,
        "estimated_workspace_bytes": result.estimated_workspace,
        "ran_exhaustive": result.ran_exhaustive,
        "supports_exhaustive": result.supports_exhaustive,
        "max_rel_error": result.max_rel_error,
        "compile_ms": result.compile_ms,
        "tuning_ms": result.tuning_ms,
        "device_signature": dev.signature,
        "op": problem.op,
    }


class ResultWriter:
    """Appends rows to the dataset in small files; thread-safe.

    Rows are buffered per partition and flushed when ``flush_rows`` rows are
    waiting or ``flush_seconds`` have passed since the last flush, and on
    :meth:`flush` / :meth:`close`. With ``background`` a thread also flushes rows
    that have waited ``flush_seconds`` when no new row arrives (a long candidate
    must not keep earlier ones in memory, where a killed process loses them).
    """

    def __init__(self, root: str | Path, run_id: str, *, flush_rows: int = 256, flush_seconds: float = 2.0,
                 background: bool = False) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._buffer: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._pending = 0
        self._seq = 0
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self.rows_written = 0
        self.files_written: list[Path] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._flush_when_due, name="farm-results-flush", daemon=True)
            self._thread.start()

    def _flush_when_due(self) -> None:
        while not self._stop.wait(min(self.flush_seconds, 0.5)):
            with self._lock:
                if self._pending and time.monotonic() - self._last_flush >= self.flush_seconds:
                    try:
                        self._flush_locked()
                    except OSError as exc:  # the next append or close() reports it
                        log.warning("results: background flush failed: %s", exc)

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for row in rows:
                key = (row["device_signature"], row["op"])
                self._buffer.setdefault(key, []).append(dict(row))
                self._pending += 1
            if self._pending >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_seconds:
                self._flush_locked()

    def set_ranks(self, session_id: str, ranks: Mapping[str, int]) -> int:
        """Fill in the session ranks (by candidate key) of rows still buffered; returns how many.

        Rows stream in before their session is ranked; those flushed already keep a null rank.
        """
        n = 0
        with self._lock:
            for rows in self._buffer.values():
                for row in rows:
                    if row["session_id"] == session_id and row["candidate_key"] in ranks:
                        row["rank"] = ranks[row["candidate_key"]]
                        n += 1
        return n

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flush_locked(self) -> None:
        for (signature, op), rows in self._buffer.items():
            if not rows:
                continue
            folder = self.root / f"device_signature={signature}" / f"op={op}"
            folder.mkdir(parents=True, exist_ok=True)
            self._seq += 1
            name = f"part-{self.run_id}-{self._seq:06d}.parquet"
            table = pa.Table.from_pylist([{k: r.get(k) for k in FILE_SCHEMA.names} for r in rows], schema=FILE_SCHEMA)
            tmp = temp_path(folder / name)
            pq.write_table(table, tmp, compression="zstd")
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, folder / name)
            fsync_dir(folder)
            self.files_written.append(folder / name)
            self.rows_written += len(rows)
        self._buffer.clear()
        self._pending = 0
        self._last_flush = time.monotonic()


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


class ResultsDataset:
    """The readable part of a results folder: broken files and rows are reported and skipped.

    A file is skipped when it sits outside the partition layout, is not a Parquet file of this schema,
    or fails to read (a corrupt data page under an intact footer is found when it is first read);
    a row is skipped when a value in it is one no tunefarm writer produces (see ``_ROW_CHECKS``).
    Each is logged once and listed in ``skipped``.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise InputError("results folder not found", source=str(self.root))
        self.files: list[str] = []
        self.skipped: list[SkippedFile] = []
        for path in sorted(self.root.rglob("*.parquet")):
            rel = path.relative_to(self.root)
            if any(part.startswith((".", "_")) for part in rel.parts):
                continue  # temp files of writers in progress
            reason = _check_layout(rel) or _check_file(path)
            if reason:
                self._skip(str(path), reason)
            else:
                self.files.append(str(path))

    def _skip(self, path: str, reason: str) -> None:
        if any(s.path == path and s.reason == reason for s in self.skipped):
            return
        log.warning("results: skipping %s: %s", path, reason)
        self.skipped.append(SkippedFile(path, reason))

    def dataset(self, dictionary: Sequence[str] = (), files: Sequence[str] | None = None) -> ds.Dataset:
        """The readable files as one dataset; ``dictionary`` columns are read dictionary-encoded."""
        schema, fmt = DATASET_SCHEMA, ds.ParquetFileFormat()
        if dictionary:
            schema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), pa.string())) if f.name in dictionary else f
                                for f in DATASET_SCHEMA])
            fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=set(dictionary)))
        return ds.dataset(self.files if files is None else list(files), schema=schema, format=fmt,
                          partitioning=PARTITIONING, partition_base_dir=str(self.root))

    def table(self, columns: Sequence[str] | None = None, filter: Any = None, *,
              dictionary: Sequence[str] = ()) -> pa.Table:
        """The rows of every readable file (``filter``: a pyarrow expression); broken files and rows skipped."""
        cols = list(columns) if columns else list(DATASET_SCHEMA.names)
        checked = [c for c in cols if c in _ROW_CHECKS]
        read = cols + ["__filename"] if checked else cols
        while True:
            if not self.files:
                return self.dataset(dictionary, files=[]).schema.empty_table().select(cols)
            try:
                t = self.dataset(dictionary).to_table(columns=read, filter=filter)
                break
            except (pa.ArrowException, OSError) as exc:
                if not self._skip_unreadable(read, filter, dictionary):
                    raise InputError(f"cannot read the results: {_first_line(exc)}", source=str(self.root)) from None
        return self._drop_bad_rows(t, checked).select(cols) if checked else t

    def _skip_unreadable(self, columns: list[str], filter: Any, dictionary: Sequence[str]) -> bool:
        """Read each file alone; skip those that fail. True when one was found."""
        bad = []
        for f in self.files:
            try:
                self.dataset(dictionary, files=[f]).to_table(columns=columns, filter=filter)
            except (pa.ArrowException, OSError) as exc:
                bad.append(f)
                self._skip(f, f"unreadable ({type(exc).__name__}: {_first_line(exc)})")
        self.files = [f for f in self.files if f not in bad]
        return bool(bad)

    def _drop_bad_rows(self, t: pa.Table, checked: Sequence[str]) -> pa.Table:
        bad = pa.array([False] * t.num_rows) if t.num_rows else pa.array([], pa.bool_())
        for name in checked:
            hit = _ROW_CHECKS[name](t[name])
            if name == "problem_json" and "problem_key" in t.column_names:
                hit = pc.or_(hit, _key_mismatch(t["problem_json"], t["problem_key"]))
            if not pc.any(hit).as_py():
                continue
            bad = pc.or_(bad, hit)
            where = t.filter(hit)
            for path in sorted(set(_str(where["__filename"]).to_pylist())):
                example = where.filter(pc.equal(_str(where["__filename"]), path))[name][0].as_py()
                n = pc.sum(pc.and_(hit, pc.equal(_str(t["__filename"]), path))).as_py()
                self._skip(path, f"{n} row(s) skipped: {name} {_brief(example)}")
        return t.filter(pc.invert(bad)) if pc.any(bad).as_py() else t

    def signatures(self) -> list[str]:
        return sorted(set(self.table(["device_signature"]).column("device_signature").to_pylist()))

    def done_candidates(self, device_signature: str) -> dict[str, set[str]]:
        """problem key -> candidate keys measured on this signature (any disposition): the resume set."""
        t = self.table(["problem_key", "candidate_key"], filter=ds.field("device_signature") == device_signature)
        done: dict[str, set[str]] = {}
        for pk, ck in zip(t.column("problem_key").to_pylist(), t.column("candidate_key").to_pylist()):
            done.setdefault(pk, set()).add(ck)
        return done


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _str(col: Any) -> Any:
    return col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col


def _bad_strings(valid: Any) -> Any:
    """A row check for a string column: True where ``valid(value)`` fails or the value is null.

    Each distinct value is checked once (dictionary-encoded columns: their dictionaries only).
    """

    def ok(v: Any, seen: dict[Any, bool]) -> bool:
        if v not in seen:
            try:
                seen[v] = v is not None and bool(valid(v))
            except Exception:  # a value from a file: any failure to read it means it is not ours
                seen[v] = False
        return seen[v]

    def check(col: Any) -> Any:
        seen: dict[Any, bool] = {}
        out = []
        for chunk in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]):
            if pa.types.is_dictionary(chunk.type):
                bad = [i for i, v in enumerate(chunk.dictionary.to_pylist()) if not ok(v, seen)]
                hit = pc.is_in(chunk.indices, value_set=pa.array(bad, chunk.indices.type))
            else:
                bad = [v for v in pc.unique(chunk).to_pylist() if v is not None and not ok(v, seen)]
                hit = pc.is_in(chunk, value_set=pa.array(bad, pa.string()))
            out.append(pc.or_(pc.fill_null(hit, False), pc.is_null(chunk)))
        return pa.chunked_array(out, pa.bool_())
    return check


def _key_mismatch(problem_json: Any, problem_key: Any) -> Any:
    """True where a row's problem_key is not the key of its problem_json (an entry would match other shapes)."""
    keys: dict[str, str | None] = {}

    def key_of(text: str) -> str | None:
        if text not in keys:
            try:
                keys[text] = Problem.from_canonical(json.loads(text)).key
            except Exception:  # invalid: the problem_json check names it
                keys[text] = None
        return keys[text]

    out = []
    for chunk in (problem_json.chunks if isinstance(problem_json, pa.ChunkedArray) else [problem_json]):
        if pa.types.is_dictionary(chunk.type):
            expected = pa.array([key_of(v) if v is not None else None for v in chunk.dictionary.to_pylist()],
                                pa.string()).take(chunk.indices)
        else:
            expected = pa.array([key_of(v) if v is not None else None for v in chunk.to_pylist()], pa.string())
        out.append(expected)
    expected = pa.chunked_array(out, pa.string())
    return pc.fill_null(pc.not_equal(expected, _str(problem_key)), False)


def _is_null(col: Any) -> Any:
    return pc.is_null(col)


def _infinite(col: Any) -> Any:
    return pc.fill_null(pc.is_inf(col), False)


def _json_object(text: str) -> bool:
    return isinstance(json.loads(text), dict)


# the columns readers rely on, and what makes a value one no tunefarm writer produces
_ROW_CHECKS: dict[str, Any] = {
    "candidate_key": _bad_strings(lambda v: spec_of(v) is not None),
    "problem_json": _bad_strings(lambda v: Problem.from_canonical(json.loads(v)) is not None),
    "device_json": _bad_strings(lambda v: DeviceProperties.from_dict(json.loads(v)) is not None),
    "problem_key": _bad_strings(lambda v: bool(v)),
    "measured_at": _is_null,
    "candidate_index": _is_null,
    "iterations": _is_null,
    **{c: _infinite for c in ("min_ms", "avg_ms", "stddev_ms", "median_ms", "mad_ms")},
}


SIGNATURE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
OP_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def safe_signature(signature: str) -> bool:
    """A device signature usable as a file name: what device_signature() makes (no path separators, no '..')."""
    return bool(SIGNATURE_RE.match(signature)) and ".." not in signature


def _check_layout(rel: Path) -> str:
    """'' when a file sits at device_signature=<signature>/op=<op>/, else why it is not a results file here."""
    parts = rel.parts
    if len(parts) != 3 or not parts[0].startswith("device_signature=") or not parts[1].startswith("op="):
        return "not in a device_signature=<signature>/op=<op>/ folder"
    sig = unquote(parts[0].split("=", 1)[1])
    if not safe_signature(sig):
        return f"the folder names no device signature ({sig!r})"
    if not OP_RE.match(unquote(parts[1].split("=", 1)[1])):
        return f"the folder names no op ({parts[1]!r})"
    return ""


def _check_file(path: Path) -> str:
    """'' when the file is a readable results file, else why not."""
    try:
        meta = pq.read_metadata(path)
    except Exception as exc:  # truncated, not Parquet, unreadable
        return f"not a readable Parquet file ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    version = (meta.metadata or {}).get(b"tunefarm.schema_version")
    if version is None:
        return "not a tunefarm results file (no schema version)"
    if not version.isdigit() or len(version) > 6:
        return f"not a tunefarm results file (schema version {_brief(version)})"
    if int(version) > SCHEMA_VERSION:
        return f"written by a newer tunefarm (schema {int(version)} > {SCHEMA_VERSION})"
    try:
        schema = meta.schema.to_arrow_schema()
    except Exception as exc:
        return f"not a readable Parquet file ({type(exc).__name__}: {_first_line(exc)})"
    for f in FILE_SCHEMA:
        have = schema.field(f.name).type if f.name in schema.names else None
        if have is None and f.name in _REQUIRED_COLUMNS:
            return f"not a tunefarm results file (no {f.name} column)"
        if have is not None and have != f.type and not (pa.types.is_dictionary(have) and have.value_type == f.type):
            return f"not a tunefarm results file (column {f.name} is {have}, not {f.type})"
    return ""


# without these a row means nothing (the others may be missing in a file: they read as null)
_REQUIRED_COLUMNS = ("schema_version", "job_id", "session_id", "round", "measured_at", "device_json", "problem_key",
                     "problem_json", "engine_name", "candidate_key", "candidate_index", "succeeded", "disposition")


def schema_markdown() -> str:
    """The column table of docs/results.md (tests keep the two identical)."""
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    for name, typ, doc in COLUMNS:
        lines.append(f"| `{name}` | `{typ}` | {doc} |")
    lines.append("| `device_signature` | `string` | partition column (from the folder name) |")
    lines.append("| `op` | `string` | partition column (from the folder name) |")
    return "\n".join(lines)
