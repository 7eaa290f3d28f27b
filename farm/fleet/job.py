"""A tuning job's output folder and the in-process way of running it.

    DIR/job.json      the job id (stable across resumes), workload, runs, counts
    DIR/results/      the Parquet dataset (farm.store.results)
    DIR/overrides/    one override file per device signature (farm.store.reduce)

Running a workload into a folder that already has results measures only the
(problem, device signature, plan spec) combinations that are missing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa

from farm._version import __version__
from farm.devices.device import Device
from farm.errors import FarmError, InputError
from farm.fsutil import atomic_write_bytes, move_aside
from farm.model.engine import EngineRegistry
from farm.model.records import AutotuneConfig, AutotuneResult
from farm.model.workload import Workload, WorkloadProblem
from farm.store.dataset import ResultsDataset, partition_signatures
from farm.store.deciding import Decisions, Winner, decide_results, incumbent_file, incumbent_spec, load_incumbents
from farm.store.location import Location, is_uri
from farm.store.reduce import ReduceReport, reduce_results, relocated, rendered
from farm.store.results import (
    CHECK_ROUNDS,
    MeasurementContext,
    ResultWriter,
    RunContext,
    candidate_key,
    new_id,
    now_iso,
    result_row,
    spec_of,
)
from farm.fleet.pruning import PlanPruning
from farm.fleet.scheduler import CONFIRM, Candidate, PriorRow, confirmed_calls, failed_in_stage
from farm.model.plans import PlanSpec
from farm.model.measurement import usable_time
from farm.model.records import CallMode
from farm.tuner.confirm import ConfirmRun, Measured
from farm.tuner.problem_tuning import ProblemOutcome, tune_problem
from farm.tuner.journal import InFlightJournal
from farm.tuner.watchdog import HangWatch

log = logging.getLogger("farm.fleet.job")

JOB_FILE_VERSION = 1
CALLS = {c.value for c in CallMode}


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
            _copy_files(self.location.join("overrides"), Location.of(self.overrides))

    def push_overrides(self) -> None:
        """The staged override files, winners tables and CSVs up to the remote job's ``overrides/``; the
        staging folder goes."""
        if self.remote:
            _copy_files(Location.of(self.overrides), self.location.join("overrides"))
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


def _copy_files(src: Location, dst: Location) -> None:
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


class _NoLock:
    def release(self) -> None:
        pass


def _lock_job_folder(job: JobDir) -> Any:
    """One run at a time writes into a job folder: a second one gets a clear error, not doubled measurements.
    (An object store has no lock to take: one driver per remote --out is the operator's to keep.)"""
    from farm.fsutil import LockTimeout, PathLock

    if job.remote:
        return _NoLock()
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


NO_WINNER_EXIT = 3  # farm tune's exit status: finished, but some problems have no winner
WAITING_EXIT = 4  # farm tune's exit status: finished what it could; problems wait for a device of a lost kind
WAITING = "waiting for a device of this signature (none was left in the cluster): a resume with one measures it"


@dataclass
class JobSummary:
    """How a run of a job ended: what every executor reports (and ``farm tune`` prints and exits with)."""

    job_id: str
    run_id: str
    rows_written: int
    counts: dict[str, int]  # disposition -> rows written by this run
    decisions: Decisions  # every winner of the folder's results (the reducer's decision)
    reduce: ReduceReport | None  # the files written (None with reduce off)
    no_winner: dict[str, dict[str, str]]  # signature -> problem name -> why it has no winner
    problems: int  # (signature, problem) pairs this run was asked for
    wall_s: float = 0.0
    verified: list[dict[str, Any]] = field(default_factory=list)  # farm verify's record of each decision checked
    waiting: dict[str, list[str]] = field(default_factory=dict)  # signature -> problems left for a device of it

    @property
    def winners(self) -> int:
        return self.problems - sum(len(v) for v in self.no_winner.values())

    @property
    def missing(self) -> int:
        """Problems (per signature) that ended with no winner."""
        return sum(len(v) for v in self.no_winner.values())

    def exit_code(self, *, allow_partial: bool = False) -> int:
        """0 when every problem has a winner; NO_WINNER_EXIT when the run finished but some have none
        (0 with ``allow_partial``, as long as one has a winner); WAITING_EXIT, before both, when problems wait for
        a device of a signature the cluster lost (the job is not finished: a resume finishes it)."""
        if self.waiting:
            return WAITING_EXIT
        if not self.missing or (allow_partial and self.winners):
            return 0
        return NO_WINNER_EXIT

    def winner(self, signature: str, problem_key: str) -> Winner | None:
        return self.decisions.winners.get((signature, problem_key))


class JobRun:
    """One run of a job in an output folder: the lifecycle both executors share.

    ``JobRun(...)`` opens (or resumes) the job record and the results writer; ``write`` streams rows;
    ``skip`` notes problems that could not be tuned; ``finish`` decides the winners (farm.tuner.winner, via the
    reducer), writes the override files and winners tables, and closes the record; ``fail`` records a crash.
    """

    def __init__(self, out: str | Path, workload: Workload, settings: dict[str, Any], job_id: str | None = None) -> None:
        self.t0 = time.perf_counter()
        self.workload = workload
        self.job = JobDir(out)
        self._lock = _lock_job_folder(self.job)
        try:
            self.record, self.run = self.job.start(workload, settings, job_id)
        except OSError as exc:
            self._lock.release()
            if not self.job.remote:
                raise
            raise InputError(f"cannot read or write there: {str(exc).splitlines()[0] if str(exc) else exc!r}",
                             field="out", value=self.job.location.uri) from None
        except BaseException:
            self._lock.release()
            raise
        # rows reach disk within about a second of being measured, however long the next candidate takes
        self.writer = ResultWriter(self.job.results, self.run.run_id, flush_seconds=1.0, background=True)
        self.counts: dict[str, int] = {}
        self.rows_elsewhere = 0  # rows the workers wrote (shared storage)
        self.parts: list[tuple[str, int]] = []  # the files they wrote, with their rows: the run's manifest
        self._skipped: dict[str, dict[str, str]] = {}
        self._signatures: set[str] = set()
        self.measurement_warning = ""  # why these measurements are not production's (written into the override files)
        self.waiting: dict[str, list[str]] = {}  # signature -> problems no device of it was left to measure
        self._fenced: list[tuple[str, str, str]] = []  # (signature, op, session) of lost nodes' tasks run again
        self._counted_parts: dict[str, set[str]] = {}  # session -> the parts of it counted as reported
        self._skipped_files: list[tuple[str, str]] = []  # results files the last decision could not read

    def done_candidates(self, signature: str) -> dict[str, set[str]]:
        """problem key -> candidate keys this folder has rows for on ``signature`` (the resume set)."""
        if not self.job.results.exists():
            return {}
        return ResultsDataset(self.job.results).check_pages().done_candidates(signature)

    def tuning(self, signature: str) -> None:
        """The workload's problems are tuned on ``signature`` (each one should end with a winner)."""
        self._signatures.add(signature)

    def write(self, rows: Iterable[tuple[AutotuneResult, WorkloadProblem, MeasurementContext]]) -> None:
        out = []
        for result, wp, where in rows:
            out.append(result_row(result, wp.problem, wp.name, self.run, where))
            self.counts[result.disposition.value] = self.counts.get(result.disposition.value, 0) + 1
        self.writer.append(out)

    def set_ranks(self, session_id: str, ranks: dict[str, int]) -> None:
        self.writer.set_ranks(session_id, ranks)

    def count(self, results: Iterable[AutotuneResult]) -> None:
        for result in results:
            self.counts[result.disposition.value] = self.counts.get(result.disposition.value, 0) + 1
            self.rows_elsewhere += 1

    def add_parts(self, parts: Iterable[tuple[str, int]]) -> None:
        self.parts.extend(parts)

    def results_of_session(self, signature: str, op: str, session_id: str) -> list[AutotuneResult]:
        """What a worker wrote of one session before it went (shared storage): rows it flushed into a part and
        could not report any more. Counted as reported, they are not measured (and written) again."""
        from farm.model.measurement import Strategy
        from farm.model.records import Disposition, TuneMode
        from farm.store.results import spec_of

        out = []
        for path, rows in self._session_parts(signature, op, {session_id}):
            self._counted_parts.setdefault(session_id, set()).add(path)
            for row in rows:
                spec = spec_of(row["candidate_key"])
                out.append(AutotuneResult(
                    problem_key=row["problem_key"], engine_id=spec.engine_id, engine_name=row["engine_name"],
                    knobs=spec.knobs, disposition=Disposition(row["disposition"]), mode=TuneMode(row["mode"]),
                    strategy=Strategy(row["strategy"]), candidate=row["candidate_index"], error=row["error"] or "",
                    median_ms=row["median_ms"], mad_ms=row["mad_ms"], min_ms=row["min_ms"], avg_ms=row["avg_ms"]))
        return out

    def fence(self, signature: str, op: str, session_id: str) -> None:
        """A lost node's session runs again elsewhere: a part its worker writes late (a node dies over a second or
        so, and a worker cut off may go on) is set aside when the run ends, not read as data."""
        self._fenced.append((signature, op, session_id))

    def _session_parts(self, signature: str, op: str, sessions: set[str]) -> list[tuple[str, list[dict[str, Any]]]]:
        """This run's parts of (signature, op) holding rows of ``sessions``: (path, those rows)."""
        import pyarrow.parquet as pq

        if not self.job.results.exists():
            return []
        data = ResultsDataset(self.job.results, signatures=[signature])
        cols = ["session_id", "problem_key", "candidate_key", "candidate_index", "engine_name", "disposition", "mode",
                "strategy", "median_ms", "mad_ms", "min_ms", "avg_ms", "error"]
        out = []
        for path in data.files:
            folder, _, name = path.replace("\\", "/").rpartition("/")
            if not folder.endswith(f"/op={op}") or not name.startswith(f"part-{self.run.run_id}-"):
                continue
            rows = pq.read_table(path, columns=cols, filesystem=data.location.fs).to_pylist()
            hits = [r for r in rows if r["session_id"] in sessions]
            if hits:
                out.append((path, hits if len(hits) < len(rows) else rows))
        return out

    def _set_aside_late_parts(self) -> list[dict[str, Any]]:
        """Parts of fenced sessions (``fence``) that were not counted: set aside (renamed, so no reader lists them)."""
        out = []
        for sig, op, session in self._fenced:
            for path, rows in self._session_parts(sig, op, {session}):
                if path in self._counted_parts.get(session, set()):
                    continue
                if any(r["session_id"] != session for r in rows):  # a part of other sessions too: kept
                    log.warning("farm: %s holds rows of the lost session %s and of others: kept", path, session)
                    continue
                moved = self.job.location.set_aside(path, "lost-worker")
                log.warning("farm: a part a lost node's worker wrote after its task ran again elsewhere (%d rows) set "
                            "aside: %s", len(rows), moved)
                out.append({"session_id": session, "rows": len(rows), "path": str(moved)})
        return out

    @property
    def rows_written(self) -> int:
        return self.writer.rows_written + self.rows_elsewhere

    def wait_for_devices(self, signature: str, problem_names: Iterable[str]) -> None:
        """These problems wait for a device of ``signature`` (the cluster lost its last one): no decision of theirs
        is published from this run's partial rows; the run ends 'waiting' and a resume measures them."""
        names = sorted(set(problem_names))
        if names:
            self.waiting[signature] = names

    def skip(self, signature: str, problem_name: str, reason: str) -> None:
        self._skipped.setdefault(signature, {})[problem_name] = reason

    def finish(self, *, reduce: bool = True, top_k: int = 3,
               verify: Callable[[str, str, list[str]], Any] | None = None, **fields: Any) -> JobSummary:
        """Decide, reduce and close the record. ``verify(signature, override file text, problem keys)``, where
        given and the files were written, replays each signature's decisions where they run (farm verify): its
        rows join the results and the winners are decided again, so a decision it fixed is not published."""
        self.writer.flush()  # every row measured is on disk before the decision reads them
        set_aside = self._set_aside_late_parts()
        if set_aside:
            fields["set_aside"] = set_aside
        per_sig = self._decisions(top_k)
        verification: dict[str, Any] | None = None
        if verify is not None and reduce:
            # the check reads each file as it would be written; only the signatures it wrote rows for are decided
            # again; each file is written once, after it
            verification = self._verify({sig: rendered(d, sig, top_k) for sig, d in per_sig.items()}, per_sig,
                                        verify)
            if verification["signatures"]:
                per_sig.update(self._decisions(top_k, only=verification["signatures"]))
        decisions, report = self._write(per_sig, reduce, top_k)
        self.writer.close()
        no_winner: dict[str, dict[str, str]] = {s: dict(v) for s, v in self._skipped.items()}
        for sig, names in self.waiting.items():
            no_winner.setdefault(sig, {}).update({name: WAITING for name in names})
        problems = 0
        for sig in sorted(self._signatures):
            for wp in self.workload.problems:
                problems += 1
                if (sig, wp.problem.key) in decisions.winners or wp.name in no_winner.get(sig, {}):
                    continue
                no_winner.setdefault(sig, {})[wp.name] = "every candidate failed" if wp.problem.key in \
                    decisions.tuned.get(sig, set()) else "nothing was measured"
        manifest = self._write_manifest()
        if manifest:
            fields["manifest"] = manifest
        if verification is not None:
            fields["verify"] = {k: v for k, v in verification.items() if k not in ("rows", "signatures")}
        summary = JobSummary(self.run.job_id, self.run.run_id, self.rows_written, dict(self.counts), decisions,
                             report, no_winner, problems, time.perf_counter() - self.t0,
                             verified=list((verification or {}).get("decisions", [])), waiting=dict(self.waiting))
        if self.waiting:
            fields["waiting_for_devices"] = {sig: {"problems": names, "why": WAITING}
                                             for sig, names in sorted(self.waiting.items())}
        self.job.finish(self.record, self.run, state="waiting" if self.waiting else "finished", rows_written=summary.rows_written, counts=summary.counts,
                        signatures=sorted(self._signatures), problems=problems, winners=summary.winners,
                        no_winner=no_winner, wall_s=summary.wall_s, **fields)
        self._lock.release()
        return summary

    def _verify(self, texts: dict[str, str], per_sig: dict[str, Decisions],
                verify: Callable[[str, str, list[str]], Any]) -> dict[str, Any]:
        """Each signature's decisions of this workload that no check has seen yet (a resume verifies only what
        changed), replayed by ``verify`` from the file's text before it is written; its rows are written."""
        names = {wp.problem.key: wp.name for wp in self.workload.problems}
        records: list[dict[str, Any]] = []
        skipped: list[dict[str, str]] = []
        rows = 0
        checked: list[str] = []
        for sig, text in texts.items():
            winners = per_sig[sig].winners
            if sig not in self._signatures or not winners:
                continue
            keys = [k for k in names if (sig, k) in winners and
                    any(w.verified is None for w in (winners[(sig, k)], *winners[(sig, k)].others))]
            if not keys:
                continue
            try:
                outcome = verify(sig, text, keys)
            except FarmError as exc:  # the tuning is done and kept: the check says why it did not run
                log.warning("farm: verifying %s failed: %s", sig, exc)
                skipped.append({"signature": sig, "why": str(exc)})
                continue
            made = [result_row(r, problem, names.get(problem.key, name), self.run, where)
                    for r, problem, name, where in outcome.rows]
            self.writer.append(made)
            rows += len(made)
            if made:
                checked.append(sig)
            records += [dict(r, signature=sig) for r in outcome.records]
            skipped += [{"signature": sig, "problem": n, "why": w} for n, w in outcome.skipped]
        self.writer.flush()
        tally = {"checked": len(records), "holds": sum(r["verdict"] == "holds" for r in records),
                 "flagged": sum(r["verdict"].startswith("flagged") for r in records),
                 "fixed": sum(r["verdict"].startswith("fixed") for r in records),
                 "not_verified": sum(r["verdict"].startswith("not verified") for r in records)}
        return {"rows": rows, "signatures": checked, **tally, "decisions": records, "skipped": skipped}

    def _decisions(self, top_k: int, only: Sequence[str] | None = None) -> dict[str, Decisions]:
        """The winners of the folder's results, one device signature at a time (the driver holds one signature's
        rows at once, not the dataset); ``only``: these signatures."""
        results = self.job.results
        listing = ResultsDataset(results) if results.exists() else None  # every file checked and named once
        signatures = partition_signatures(results) if listing is not None else []
        source = self.record.get("settings", {}).get("incumbents")
        out: dict[str, Decisions] = {}
        for sig in signatures:
            if only is not None and sig not in only:
                continue
            data = listing.partition(sig)  # type: ignore[union-attr]
            out[sig] = self._without_waiting(sig, decide_results(data, incumbents=load_incumbents(source, data),
                                                                 top_k=top_k))
        self._skipped_files = [(f.path, f.reason) for f in listing.skipped] if listing is not None else []
        return out

    def _write(self, per_sig: dict[str, Decisions], reduce: bool, top_k: int) -> tuple[Decisions, ReduceReport | None]:
        """Every signature's decisions together, and its override file and winners table written (once) when
        ``reduce``."""
        winners: dict[tuple[str, str], Winner] = {}
        tuned: dict[str, set[str]] = {}
        skipped: list[tuple[str, str]] = list(self._skipped_files)
        rows = 0
        written = []
        if reduce:
            self.job.pull_overrides()
        for sig, d in per_sig.items():
            if reduce:
                written += reduce_results(self.job.results, self.job.overrides, top_k=top_k, decisions=d,
                                          measurement_warning=self.measurement_warning).signatures
            winners.update(d.winners)
            tuned.update(d.tuned)
            skipped += [s for s in d.skipped_files if s not in skipped]
            rows += d.rows
        decisions = Decisions(pa.table({}), winners, {}, tuned, skipped, rows)
        if not reduce:
            return decisions, None
        if self.job.remote:
            self.job.push_overrides()
            there = self.job.location.join("overrides")
            written = [relocated(r, lambda name: there.join(name).uri) for r in written]
        return decisions, ReduceReport(written, skipped, rows, decisions)

    def _without_waiting(self, sig: str, d: Decisions) -> Decisions:
        """``d`` without the problems that wait for a device of ``sig``: their rows are partial (a resume decides)."""
        waiting = {wp.problem.key for wp in self.workload.problems if wp.name in self.waiting.get(sig, ())}
        if not waiting:
            return d
        return dataclasses.replace(d, winners={k: w for k, w in d.winners.items() if k[1] not in waiting or k[0] != sig},
                                   tuned={s: (keys - waiting if s == sig else keys) for s, keys in d.tuned.items()})

    def _write_manifest(self) -> str:
        """``manifests/<run id>.json``: every results file of this run and its rows ('' when the driver wrote
        them all: its own files are the run's part names)."""
        if not self.parts:
            return ""
        parts = [{"path": p, "rows": n} for p, n in [*self.parts, *self.writer.part_rows]]
        name = f"manifests/{self.run.run_id}.json"
        if not self.job.remote:
            (self.job.root / "manifests").mkdir(parents=True, exist_ok=True)
        self.job.location.write_text(name, json.dumps({"run_id": self.run.run_id, "parts": parts}, indent=1) + "\n")
        return name

    def fail(self, exc: BaseException) -> None:
        try:
            self.writer.close()
        finally:
            self.job.finish(self.record, self.run, state="failed", error=f"{type(exc).__name__}: {exc}")
            self._lock.release()


@dataclass
class LocalRunReport:
    outcomes: list[ProblemOutcome]
    summary: JobSummary
    pruning: dict[str, Any] | None = None  # farm tune --prune: settings, measured and pruned counts

    @property
    def job_id(self) -> str:
        return self.summary.job_id

    @property
    def run_id(self) -> str:
        return self.summary.run_id

    @property
    def rows_written(self) -> int:
        return self.summary.rows_written

    @property
    def reduce(self) -> ReduceReport | None:
        return self.summary.reduce

    @property
    def wall_s(self) -> float:
        return self.summary.wall_s

    @property
    def counts(self) -> dict[str, int]:
        return self.summary.counts


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
    incumbents: str | None = None,
    candidate_timeout_s: float | None = None,
    on_hang: Callable[[str], None] | None = None,
    verifier: Callable[..., Any] | None = None,
) -> LocalRunReport:
    """Tune every problem on one in-process device into ``out``; resume what is there.

    ``incumbents``: an override file or published root whose winners are kept within noise.
    ``candidate_timeout_s``: a candidate compiling or measured for longer gets a ``timed_out`` row
    (written at once, with every row before it), then ``on_hang(message)`` is called from the watch's
    thread: the process cannot take the candidate back, so the caller ends or restarts it, and a
    resume goes on after the candidate. ``verifier(device, override file text, problem keys)``: after the
    reduce, the decisions are replayed beside the direct call on ``device`` (farm.replay.verify.verify_for_job).
    """
    # a candidate measured past its budget ends there (a hang past the timeout is the watch's)
    config = (config or workload.autotune).bounded_by(candidate_timeout_s)
    pruning = PlanPruning(config.prune, config, lambda rows: None) if config.prune is not None else None
    jr = JobRun(out, workload, {"executor": "in-process", "device": device.signature, "incumbents": incumbents,
                                "candidate_timeout_s": candidate_timeout_s,
                                "prune": pruning.pruner.record() if pruning else None})
    if pruning is not None:
        pruning.write = jr.write
    current: dict[str, Any] = {}  # the problem being tuned, for the hang watch
    journal = InFlightJournal(jr.job.root / JOURNAL) if not jr.job.remote else None
    if journal is not None:
        _after_an_unfinished_run(jr, journal, workload, device, registry, config)
    watch = _hang_watch(jr, current, config, candidate_timeout_s, on_hang, journal) \
        if candidate_timeout_s or journal is not None else None
    try:
        # a tuning run compiles for a while: engines may start what helps (Triton's compile pool on a GPU)
        registry.prepare((e.name for e in registry if any(wp.engines.selects(e.name) for wp in workload.problems)),
                         "gpu" if device.vendor in ("nvidia", "amd") else device.vendor)
        jr.tuning(device.signature)
        done = jr.done_candidates(device.signature)
        prior = prior_rows(ResultsDataset(jr.job.results).check_pages(), device.signature) if done else {}
        standing = incumbent_file(incumbents, device.properties)
        outcomes: list[ProblemOutcome] = []
        for wp in workload.problems:
            where = MeasurementContext(device.properties)

            def stream(result: AutotuneResult, _wp: Any = wp, _where: MeasurementContext = where) -> None:
                jr.write([(result, _wp, _where)])

            def confirmed(run: ConfirmRun, _wp: Any = wp) -> None:
                stage = MeasurementContext(device.properties, round=CONFIRM, call=run.call.value,
                                           session_size=len(run.results))
                jr.write([(r, _wp, stage) for r in run.results])

            previous = [spec_of(k) for k in done.get(wp.problem.key, ())]
            rows = prior.get(wp.problem.key, ())
            current.update(wp=wp, where=where)
            incumbent = incumbent_spec(standing, wp.problem)
            select = None
            if pruning is not None:
                def select(specs: list[PlanSpec], _wp: Any = wp, _rows: Any = rows, _inc: Any = incumbent) -> list[PlanSpec]:
                    cands = [Candidate(s, registry.get(s.engine_id).name, i) for i, s in enumerate(specs)]
                    return [c.spec for c in pruning.apply(device.properties, _wp, cands, _rows, _inc)]
            outcome = tune_problem(wp, device, config, registry, seed=workload.seed,
                                   done=previous, listener=stream, watch=watch, prior=measured_of(rows),
                                   confirmed={CallMode(c) for c in confirmed_calls(rows) if c in CALLS},
                                   incumbent=incumbent, on_confirm=confirmed, select=select)
            jr.set_ranks(where.session_id, {candidate_key(r.engine_id, r.knobs): r.rank for r in outcome.results})
            if outcome.error and not outcome.results and not outcome.skipped:
                jr.skip(device.signature, wp.name, outcome.error)
            outcomes.append(outcome)
            if on_problem is not None:
                on_problem(outcome)
    except BaseException as exc:
        jr.fail(exc)
        raise
    finally:
        if watch is not None:
            watch.close()
        if journal is not None:  # this run ended in Python (finished, an error, a Ctrl-C): nothing to attribute
            journal.settle(None)
            journal.close()
    check = None if verifier is None else (lambda sig, text, keys: verifier(device, text, keys))
    summary = jr.finish(reduce=reduce, top_k=top_k, verify=check, device=device.properties.to_dict(),
                        **({"pruning": pruning.pruner.tally.to_json()} if pruning else {}))
    return LocalRunReport(outcomes, summary, pruning.record() if pruning else None)


