"""Timers: how one call of a function is measured, in milliseconds.

Statistics and stop rules are in farm.model.measurement. The host timer is
right only for synchronous work (CPU engines); GPU work is timed by an event
timer that records device events around the call (farm.devices.runtimes).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, ContextManager, Protocol, runtime_checkable

# Timed loops and GIL-heavy work in other threads take turns, once per process (the GIL is per
# process). A thread holding the GIL between a timer's start and end events delays the launches in
# between, and the device's idle time lands in the sample; Python hands the GIL over only every
# 5 ms (sys.getswitchinterval()), far longer than the event timer's lead. Measured on the H200:
# a 0.019 ms GEMM timed at 0.39-0.82 ms (median) while compile threads loaded Triton kernels.
_TURNS = threading.Lock()


def timed_section() -> ContextManager[Any]:
    """Held by the tuner while it times one candidate."""
    return _TURNS


def gil_heavy_section() -> ContextManager[Any]:
    """Held by engines around in-process work that keeps the GIL for long (a JIT compile or load)."""
    return _TURNS


@runtime_checkable
class Timer(Protocol):
    """Measures one call of ``fn`` in milliseconds."""

    def measure(self, fn: Callable[[], None]) -> float: ...


class HostTimer:
    """perf_counter around a synchronous call."""

    def measure(self, fn: Callable[[], None]) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e6


class EventTimer:
    """Device events recorded on ``stream`` around the call; the time is read after the end event completes.

    The timed function must enqueue its work on the same stream. Events time what
    the device does between them, idle gaps included: if the host is still
    launching the work when the start event runs, its launch latency is counted.
    ``lead`` (when given) enqueues a short device-side wait before the start
    event, so the work is queued before the clock starts.
    """

    def __init__(self, runtime: Any, stream: Any, lead: Callable[[], None] | None = None) -> None:
        self.runtime = runtime
        self.stream = stream
        self.lead = lead
        self._start = runtime.create_event()
        self._end = runtime.create_event()

    def measure(self, fn: Callable[[], None]) -> float:
        rt = self.runtime
        if self.lead is not None:
            self.lead()
        rt.record_event(self._start, self.stream)
        fn()
        rt.record_event(self._end, self.stream)
        rt.synchronize_event(self._end)
        return rt.elapsed_ms(self._start, self._end)
