"""Safe file writes: temp file + rename, and moving corrupt files aside."""

from __future__ import annotations

import os
import time
from pathlib import Path


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


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never a part."""
    path = Path(path)
    tmp = temp_path(path)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def move_aside(path: str | Path, label: str = "corrupt") -> Path:
    """Rename ``path`` to ``<path>.<label>-<epoch>``, never over an earlier one; returns the new path."""
    path = Path(path)
    stamp = int(time.time())
    target = path.with_name(f"{path.name}.{label}-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.{label}-{stamp}-{n}")
        n += 1
    os.replace(path, target)
    return target
