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

log = logging.getLogger("farm.tuner.watchdog")


class HangWatch:
    """Calls ``on_hang(tuner, spec, seconds)`` once when a candidate of the watched tuner is stuck."""

    def __init__(self, timeout_s: float, on_hang: Callable[[Any, PlanSpec, float], None]) -> None:
        self.timeout_s = timeout_s
        self._on_hang = on_hang
        self._tuner: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="farm-hang-watch", daemon=True)
        self._thread.start()

    def watch(self, tuner: Any) -> None:
        """From now on, look at this tuner (the problem being tuned)."""
        self._tuner = tuner

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
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
