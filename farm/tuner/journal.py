"""What an in-process tuning run is doing now, kept where a native crash cannot erase it.

A candidate that aborts the process (``os.abort``, a segfault in a library) takes ``farm tune --in-process`` with
it: no exception, no row. :class:`InFlightJournal` keeps the candidates in flight (compiled, measured, or sampled
in a confirmation stage) in a small memory-mapped file of the output folder; the kernel keeps the page when the
process dies. The next run of the same command reads it, gives the candidate that was running alone a
``crashed`` row (of the stage it was in), and goes on after it, as the Ray farm does after a worker's death.
Writing it costs a memory copy, no system call.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.model.plans import PlanSpec

SIZE = 4096  # one page: a few candidates in flight at once (compile threads and the one measured)


@dataclass(frozen=True)
class InFlightRecord:
    """What was running when the process ended: a problem, the round (and calling mode) and the candidates."""

    problem_key: str
    stage: str  # "" (main round) or the calling mode of the confirmation stage
    candidates: tuple[str, ...]  # candidate keys

    def as_json(self) -> dict[str, Any]:
        return {"problem": self.problem_key, "stage": self.stage, "candidates": list(self.candidates)}

    @staticmethod
    def of(data: Any) -> "InFlightRecord | None":
        if not isinstance(data, dict) or not isinstance(data.get("candidates"), list):
            return None
        return InFlightRecord(str(data.get("problem", "")), str(data.get("stage") or ""),
                              tuple(str(c) for c in data["candidates"]))


class InFlightJournal:
    """The output folder's journal (``.in-flight``) of the candidates in flight, and of the ones in flight when an
    earlier run ended without finishing (the suspect); one writer: this process."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < SIZE:
                os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._blank = b"\0" * SIZE
        self.suspect: InFlightRecord | None = None

    def read(self) -> tuple[InFlightRecord | None, InFlightRecord | None]:
        """(what the last process left in flight, the suspect it carried); Nones for a blank or foreign page."""
        raw = bytes(self._map[:]).split(b"\0", 1)[0].strip()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            return None, None
        if not isinstance(data, dict):
            return None, None
        now = InFlightRecord.of(data.get("now"))
        return (now if now is not None and now.candidates else None), InFlightRecord.of(data.get("suspect"))

    def write(self, problem_key: str, stage: str, specs: Any) -> None:
        """The candidates in flight now (none: nothing running)."""
        self._put(InFlightRecord(problem_key, stage, tuple(s.key for s in specs)))

    def _put(self, now: InFlightRecord | None) -> None:
        doc: dict[str, Any] = {}
        if now is not None and now.candidates:
            doc["now"] = now.as_json()
        if self.suspect is not None:
            doc["suspect"] = self.suspect.as_json()
        text = json.dumps(doc).encode() if doc else b""
        if len(text) >= SIZE and now is not None:  # more in flight than a page holds: none could be named anyway
            doc["now"] = InFlightRecord(now.problem_key, now.stage, now.candidates[:2]).as_json()
            text = json.dumps(doc).encode()
        self._map[:len(text)] = text
        self._map[len(text):] = self._blank[len(text):]

    def settle(self, suspect: InFlightRecord | None) -> None:
        """Nothing in flight; ``suspect`` is kept for the next run to compare with (None: forgotten)."""
        self.suspect = suspect
        self._put(None)

    def close(self) -> None:
        self._map.close()


class InFlight(dict):
    """Autotuner.in_flight: plan spec -> time.monotonic() its compile or measurement began (what a hang watch
    reads), told to a journal as it changes, once one is attached."""

    def __init__(self, problem_key: str) -> None:
        super().__init__()
        self.problem_key = problem_key
        self.stage = ""  # the calling mode of the confirmation stage the tuner runs ("": the main round)
        self.journal: InFlightJournal | None = None

    def __setitem__(self, spec: PlanSpec, since: float) -> None:
        super().__setitem__(spec, since)
        if self.journal is not None:
            self.journal.write(self.problem_key, self.stage, list(self))

    def pop(self, spec: PlanSpec, *default: Any) -> Any:  # type: ignore[override]
        out = super().pop(spec, *default)
        if self.journal is not None:
            self.journal.write(self.problem_key, self.stage, list(self))
        return out