def prior_rows(dataset: ResultsDataset | None, signature: str) -> dict[str, list[PriorRow]]:
    """problem key -> every row measured before on ``signature`` (resume): what scheduling and the
    confirmation stage need of it."""
    if dataset is None or not dataset.files:
        return {}
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    # min_ms is read too, so a row the reducer would drop (an infinite time) is dropped here as well
    # farm verify's and the model check's rows check published decisions: no part of the tuning a resume rebuilds
    t = dataset.table(["problem_key", "candidate_key", "round", "call", "session_id", "succeeded", "median_ms",
                       "mad_ms", "session_size", "disposition", "measured_at", "min_ms"],
                      filter=(ds.field("device_signature") == signature) & ~ds.field("round").isin(list(CHECK_ROUNDS)))
    when = pc.divide(pc.cast(t["measured_at"], pa.int64()), 1000.0).to_pylist()
    out: dict[str, list[PriorRow]] = {}
    cols = [t.column(c).to_pylist() for c in t.column_names[:-2]]
    for (pk, ck, rnd, call, sess, ok, med, mad, size, disp), at in zip(zip(*cols), when):
        out.setdefault(pk, []).append(PriorRow(spec_of(ck), rnd, sess, bool(ok), med, mad, call or "", at or 0.0,
                                               size, disp == "pruned"))
    return out


