"""Where a device worker's time goes: discovery, setup, compiles waited for, measurement, the confirmation
stage, lost work and idle time.

The phases are of the measuring thread's timeline (what keeps the device from measuring), so they add up to
the worker's wall time: a compile on a pool thread while the device measures another candidate costs no
device time; a compile the measuring thread waits for does. A ``PhaseClock`` collects them in one process
(thread-safe); ``PhaseSplit`` is the value the driver adds up per worker and writes to job.json.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

# in the order a table shows them
DISCOVER = "discover"  # discovery and plan listing (which candidates exist)
SETUP = "setup"  # a task's own setup: inputs, references, the tuner; what no other phase names
COMPILE = "compile"  # compiles and plan builds the measuring thread waited for
MEASURE = "measure"  # warm-up and timed runs of the main round
CONFIRM = "confirm"  # the confirmation stage's rounds (and finalist re-measures)
LOST = "lost"  # tasks whose worker died: their time bought nothing
IDLE = "idle"  # no task: waiting for work, for discovery elsewhere, for a restart
PHASES = (DISCOVER, SETUP, COMPILE, MEASURE, CONFIRM, LOST, IDLE)


@dataclass(frozen=True)
class PhaseSplit:
    """Seconds per phase (``PHASES``); missing phases are 0."""

    seconds: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def of(mapping: Mapping[str, float]) -> "PhaseSplit":
        return PhaseSplit(tuple((p, float(mapping[p])) for p in PHASES if mapping.get(p)))

    def get(self, phase: str) -> float:
        return dict(self.seconds).get(phase, 0.0)

    @property
    def total(self) -> float:
        return sum(s for _, s in self.seconds)

    def __add__(self, other: "PhaseSplit") -> "PhaseSplit":
        a, b = dict(self.seconds), dict(other.seconds)
        return PhaseSplit.of({p: a.get(p, 0.0) + b.get(p, 0.0) for p in PHASES})

    def with_idle(self, window_s: float) -> "PhaseSplit":
        """The split over a window of ``window_s`` seconds: idle is what the other phases leave of it."""
        d = dict(self.seconds)
        d[IDLE] = max(0.0, window_s - (self.total - d.get(IDLE, 0.0)))
        return PhaseSplit.of(d)

    def to_json(self) -> dict[str, float]:
        return {p: round(self.get(p), 3) for p in PHASES}

    @staticmethod
    def from_json(data: Any) -> "PhaseSplit":
        """Read job.json's form; anything that is not a number is left out (a hand-edited file stays readable)."""
        if not isinstance(data, Mapping):
            return PhaseSplit()
        return PhaseSplit.of({p: float(v) for p, v in data.items() if p in PHASES and isinstance(v, (int, float))
                              and not isinstance(v, bool) and v >= 0})


class PhaseClock:
    """Accumulates seconds per phase in one process; ``take()`` hands them over and starts again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        if seconds > 0:
            with self._lock:
                self._seconds[phase] = self._seconds.get(phase, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def seconds(self, phase: str) -> float:
        with self._lock:
            return self._seconds.get(phase, 0.0)

    def take(self) -> PhaseSplit:
        with self._lock:
            out, self._seconds = PhaseSplit.of(self._seconds), {}
        return out


@contextlib.contextmanager
def timed(clock: PhaseClock | None, name: str) -> Iterator[None]:
    """``clock.phase(name)``, or nothing when there is no clock."""
    if clock is None:
        yield
        return
    with clock.phase(name):
        yield
