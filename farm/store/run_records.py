"""Rows a check measured (farm verify, farm apply's model check) added to a run folder, and its files reduced again.

A run folder's override files are the reducer's reading of its rows: a check's verdict lands there the way every
measurement does, as rows (so a later ``farm reduce`` keeps it), then one reduce of the device's signature, under
the job's lock (a ``farm tune`` running into the folder is not raced).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from farm.errors import InputError
from farm.fsutil import LockTimeout, PathLock
from farm.model.problem import Problem
from farm.model.records import AutotuneResult
from farm.store.overrides.parsing import load_overrides
from farm.store.reduce import ReduceReport, reduce_results
from farm.store.results import MeasurementContext, ResultWriter, RunContext, new_id, result_row

Row = tuple[AutotuneResult, Problem, str, MeasurementContext]  # a result, its problem, the problem's name, where


def job_record(run: Path) -> dict[str, Any]:
    """The run folder's job.json ({} where missing or unreadable)."""
    try:
        data = json.loads((run / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_in_run(run: Path, overrides: str, rows: Iterable[Row], signature: str, *, name: str,
                  workload_name: str | None = None) -> tuple[int, ReduceReport]:
    """Append ``rows`` to ``run/results`` (parts named after ``name``) and reduce ``signature`` again into
    ``run/overrides`` (``overrides``: the file now there, whose measurement warning is kept); -> (rows written,
    the reduce's report)."""
    record = job_record(run)
    lock = PathLock(run / ".job.lock", timeout=0)
    try:
        lock.acquire()
    except LockTimeout:
        raise InputError("a farm tune is running into this folder; check it once that has finished",
                         source=str(run)) from None
    try:
        workload = record.get("workload") if isinstance(record.get("workload"), dict) else {}
        ctx = RunContext(str(record.get("job_id") or new_id()),
                         workload_name=workload_name if workload_name is not None else str(workload.get("name", "")))
        rows = list(rows)
        with ResultWriter(run / "results", ctx.run_id, name=name) as writer:
            writer.append(result_row(r, problem, pname, ctx, where) for r, problem, pname, where in rows)
        old = load_overrides(overrides, strict=False)
        generated = old.extra.get("generated_by")
        warning = generated.get("measurement_warning", "") if isinstance(generated, dict) else ""
        settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
        report = reduce_results(run / "results", run / "overrides", incumbents=(settings or {}).get("incumbents"),
                                signatures=[signature], measurement_warning=str(warning or ""))
    finally:
        lock.release()
    return len(rows), report
