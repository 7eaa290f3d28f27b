"""Safe file writes: temp file + rename, and moving corrupt files aside."""

from __future__ import annotations

import glob
import logging
import os
import stat
import time
from pathlib import Path

log = logging.getLogger("farm.fsutil")

MAX_TEXT_BYTES = 256 * 2**20  # no override, results or workload file comes near this


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """A hidden sibling name, unique per process, that readers skip."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


STALE_TEMP_S = 3600.0  # a temp file this old whose process is gone here is a killed write's leftover


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete ``path``'s temp siblings (``temp_path``) left by a write that was killed: older than STALE_TEMP_S and
    of a process id not running on this host. A write in progress (here, or on another host of a shared folder)
    is never that old. Returns what was deleted."""
    gone = []
    now = time.time()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:-4]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if now - tmp.stat().st_mtime < STALE_TEMP_S or _running(int(pid)):
                continue
            tmp.unlink()
            gone.append(tmp)
        except OSError:  # taken by another cleaner meanwhile, or not ours to delete
            continue
    if gone:
        log.info("fsutil: removed %d temp file(s) a killed write left beside %s", len(gone), path)
    return gone


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it runs
        return True
    return True


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never a part."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:  # a full disk, a quota, an interrupt: the old file stays, and no half-written temp file beside it
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and not exc.filename:  # write() names no file: say which one it was
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    fsync_dir(path.parent)
    remove_stale_temps(path)


def _aside(path: Path, label: str, prefix: str = "") -> Path:
    """``<prefix><name>.<label>-<epoch>`` beside ``path``, with a counter when that name is taken."""
    stamp = int(time.time())
    target = path.with_name(f"{prefix}{path.name}.{label}-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{prefix}{path.name}.{label}-{stamp}-{n}")
        n += 1
    return target


def move_aside(path: str | Path, label: str = "corrupt", prefix: str = "") -> Path:
    """Rename ``path`` to ``<prefix><name>.<label>-<epoch>``, never over an earlier one; returns the new path."""
    path = Path(path)
    target = _aside(path, label, prefix)
    os.replace(path, target)
    return target


def copy_aside(path: str | Path, label: str) -> Path:
    """Copy ``path`` to ``<path>.<label>-<epoch>`` (never over an earlier one) before it is rewritten."""
    import shutil

    path = Path(path)
    target = _aside(path, label)
    shutil.copy2(path, target)
    return target


def read_text_file(path: str | Path, what: str = "file", max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of a regular file, or an InputError naming it (missing, a FIFO or device, too large,
    not UTF-8). A FIFO is never opened: reading one would block."""
    from farm.errors import InputError

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{what} not found", source=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read the {what}: {exc.strerror or exc}", source=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise InputError(f"cannot read the {what}: it is {kind}", source=str(path))
    if st.st_size > max_bytes:
        raise InputError(f"the {what} is too large ({st.st_size} bytes; at most {max_bytes})", source=str(path))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the {what}: {exc.strerror or exc}", source=str(path)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = " (it looks like UTF-16: save it as UTF-8)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise InputError(f"not UTF-8 text: byte {exc.start} is 0x{data[exc.start]:02x}{hint}", source=str(path)) from None


class LockTimeout(TimeoutError):
    """Another process held the lock for longer than the timeout."""


class PathLock:
    """An exclusive lock on ``path`` (a hidden lock file beside what it guards), removed when released.

    ``filelock`` leaves its lock files behind on Linux, and removing one after release is a race (a waiter
    may hold the old file while a newcomer locks a new one). This lock removes it while still holding it,
    and a process that gets the lock checks the file it locked is still the one at the path, else retries:
    a folder keeps no ``.lock`` once its writers are done. ``timeout=0`` tries once.
    """

    def __init__(self, path: str | Path, timeout: float = 120.0, poll_s: float = 0.05) -> None:
        self.path = str(path)
        self.timeout = timeout
        self.poll_s = poll_s
        self._fd: int | None = None

    def acquire(self) -> "PathLock":
        import fcntl

        deadline = time.monotonic() + self.timeout
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{self.path} is held by another process") from None
                time.sleep(self.poll_s)
                continue
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return self
            os.close(fd)  # the holder before us removed that file: lock the one at the path now

    def release(self) -> None:
        import fcntl

        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "PathLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