def measured_of(rows: Iterable[PriorRow]) -> list[Measured]:
    """The successful main-round rows among ``rows`` (the latest of each candidate), for the confirmation stage;
    none of a candidate that failed in a stage since."""
    rows = list(rows)
    dropped = failed_in_stage(rows)
    latest: dict[Any, PriorRow] = {}
    for r in rows:
        if r.round != CONFIRM and r.succeeded and usable_time(r.median_ms) and r.spec not in dropped:
            if r.spec not in latest or r.measured_at >= latest[r.spec].measured_at:
                latest[r.spec] = r
    return [Measured(r.spec, -1, r.session, r.median_ms, r.mad_ms or 0.0) for r in latest.values()]


def _hang_watch(jr: JobRun, current: dict[str, Any], config: AutotuneConfig, timeout_s: float | None,
                on_hang: Callable[[str], None] | None, journal: InFlightJournal | None = None) -> HangWatch:
    """A watch that records a stuck candidate as timed out (with every row before it) and ends the run's record;
    with ``journal``, it keeps the candidates in flight there."""

    def hung(tuner: Any, spec: Any, seconds: float) -> None:
        row = _timed_out_row(tuner, spec, seconds, config)
        where = current["where"]
        stage = getattr(tuner.in_flight, "stage", "")
        if stage:  # in a confirmation stage: a failed row of the stage (no session size: no stage ran)
            where = MeasurementContext(where.device, round=CONFIRM, call=stage)
            row = dataclasses.replace(row, error=f"confirmation ({stage}): {row.error}")
        jr.write([(row, current["wp"], where)])
        jr.writer.flush()
        if journal is not None:
            journal.settle(None)  # recorded: the restart has nothing to attribute
        message = (f"{current['wp'].name}: {row.engine_name} {dict(spec.knobs)} hung for {seconds:.0f} s "
                   f"{'in the confirmation stage ' if stage else ''}"
                   f"(candidate timeout {timeout_s:g} s); recorded as timed_out")
        jr.job.finish(jr.record, jr.run, state="failed", error=message, rows_written=jr.writer.rows_written)
        if on_hang is not None:
            on_hang(message)

    return HangWatch(timeout_s or None, hung, journal)


