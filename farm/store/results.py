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
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa
import pyarrow.dataset as ds

from farm._version import __version__
from farm.devices.properties import DeviceProperties
from farm.model.knobs import KnobSettings, KnobType, knob_type_of
from farm.model.plans import PlanSpec, candidate_key, spec_of  # noqa: F401  (the store's names for them)
from farm.model.problem import Problem
from farm.model.records import AutotuneResult
from farm.store.location import Location

log = logging.getLogger("farm.store.results")

SCHEMA_VERSION = 1
# rounds whose rows check a decision where it is used (farm verify: one call; farm apply: a model's step), never a
# measurement of a candidate: the main-round readers leave them out
CHECK_ROUNDS = ("verify", "model")

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
    ("round", pa.string(), "'main'; 'finalist' for a re-measurement of shard winners; 'confirm' for the paired "
                           "confirmation stage (its rows' samples_ms are paired by position: round i of a session); "
                           "'verify' for farm verify's replay of a published decision beside the direct call (two "
                           "rows a session, paired likewise); 'model' for farm apply's model check: a model's step "
                           "with and without the decision (two rows a session, step ms, paired likewise)"),
    ("call", pa.string(), "confirm, verify and model rows: the calling mode timed, 'eager' (per call of back-to-back "
                          "calls as production makes them, launch cost included) or 'graph' (device time inside a "
                          "captured graph); '' for the other rounds"),
    ("session_size", pa.int32(), "confirm rows: how many rows the stage wrote in all (its participants); a stage "
                                 "with fewer on disk was cut short and is measured again; verify rows: 2; null for "
                                 "other rounds"),
    ("verdict", pa.string(), "verify rows: what farm verify found of the decision, 'holds', 'flagged: why' or "
                             "'fixed: why' (the default was published in its place); model rows: what farm apply's "
                             "model check found, 'holds: why' or 'withdrawn: why' (the default is published in its "
                             "place); '' otherwise"),
    ("run_started_at", TIMESTAMP, "when the run started"),
    ("measured_at", TIMESTAMP, "when this candidate's measurement started"),
    ("host", pa.string(), "host name of the measuring process"),
    ("host_cpu", pa.string(), "CPU model of the measuring host (/proc/cpuinfo): an eager call's time is as much "
                              "the host's as the device's; null in rows written before it was recorded"),
    ("actor_id", pa.string(), "Ray actor id ('' in-process)"),
    ("node_id", pa.string(), "Ray node id of the measuring worker ('' in-process; null in rows written before it "
                             "was recorded): farm report's rows per node"),
    ("device_index", pa.int32(), "device index on the host"),
    ("vendor", pa.string(), "nvidia / amd / cpu / sim"),
    ("arch", pa.string(), "sm_90, gfx942, x86_64-skylakex..."),
    ("device_name", pa.string(), "model name"),
    ("device_json", pa.string(), "all device properties (JSON)"),
    ("driver_version", pa.string(), ""),
    ("runtime_version", pa.string(), ""),
    ("library_versions", pa.list_(NAMED_STR), "libraries that decide which kernel wins"),
    ("farm_version", pa.string(), "tunefarm version"),
    ("workload_name", pa.string(), "the workload's name; model rows: the model checked"),
    ("workload_digest", pa.string(), "hash of the workload file"),
    ("problem_name", pa.string(), "name of the problem in the workload"),
    ("problem_key", pa.string(), "hash of the canonical problem"),
    ("problem_json", pa.string(), "canonical problem (JSON; with its library, 'torch', where its default is torch's "
                                  "own call); farm.Problem.from_canonical reads it"),
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
    ("exhaustive_not_run_reason", pa.string(), "EXHAUSTIVE mode: why this candidate was not primed (else empty)"),
    ("max_rel_error", pa.float64(), "numerical check: relative error vs the reference"),
    ("compile_ms", pa.float64(), "time to compile this candidate's plan (a failed compile too)"),
    ("tuning_ms", pa.float64(), "wall time spent on this candidate: priming, compile and measurement"),
    ("predicted_rel_time", pa.float64(), "disposition 'pruned': the cost model's predicted time relative to the "
                                         "problem's best (farm tune --prune); null otherwise"),
    ("calls_per_sample", pa.int32(), "confirm and verify rows: back-to-back calls one sample timed (eager; the same "
                                     "for every participant of a round) or calls in the captured graph (graph); model "
                                     "rows: steps a sample; null otherwise"),
    ("call_path", pa.string(), "confirm and verify rows: what each call called: 'direct' (the library call a user "
                               "makes without the farm, the default's), 'replay' (farm.ops' entry point, its "
                               "dispatch included), 'plan' (the plan, where farm.ops has no entry point for the "
                               "problem); '' otherwise"),
    ("input_sets", pa.int32(), "confirm and verify rows: input sets the calls took in turn (with cold_cache sized "
                               "from the device's cache, so no call reads its inputs from it); null otherwise"),
    ("host_ms", pa.float64(), "eager confirm rows: the host's time a call, issuing it without waiting for the device "
                              "(median over the samples; on a CPU the call itself); null otherwise"),
    ("ranked_by", pa.string(), "eager confirm rows: 'host' where samples_ms are host times a call (the problem is "
                               "called by a model step the host bounds: farm capture's steps), '' where they are the "
                               "calls' time"),
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


