"""Hang detection for in-process tuning: a candidate compiling or measured for longer than the timeout.

The Ray farm restarts a worker that stops reporting; an in-process run has no worker to restart,
so :class:`HangWatch` names the candidate (the oldest in :attr:`Autotuner.in_flight`) and calls
``on_hang`` from its own thread. The caller records the candidate as timed out and decides how to
go on (``farm tune --in-process`` restarts itself, and the resume skips what has a row).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from farm.model.plans import PlanSpec
from farm.tuner.journal import InFlight, InFlightJournal

log = logging.getLogger("farm.tuner.watchdog")


class HangWatch:
    """Calls ``on_hang(tuner, spec, seconds)`` once when a candidate of the watched tuner is stuck (no thread and
    no call with ``timeout_s`` None). With ``journal`` each watched tuner's candidates in flight are written to
    it as they change (farm.tuner.journal: a native crash of the process is attributed by the next run)."""

    def __init__(self, timeout_s: float | None, on_hang: Callable[[Any, PlanSpec, float], None] | None = None,
                 journal: InFlightJournal | None = None) -> None:
        self.timeout_s = timeout_s
        self._on_hang = on_hang
        self._journal = journal
        self._tuner: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="farm-hang-watch", daemon=True) \
            if timeout_s is not None and on_hang is not None else None
        if self._thread is not None:
            self._thread.start()

    def watch(self, tuner: Any) -> None:
        """From now on, look at this tuner (the problem being tuned)."""
        if self._journal is not None and isinstance(getattr(tuner, "in_flight", None), InFlight):
            tuner.in_flight.journal = self._journal
        self._tuner = tuner

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        assert self.timeout_s is not None and self._on_hang is not None
        poll = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(poll):
            tuner = self._tuner
            items = list(getattr(tuner, "in_flight", {}).items()) if tuner is not None else []
            if not items:
                continue
            spec, since = min(items, key=lambda kv: kv[1])
            stuck = time.monotonic() - since
            if stuck > self.timeout_s:
                log.error("autotune: %s has run for %.0f s, over the %.0f s candidate timeout",
                          spec.describe(tuner.registry), stuck, self.timeout_s)
                self._on_hang(tuner, spec, stuck)
                return
