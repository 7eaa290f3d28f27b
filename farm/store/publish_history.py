"""A published root's history: the results behind its decisions (farm publish --history), which farm tune
--history ROOT learns from.

``ROOT/history/`` is a results folder (``device_signature=<sig>/op=<op>/part-<run>-<n>.parquet``): a run's part
files are copied there under their own names, which carry the run id, so runs never collide and publishing the
same run again copies nothing. Each file is written whole (a temp name renamed into place on POSIX
filesystems, one PUT on object stores).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from farm.errors import InputError
from farm.store.location import Location

log = logging.getLogger("farm.store.publish")

HISTORY_FOLDER = "history"


@dataclass(frozen=True)
class HistoryCopy:
    """What ``farm publish --history`` added: files copied, and files the root held already."""

    copied: int
    present: int
    folder: str


def publish_history(overrides_dir: str | Path, root: str) -> HistoryCopy:
    """Copy the results of the run whose ``overrides_dir`` this is into ``root``'s history folder."""
    results = Path(overrides_dir).parent / "results"
    if not results.is_dir():
        raise InputError("--history: no results folder beside the overrides folder (farm tune --out's layout)",
                         source=str(results))
    src = Location.of(results)
    files = [f for f in src.files(".parquet") if "/device_signature=" in f"/{src.relative(f)}"]
    dest = Location.of(root).join(HISTORY_FOLDER)
    copied = present = 0
    for f in files:
        rel = src.relative(f)
        target = dest.join(*rel.split("/"))
        size = src.fs.get_file_info(f).size
        info = dest.fs.get_file_info(target.path)
        if info.type == pafs.FileType.File and info.size == size:
            present += 1
            continue
        dest.fs.create_dir(target.parent().path, recursive=True)
        if dest.local:
            tmp = target.parent().join(f".{target.name}.tmp")
            pafs.copy_files(f, tmp.path, source_filesystem=src.fs, destination_filesystem=dest.fs)
            Path(tmp.path).replace(target.path)
        else:
            pafs.copy_files(f, target.path, source_filesystem=src.fs, destination_filesystem=dest.fs)
        copied += 1
    log.info("publish: %d results file(s) copied into %s, %d there already", copied, dest.uri, present)
    return HistoryCopy(copied, present, dest.uri)
