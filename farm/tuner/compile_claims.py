"""Host-wide compile claims: processes tuning on one host compile each shared artifact once.

JIT engines (Triton) keep compiled kernels in a disk cache every process on the
host reads, and a kernel is specialised by dtype and alignment, not by shape:
two device workers tuning different problems of one dtype want the same kernels.
Before compiling, a worker claims the artifact's key (an advisory file lock,
released by the OS if the worker dies). A candidate whose artifact another
process holds goes to the back of the queue; by the time it comes up again the
other process has written the kernel to the cache and compiling it is a load.
Engines opt in with ``compile_key(problem, knobs, device)``; candidates without
a key are compiled in order with no claim.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable, Generic, Sequence, TypeVar

from filelock import FileLock, Timeout

log = logging.getLogger("farm.tuner.compile_claims")

CLAIMS_DIR_ENV = "FARM_COMPILE_CLAIMS_DIR"
T = TypeVar("T")


def claims_dir() -> Path:
    """Where claim files live: FARM_COMPILE_CLAIMS_DIR, else a folder in the system temp dir."""
    return Path(os.environ.get(CLAIMS_DIR_ENV) or Path(tempfile.gettempdir()) / "tunefarm-compile-claims")


class Claim:
    """A held claim on one artifact key; release it once the artifact is in the shared cache."""

    def __init__(self, lock: FileLock | None) -> None:
        self._lock = lock

    def release(self) -> None:
        if self._lock is not None:
            try:
                self._lock.release()
            except OSError as exc:  # a claim that cannot be released costs sharing, never results
                log.debug("compile claim release failed: %s", exc)
            self._lock = None


class CompileQueue(Generic[T]):
    """Hands items to compile threads, unclaimed artifacts first; thread-safe.

    ``take()`` returns the next item whose key this process could claim, or, when
    every remaining item is claimed elsewhere, the first of them after waiting up
    to ``wait_s`` for its claim (then compiling without one: a stuck peer never
    stalls this worker for good). ``None`` when the queue is empty or closed.
    """

    def __init__(self, items: Sequence[T], key: Callable[[T], str | None], *, directory: Path | None = None,
                 wait_s: float = 300.0) -> None:
        self._pending = [(item, key(item)) for item in items]  # keys once, not on every take()
        self._dir = directory if directory is not None else claims_dir()
        self._wait_s = wait_s
        self._mutex = threading.Lock()
        self._closed = False
        self._deferred: set[int] = set()  # items that found their artifact claimed by another process

    @property
    def deferred(self) -> int:
        """How many items were put back because another process held their claim."""
        return len(self._deferred)

    def close(self) -> None:
        """Stop handing out items (the caller gave up, e.g. an aborting tune)."""
        with self._mutex:
            self._closed = True

    def take(self) -> tuple[T, Claim] | None:
        with self._mutex:
            if self._closed or not self._pending:
                return None
            for i, (item, key) in enumerate(self._pending):
                lock = self._lock(key) if key is not None else None
                if lock is None:
                    return self._pending.pop(i)[0], Claim(None)
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    self._deferred.add(id(item))
                    continue
                except OSError:
                    return self._pending.pop(i)[0], Claim(None)
                return self._pending.pop(i)[0], Claim(lock)
            item, key = self._pending.pop(0)
        lock = self._lock(key) if key is not None else None
        if lock is None:
            return item, Claim(None)
        try:
            lock.acquire(timeout=self._wait_s)
        except (Timeout, OSError):
            log.warning("autotune: compile claim %s still held after %.0f s; compiling without it", key, self._wait_s)
            return item, Claim(None)
        return item, Claim(lock)

    def _lock(self, key: str) -> FileLock | None:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.debug("compile claims off: cannot create %s: %s", self._dir, exc)
            return None
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        # thread_local=False: the claim is taken by the queue and released by the compile thread
        return FileLock(str(self._dir / f"{name}.lock"), thread_local=False)