def _ts(iso: str | None) -> _dt.datetime | None:
    if not iso:
        return None
    return _dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _host_cpu() -> str:
    from farm.devices.runtimes.cpu import host_cpu

    return host_cpu()


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
    node_id: str = ""
    round: str = "main"
    call: str = ""  # the calling mode a confirm session timed
    session_size: int | None = None  # a confirm session: the rows it writes in all
    host_cpu: str = field(default_factory=lambda: _host_cpu())  # the measuring host's CPU model
    verdict: str = ""  # a verify session: what farm verify found


def result_row(result: AutotuneResult, problem: Problem, problem_name: str, run: RunContext,
               where: MeasurementContext) -> dict[str, Any]:
    """One Parquet row (partition columns included) for one AutotuneResult."""
    return {**_run_fields(result, run, where), **_device_fields(where.device), **_problem_fields(problem, problem_name),
            **_candidate_fields(result), "device_signature": where.device.signature, "op": problem.op}


def _run_fields(result: AutotuneResult, run: RunContext, where: MeasurementContext) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "job_id": run.job_id,
        "run_id": run.run_id,
        "session_id": where.session_id,
        "round": where.round,
        "call": where.call,
        "session_size": where.session_size,
        "run_started_at": _ts(run.run_started_at),
        "measured_at": _ts(result.started_at) or _ts(now_iso()),
        "host": where.host or where.device.host,
        "host_cpu": where.host_cpu,
        "verdict": where.verdict,
        "actor_id": where.actor_id,
        "node_id": where.node_id,
        "farm_version": __version__,
        "workload_name": run.workload_name,
        "workload_digest": run.workload_digest,
    }


def _device_fields(dev: DeviceProperties) -> dict[str, Any]:
    return {
        "device_index": dev.index,
        "vendor": dev.vendor,
        "arch": dev.arch,
        "device_name": dev.name,
        "device_json": json.dumps(dev.to_dict(), sort_keys=True),
        "driver_version": dev.driver_version,
        "runtime_version": dev.runtime_version,
        "library_versions": [{"name": n, "version": v} for n, v in dev.libraries],
    }


def _problem_fields(problem: Problem, problem_name: str) -> dict[str, Any]:
    return {
        "problem_name": problem_name,
        "problem_key": problem.key,
        "problem_json": problem.stored_json(),
        "problem_label": problem.label(),
        "op_category": problem.spec.category.value,
        "dtype": problem.dtype,
        "compute_dtype": problem.compute_dtype,
        "tensors": [t.canonical() for t in problem.tensors],
        "criteria": [{"name": k, "value": v} for k, v in problem.criteria],
        "flops": problem.flops or None,
    }


def _candidate_fields(result: AutotuneResult) -> dict[str, Any]:
    return {
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
        "predicted_rel_time": result.predicted_rel,
        "calls_per_sample": result.calls_per_sample,
        "call_path": result.call_path,
        "input_sets": result.input_sets,
        "host_ms": result.host_ms,
        "ranked_by": result.ranked_by,
        "workspace_bytes": result.workspace_size if result.workspace_size is not None and result.workspace_size >= 0
        else None,  # never compiled: -1 in the result, null here
        "estimated_workspace_bytes": result.estimated_workspace,
        "ran_exhaustive": result.ran_exhaustive,
        "supports_exhaustive": result.supports_exhaustive,
        "exhaustive_not_run_reason": result.exhaustive_not_run_reason,
        "max_rel_error": result.max_rel_error,
        "compile_ms": result.compile_ms,
        "tuning_ms": result.tuning_ms,
    }


class ResultWriter:
    """Appends rows to the dataset in small files; thread-safe.

    Rows are buffered per partition and flushed when ``flush_rows`` rows are
    waiting or ``flush_seconds`` have passed since the last flush, and on
    :meth:`flush` / :meth:`close`. With ``background`` a thread also flushes rows
    that have waited ``flush_seconds`` when no new row arrives (a long candidate
    must not keep earlier ones in memory, where a killed process loses them).
    """

    def __init__(self, root: "str | Path | Location", run_id: str, *, flush_rows: int = 256, flush_seconds: float = 2.0,
                 background: bool = False, name: str = "") -> None:
        self.location = Location.of(root)
        if self.location.local:
            self.location.local_path.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id
        self.name = name  # in part names: writers of one run (a driver, its workers) never pick the same name
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._buffer: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._pending = 0
        self._seq = 0
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self.rows_written = 0
        self.files_written: list[str] = []
        self.part_rows: list[tuple[str, int]] = []  # each part written and its rows (a run's manifest)
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
            self._seq += 1
            who = f"{self.name}-" if self.name else ""
            name = f"part-{self.run_id}-{who}{self._seq:06d}.parquet"
            table = pa.Table.from_pylist([{k: r.get(k) for k in FILE_SCHEMA.names} for r in rows], schema=FILE_SCHEMA)
            path = self.location.write_parquet(f"device_signature={signature}/op={op}", name, table)
            self.files_written.append(path)
            self.part_rows.append((path, len(rows)))
            self.rows_written += len(rows)
        self._buffer.clear()
        self._pending = 0
        self._last_flush = time.monotonic()


def schema_markdown() -> str:
    """The column table of docs/results.md (tests keep the two identical)."""
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    for name, typ, doc in COLUMNS:
        lines.append(f"| `{name}` | `{typ}` | {doc} |")
    lines.append("| `device_signature` | `string` | partition column (from the folder name) |")
    lines.append("| `op` | `string` | partition column (from the folder name) |")
    return "\n".join(lines)