JOURNAL = ".in-flight"  # farm.tuner.journal's file in an in-process run's output folder


def _after_an_unfinished_run(jr: JobRun, journal: InFlightJournal, workload: Workload, device: Device,
                             registry: EngineRegistry, config: AutotuneConfig) -> None:
    """The last in-process run into this folder ended without finishing (a native crash of a candidate, or the
    process killed) while one candidate ran: the first time it runs again (a kill names nobody), the second time
    in a row it gets a ``crashed`` row (of the stage it was in), and the run goes on after it."""
    from farm.model.records import Disposition
    from farm.tuner.autotuner import Autotuner
    from farm.tuner.problem_tuning import plan_specs_for

    now, suspect = journal.read()
    wp = next((w for w in workload.problems if now is not None and w.problem.key == now.problem_key), None)
    if now is None or wp is None or len(now.candidates) != 1:
        journal.settle(None)
        return
    spec = spec_of(now.candidates[0])
    engine = registry.get(spec.engine_id) if spec is not None else None
    where = f"{' confirmation stage (' + now.stage + ')' if now.stage else ' main round'}"
    label = f"{engine.name if engine else now.candidates[0]} {dict(spec.knobs) if spec else ''}".strip()
    if spec is None or engine is None or suspect != now:
        log.warning("farm: the last run into this folder ended while %s ran in the%s of %s (a native crash, or the "
                    "process was killed); it runs again, and is recorded as crashed if the run ends so again",
                    label, where, wp.name)
        journal.settle(now)
        return
    tuner = Autotuner(wp.problem, device, registry=registry)
    try:
        specs = plan_specs_for(wp, tuner)
    except FarmError:
        specs = []
    finally:
        tuner.close()
    stage = f"confirmation ({now.stage}): " if now.stage else ""
    row = AutotuneResult(
        problem_key=wp.problem.key, engine_id=spec.engine_id, engine_name=engine.name, knobs=spec.knobs,
        disposition=Disposition.CRASHED, mode=config.mode, strategy=config.strategy,
        candidate=specs.index(spec) if spec in specs else -1,
        error=f"{stage}the process ended while it ran, in two runs in a row (a native crash: in-process, nothing "
              "survives it to say more); quarantined", started_at=now_iso())
    context = MeasurementContext(device.properties, round=CONFIRM if now.stage else "main", call=now.stage)
    jr.write([(row, wp, context)])
    jr.writer.flush()
    log.warning("farm: %s ended the process twice in the%s of %s: recorded as crashed; the run goes on without it",
                label, where, wp.name)
    journal.settle(None)


def _timed_out_row(tuner: Any, spec: Any, seconds: float, config: AutotuneConfig) -> AutotuneResult:
    from farm.model.records import Disposition

    engine = tuner.registry.get(spec.engine_id)
    specs = list(tuner.specs)
    return AutotuneResult(
        problem_key=tuner.problem.key, engine_id=spec.engine_id, engine_name=engine.name if engine else "?",
        knobs=spec.knobs, disposition=Disposition.TIMED_OUT, mode=config.mode, strategy=config.strategy,
        candidate=specs.index(spec) if spec in specs else -1,
        error=f"no result within the candidate timeout ({seconds:.0f} s in-process); the run was restarted",
        started_at=now_iso())
