"""A tuning job's output folder: its paths, its job record, and the lock one run at a time holds.

    DIR/job.json      the job id (stable across resumes), workload, runs, counts
    DIR/results/      the Parquet dataset (farm.store.results)
    DIR/overrides/    one override file per device signature (farm.store.reduce)

The folder is local, or a ``pyarrow.fs`` URI (``s3://...``) the workers write their results parts into.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm._version import __version__
from farm.errors import InputError
from farm.fsutil import atomic_write_bytes, move_aside
from farm.model.workload import Workload
from farm.store.location import Location, is_uri
from farm.store.results import RunContext, new_id, now_iso

log = logging.getLogger("farm.fleet.job")

JOB_FILE_VERSION = 1


@dataclass
class JobDir:
    """Paths and the job record of one output folder: a local folder, or a ``pyarrow.fs`` URI (``s3://...``)
    that workers on other hosts write their results parts into (farm.store.location)."""

    root: Any

    def __post_init__(self) -> None:
        self.location = Location.of(self.root)
        self.root = self.location.local_path if self.location.local else self.location
        self._staging: Path | None = None

    @property
    def remote(self) -> bool:
        """Not on a local filesystem (an object store)."""
        return not self.location.local

    @property
    def shared(self) -> bool:
        """Given as a URI (``s3://``, ``gs://``, ``file://`` for a mount every host has): storage the workers
        write to themselves. A plain path is the driver's own disk."""
        return is_uri(self.location.uri)

    @property
    def results(self) -> Path | Location:
        return self.location.join("results") if self.remote else self.root / "results"

    @property
    def overrides(self) -> Path:
        """Where the override files are written: the folder's own, or for a remote job a local staging folder
        holding its current override files (``pull_overrides``) until ``push_overrides`` uploads them."""
        if not self.remote:
            return self.root / "overrides"
        if self._staging is None:
            self._staging = Path(tempfile.mkdtemp(prefix="tunefarm-overrides-"))
        return self._staging

    @property
    def job_file(self) -> Path | Location:
        return self.location.join("job.json") if self.remote else self.root / "job.json"

    def read_job(self) -> dict[str, Any]:
        """The job record, {} when there is none; a corrupt one is moved aside."""
        text = self.location.read_text("job.json")
        if text is None:
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("job_id"), str):
                raise ValueError("no job_id")
            return data
        except ValueError as exc:
            if self.remote:
                moved = f"{self.location.path}/job.json.corrupt-{int(time.time())}"
                self.location.fs.move(f"{self.location.path}/job.json", moved)
            else:
                moved = move_aside(self.root / "job.json")
            log.warning("job: %s unreadable (%s); moved aside to %s, starting a new job record", self.job_file, exc, moved)
            return {}

    def write_job(self, record: dict[str, Any]) -> None:
        if not self.remote:
            self.root.mkdir(parents=True, exist_ok=True)
        self.location.write_text("job.json", json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

    def pull_overrides(self) -> None:
        """A remote job's current override files into the staging folder (a reduce appends to them)."""
        if self.remote:
            copy_files(self.location.join("overrides"), Location.of(self.overrides))

    def push_overrides(self) -> None:
        """The staged override files, winners tables and CSVs up to the remote job's ``overrides/``; the
        staging folder goes."""
        if self.remote:
            copy_files(Location.of(self.overrides), self.location.join("overrides"))
            shutil.rmtree(self.overrides, ignore_errors=True)
            self._staging = None

    def start(self, workload: Workload, settings: dict[str, Any], job_id: str | None = None) -> tuple[dict[str, Any], RunContext]:
        """Open (or resume) the job record and start a run in it."""
        if self.location.exists() and not self.location.is_dir():
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


def copy_files(src: Location, dst: Location) -> None:
    for path in src.files():
        name = src.relative(path)
        if "/" in name or name.startswith((".", "_")):
            continue  # temporary files and lock files stay where they are
        with src.fs.open_input_stream(path) as f:
            data = f.read()
        if dst.local:
            dst.local_path.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(dst.local_path / name, data)
        else:
            with dst.fs.open_output_stream(f"{dst.path}/{name}") as out:
                out.write(data)


class NoLock:
    def release(self) -> None:
        pass


def lock_job_folder(job: JobDir) -> Any:
    """One run at a time writes into a job folder: a second one gets a clear error, not doubled measurements.
    (An object store has no lock to take: one driver per remote --out is the operator's to keep.)"""
    from farm.fsutil import LockTimeout, PathLock

    if job.remote:
        return NoLock()
    if job.root.exists() and not job.root.is_dir():
        raise InputError("--out must be a folder", source=str(job.root))
    job.root.mkdir(parents=True, exist_ok=True)
    lock = PathLock(job.root / ".job.lock", timeout=0)
    try:
        lock.acquire()
    except LockTimeout:
        raise InputError("another farm tune is running into this folder; wait for it to finish or use another --out",
                         source=str(job.root)) from None
    return lock
