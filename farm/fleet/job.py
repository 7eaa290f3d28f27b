"""One run of a tuning job in its output folder (farm.fleet.job_folder), the lifecycle both executors share:
rows streamed into the results, problems skipped or waiting, then the decisions written once (``JobRun.finish``).

Running a workload into a folder that already has results measures only the (problem, device signature, plan
spec) combinations that are missing (``prior_rows``). The executors: farm.fleet.local_run (in-process) and
farm.fleet.on_ray.cluster (Ray).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa

from farm.errors import FarmError, InputError
from farm.model.records import AutotuneResult
from farm.model.workload import Workload, WorkloadProblem
from farm.store.dataset import ResultsDataset, partition_signatures
from farm.store.deciding.records import Decisions, Winner
from farm.store.deciding.rule import decide_results
from farm.store.deciding.incumbents import load_incumbents
from farm.store.reduce import ReduceReport, reduce_results, relocated, rendered
from farm.store.results import CHECK_ROUNDS, MeasurementContext, ResultWriter, result_row
from farm.model.plans import spec_of
from farm.fleet.job_folder import JobDir, lock_job_folder
from farm.fleet.late_parts import LateParts
from farm.fleet.tasks import PriorRow

log = logging.getLogger("farm.fleet.job")

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
    ``skip`` notes problems that could not be tuned; ``finish`` decides the winners (farm.tuner.judging.winner, via the
    reducer), writes the override files and winners tables, and closes the record; ``fail`` records a crash.
    """

    def __init__(self, out: str | Path, workload: Workload, settings: dict[str, Any], job_id: str | None = None) -> None:
        self.t0 = time.perf_counter()
        self.workload = workload
        self.job = JobDir(out)
        self._lock = lock_job_folder(self.job)
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
        self.late = LateParts(self.job, self.run.run_id)  # lost nodes' sessions and the parts they write late
        self._skipped_files: list[tuple[str, str]] = []  # results files the last decision could not read

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
        """What a worker wrote of one session before it went (farm.fleet.late_parts.LateParts)."""
        return self.late.results_of_session(signature, op, session_id)

    def fence(self, signature: str, op: str, session_id: str) -> None:
        """A lost node's session runs again elsewhere (farm.fleet.late_parts.LateParts)."""
        self.late.fence(signature, op, session_id)

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
        set_aside = self.late.set_aside()
        if set_aside:
            fields["set_aside"] = set_aside
        if self.late.any:
            fields["fenced"] = self.late.record()
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
                       "mad_ms", "session_size", "disposition", "converged", "measured_at", "min_ms"],
                      filter=(ds.field("device_signature") == signature) & ~ds.field("round").isin(list(CHECK_ROUNDS)))
    when = pc.divide(pc.cast(t["measured_at"], pa.int64()), 1000.0).to_pylist()
    out: dict[str, list[PriorRow]] = {}
    cols = [t.column(c).to_pylist() for c in t.column_names[:-2]]
    for (pk, ck, rnd, call, sess, ok, med, mad, size, disp, conv), at in zip(zip(*cols), when):
        out.setdefault(pk, []).append(PriorRow(spec_of(ck), rnd, sess, bool(ok), med, mad, call or "", at or 0.0,
                                               size, disp == "pruned", conv is not False))
    return out

