"""A load generator the benchmarks start themselves: processes that keep cores busy (a busy machine).

    with busy_cores(1):
        ...   # one core spins in a child process meanwhile
"""

from __future__ import annotations

import contextlib
import multiprocessing
from typing import Iterator


def _spin(stop: "multiprocessing.synchronize.Event") -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


@contextlib.contextmanager
def busy_cores(n: int) -> Iterator[None]:
    """``n`` child processes, each keeping a core busy until the block ends (0: nothing)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(max(n, 0))]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
