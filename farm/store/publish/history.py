"""A published root's history: the results behind its decisions (farm publish --history), which farm tune
--history ROOT learns from.

``ROOT/history/`` is a results folder (``device_signature=<sig>/op=<op>/part-<run>-<n>.parquet``): a run's part
files are copied there under their own names, which carry the run id, so runs never collide and publishing the
same run again copies nothing. Everything is checked before anything is written (``plan_history``: the run's
results folder is there, no folder of the root's history is a link out of the root); each file is then written
whole (a temp name of this writer's own renamed into place on POSIX filesystems, one PUT on object stores), so
two publishers of one run never step on each other's temp files.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from farm.errors import InputError
from farm.store.location import Location

log = logging.getLogger("farm.store.publish.root")

HISTORY_FOLDER = "history"


@dataclass(frozen=True)
class HistoryCopy:
    """What ``farm publish --history`` added: files copied, and files the root held already."""

    copied: int
    present: int
    folder: str


@dataclass(frozen=True)
class HistoryPlan:
    """What ``farm publish --history`` will copy, checked: each results file and its place under the root."""

    source: Location
    dest: Location
    files: tuple[tuple[str, Location], ...]  # (a results file, its target)


def plan_history(overrides_dir: str | Path, root: str) -> HistoryPlan:
    """The copy of the run's results (the run whose ``overrides_dir`` this is) into ``root``'s history folder,
    refused before anything is written where the results folder is missing or the history leads out of the
    root."""
    results = Path(overrides_dir).parent / "results"
    if not results.is_dir():
        raise InputError("--history: no results folder beside the overrides folder (farm tune --out's layout)",
                         source=str(results))
    src = Location.of(results)
    top = Location.of(root)
    dest = top.join(HISTORY_FOLDER)
    files = tuple((f, dest.join(*src.relative(f).split("/"))) for f in src.files(".parquet")
                  if "/device_signature=" in f"/{src.relative(f)}")
    if dest.local:
        for folder in {target.parent().path for _, target in files} | {dest.path}:
            refuse_links_out(Path(top.path), Path(folder))
    return HistoryPlan(src, dest, files)


def copy_history(plan: HistoryPlan) -> HistoryCopy:
    """Copy what ``plan`` lists that the root does not hold already."""
    src, dest = plan.source, plan.dest
    copied = present = 0
    for f, target in plan.files:
        size = src.fs.get_file_info(f).size
        info = dest.fs.get_file_info(target.path)
        if info.type == pafs.FileType.File and info.size == size:
            present += 1
            continue
        dest.fs.create_dir(target.parent().path, recursive=True)
        if dest.local:
            tmp = target.parent().join(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
            try:
                pafs.copy_files(f, tmp.path, source_filesystem=src.fs, destination_filesystem=dest.fs)
                Path(tmp.path).replace(target.path)
            finally:
                Path(tmp.path).unlink(missing_ok=True)
        else:
            pafs.copy_files(f, target.path, source_filesystem=src.fs, destination_filesystem=dest.fs)
        copied += 1
    log.info("publish: %d results file(s) copied into %s, %d there already", copied, dest.uri, present)
    return HistoryCopy(copied, present, dest.uri)


def publish_history(overrides_dir: str | Path, root: str) -> HistoryCopy:
    """Copy the results of the run whose ``overrides_dir`` this is into ``root``'s history folder."""
    return copy_history(plan_history(overrides_dir, root))


def refuse_links_out(root: Path, path: Path) -> None:
    """Refuse ``path`` (a folder or file under ``root``, there or not yet) when it, or a folder on the way to it,
    is a link leading out of ``root``: a path of a published root never leaves it."""
    top = os.path.realpath(root)
    here = Path(path)
    while True:
        if here.is_symlink() or here.exists():
            real = os.path.realpath(here)
            if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
                raise InputError(f"a link out of the published root (to {real}): refused", source=str(here))
        if here == root or here.parent == here or len(here.parts) <= len(root.parts):
            return
        here = here.parent


def history_files_within(root: str | Path) -> None:
    """Refuse a published root whose history folder, or any folder or file in it, is a link out of the root."""
    top = Path(root)
    history = top / HISTORY_FOLDER
    if not (history.is_symlink() or history.exists()):
        return
    refuse_links_out(top, history)
    for dirpath, dirnames, filenames in os.walk(history, followlinks=False):
        for name in (*dirnames, *filenames):
            refuse_links_out(top, Path(dirpath) / name)
