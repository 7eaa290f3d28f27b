"""A tuning job's output folder and the in-process way of running it.

    DIR/job.json      the job id (stable across resumes), workload, runs, counts
    DIR/results/      the Parquet dataset (farm.results)
    DIR/overrides/    one override file per device signature (farm.reduce)

Running a workload into a folder that already has results measures only the
(problem, device signature, plan spec) combinations that are missing.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import __version__
from .autotune import AutotuneConfig, AutotuneResult
from .device import Device
from .engine import EngineRegistry
from .errors import InputError
from .fsutil import atomic_write_text, move_aside
from .reduce import ReduceReport, reduce_results
from .results import MeasurementContext, ResultsDataset, ResultWriter, RunContext, candidate_key, new_id, now_iso, \
    result_row, spec_of
from .tuning import ProblemOutcome, tune_problem
from .workload import Workload

log = logging.getLogger("farm.job")

JOB_FILE_VERSION = 1


@dataclass
class JobDir:
    """Paths and the job record of one output folder."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def overrides(self) -> Path:
        return self.root / "overrides"

    @property
    def job_file(self) -> Path:
        return self.root / "job.json"

    def read_job(self) -> dict[str, Any]:
        """The job record, {} when there is none; a corrupt one is moved aside."""
        if not self.job_file.exists():
            return {}
        try:
            data = json.loads(self.job_file.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("job_id"), str):
                raise ValueError("no job_id")
            return data
        except (ValueError, OSError) as exc:
            moved = move_aside(self.job_file)
            log.warning("job: %s unreadable (%s); moved aside to %s, starting a new job record", self.job_file, exc, moved)
            return {}

    def write_job(self, record: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.job_file, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

    def start(self, workload: Workload, settings: dict[str, Any], job_id: str | None = None) -> tuple[dict[str, Any], RunContext]:
        """Open (or resume) the job record and start a run in it."""
        if self.root.exists() and not self.root.is_dir():
            raise InputError("--out must be a folder", source=str(self.root))
        record = self.read_job()
        if record and job_id and record["job_id"] != job_id:
            raise InputError(f"this folder belongs to job {record['job_id']}, not {job_id}; use another --out",
                             source=str(self.root))
        if record and record.get("workload", {}).get("digest") not in (None, workload.digest):
            log.warning("job: the workload changed since this folder's last run; only missing combinations are measured")
        run = RunContext(job_id=record.get("job_id") or job_id or new_id(), workload_name=workload.name,
                         workload_digest=workload.digest)
        record = record or {"version": JOB_FILE_VERSION, "job_id": run.job_id, "created_at": run.run_started_at, "runs": []}
        record["workload"] = {"name": workload.name, "source": workload.source, "digest": workload.digest,
                              "problems": workload.problem_count}
        record["settings"] = settings
        record["farm_version"] = __version__
        record["runs"].append({"run_id": run.run_id, "started_at": run.run_started_at, "host": socket.gethostname(),
                               "state": "running"})
        self.write_job(record)
        return record, run

    def finish(self, record: dict[str, Any], run: RunContext, **fields: Any) -> None:
        for r in record["runs"]:
            if r["run_id"] == run.run_id:
                r.update(fields)
                r["ended_at"] = now_iso()
        self.write_job(record)


@dataclass
class LocalRunReport:
    outcomes: list[ProblemOutcome]
    job_id: str
    run_id: str
    rows_written: int
    reduce: ReduceReport | None
    wall_s: float
    counts: dict[str, int] = field(default_factory=dict)


def run_local(
    workload: Workload,
    out: str | Path,
    device: Device,
    registry: EngineRegistry,
    *,
    config: AutotuneConfig | None = None,
    on_problem: Callable[[ProblemOutcome], None] | None = None,
    reduce: bool = True,
    top_k: int = 3,
) -> LocalRunReport:
    """Tune every problem on one in-process device into ``out``; resume what is there."""
    t0 = time.perf_counter()
    job = JobDir(Path(out))
    record, run = job.start(workload, {"executor": "in-process", "device": device.signature})
    done = ResultsDataset(job.results).done_candidates(device.signature) if job.results.exists() else {}
    counts: dict[str, int] = {}
    outcomes: list[ProblemOutcome] = []
    with ResultWriter(job.results, run.run_id) as writer:
        for wp in workload.problems:
            where = MeasurementContext(device.properties)

            def stream(result: AutotuneResult, _wp: Any = wp, _where: MeasurementContext = where) -> None:
                writer.append([result_row(result, _wp.problem, _wp.name, run, _where)])
                counts[result.disposition.value] = counts.get(result.disposition.value, 0) + 1

            previous = [spec_of(k) for k in done.get(wp.problem.key, ())]
            outcome = tune_problem(wp, device, config or workload.autotune, registry, seed=workload.seed,
                                   done=previous, listener=stream)
            writer.set_ranks(where.session_id, {candidate_key(r.engine_id, r.knobs): r.rank for r in outcome.results})
            outcomes.append(outcome)
            if on_problem is not None:
                on_problem(outcome)
    rows = writer.rows_written
    report = reduce_results(job.results, job.overrides, top_k=top_k) if reduce and job.results.exists() else None
    job.finish(record, run, state="finished", rows_written=rows, counts=counts,
               signatures=[device.signature], device=device.properties.to_dict())
    return LocalRunReport(outcomes, run.job_id, run.run_id, rows, report, time.perf_counter() - t0, counts)
