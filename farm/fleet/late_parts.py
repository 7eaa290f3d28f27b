"""Rows a lost node's worker wrote (shared storage): what a run counts of a lost session as reported, and the parts
such a worker writes late, set aside when the run ends (farm.fleet.job.JobRun keeps one of these)."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from farm.model.records import AutotuneResult
from farm.store.dataset import ResultsDataset, fenced_sessions
from farm.fleet.job_folder import JobDir
from farm.fleet.tasks import CONFIRM

log = logging.getLogger("farm.fleet.job")


class LateParts:
    """The sessions of lost nodes' tasks run again elsewhere (``fence``) and the parts of them counted as reported
    (``results_of_session``), in one run (``run_id``) of the job folder ``job``."""

    def __init__(self, job: JobDir, run_id: str) -> None:
        self.job = job
        self.run_id = run_id
        self._fenced: list[tuple[str, str, str]] = []  # (signature, op, session) of lost nodes' tasks run again
        self._counted_parts: dict[str, set[str]] = {}  # session -> the parts of it counted as reported

    @property
    def any(self) -> bool:
        return bool(self._fenced)

    def results_of_session(self, signature: str, op: str, session_id: str) -> list[AutotuneResult]:
        """What a worker wrote of one session before it went (shared storage): rows it flushed into a part and
        could not report any more. Counted as reported, they are not measured (and written) again."""
        from farm.model.measurement import Strategy
        from farm.model.records import Disposition, TuneMode
        from farm.model.plans import spec_of

        out = []
        for path, rows, _mixed in self._session_parts(signature, op, {session_id}):
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

    def _session_parts(self, signature: str, op: str, sessions: set[str]
                       ) -> list[tuple[str, list[dict[str, Any]], bool]]:
        """This run's parts of (signature, op) holding rows of ``sessions``: (path, those rows, whether the part
        holds rows of other sessions too)."""
        import pyarrow.parquet as pq

        if not self.job.results.exists():
            return []
        data = ResultsDataset(self.job.results, signatures=[signature])
        cols = ["session_id", "problem_key", "candidate_key", "candidate_index", "engine_name", "disposition", "mode",
                "strategy", "median_ms", "mad_ms", "min_ms", "avg_ms", "error"]
        out = []
        for path in data.files:
            folder, _, name = path.replace("\\", "/").rpartition("/")
            if not folder.endswith(f"/op={op}") or not name.startswith(f"part-{self.run_id}-"):
                continue
            rows = pq.read_table(path, columns=cols, filesystem=data.location.fs).to_pylist()
            hits = [r for r in rows if r["session_id"] in sessions]
            if hits:
                out.append((path, hits, len(hits) < len(rows)))
        return out

    def set_aside(self) -> list[dict[str, Any]]:
        """Parts of fenced sessions (``fence``) that were not counted: set aside (renamed, so no reader lists them);
        a part holding other sessions' rows too is written again without the fenced session's (those kept, the
        part as it was set aside)."""
        out = self._set_aside_earlier_late_parts()
        for sig, op, session in self._fenced:
            for path, rows, mixed in self._session_parts(sig, op, {session}):
                if path in self._counted_parts.get(session, set()):
                    continue
                kept = self._without_session(path, session) if mixed else ""
                moved = self.job.location.set_aside(path, "lost-worker")
                log.warning("farm: a part a lost node's worker wrote after its task ran again elsewhere (%d rows of "
                            "session %s) set aside: %s%s", len(rows), session, moved,
                            f"; its other sessions' rows kept in {kept}" if kept else "")
                out.append({"session_id": session, "rows": len(rows), "path": str(moved),
                            **({"kept_in": kept} if kept else {})})
        return out

    def _set_aside_earlier_late_parts(self) -> list[dict[str, Any]]:
        """Parts an earlier run's lost node wrote after that run had ended (its readers skip them already): set
        aside now, so a plain Parquet query does not read them either."""
        if not self.job.results.exists() or not fenced_sessions(self.job.results):  # (the record alone, read cheaply)
            return []
        out = []
        for skipped in ResultsDataset(self.job.results).skipped:
            if "after its run ended" in skipped.reason:
                moved = self.job.location.set_aside(skipped.path, "lost-worker")
                log.warning("farm: a part a lost node's worker wrote after an earlier run ended set aside: %s", moved)
                out.append({"session_id": "", "rows": None, "path": str(moved), "after_its_run": True})
        return out

    def _without_session(self, path: str, session: str) -> str:
        """A copy of the part at ``path`` without ``session``'s rows, beside it (written under a temp name, then
        renamed: a reader never lists half of it) -> its path."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        fs = self.job.location.fs
        table = pq.read_table(path, filesystem=fs)
        table = table.filter(pc.not_equal(table["session_id"], session))
        head, _, name = path.rpartition("/")
        target = f"{head}/{name[:-len('.parquet')]}-kept.parquet"
        temp = f"{head}/_{name}.kept-tmp"
        pq.write_table(table, temp, filesystem=fs)
        fs.move(temp, target)
        return target

    def record(self) -> list[dict[str, Any]]:
        """The fenced sessions with the parts counted of each: what a reader skips of them later (a part landing
        after the run's end, farm.store.dataset)."""
        return [{"signature": sig, "op": op, "session_id": session,
                 "counted": sorted(p.rpartition("/")[2] for p in self._counted_parts.get(session, set()))}
                for sig, op, session in self._fenced]


def written_unreported(sink: Any, task: Any, op: str, session_id: str,
                       reported: Sequence[AutotuneResult]) -> list[AutotuneResult]:
    """The rows of ``task``'s session on the storage (``sink.results_of_session``) that its worker never reported.
    A stage's rows go in one part at its end: all of them are there, or none is counted."""
    seen = {x.spec for x in reported}
    found = [x for x in sink.results_of_session(task.signature, op, session_id)
             if x.spec in task.specs and x.spec not in seen]
    if task.round == CONFIRM and len(found) + len(seen) < task.size:
        return []
    return found
