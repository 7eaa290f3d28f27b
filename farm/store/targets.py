"""Which override file a production process on a device reads, from what a user points a command at.

    RUN      a farm tune --out folder: RUN/overrides/<signature>.json
    ROOT     a published root (farm publish): ROOT/<arch>/<signature>.json, or one of its arch
    FILE     one override file
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.errors import InputError
from farm.store.publish.published import INDEX
from farm.store.overrides.files import write_overrides
from farm.store.overrides.entries import OverrideEntry, OverrideFile


@dataclass(frozen=True)
class Target:
    """What farm verify was pointed at: a run folder, a published root, or one file; and the file for this device."""

    kind: str  # "run" | "root" | "file"
    path: str  # the override file replayed
    where: str  # the run folder, the root, or the file itself
    note: str = ""  # the published file is another signature's (a same-arch fallback, as replay would use)


def resolve(given: str, device: Any) -> Target:
    """The override file a production process on ``device`` would replay from ``given``."""
    from farm.store.publish.published import find_published

    sig = device.signature
    if "://" not in given and os.path.isfile(given):
        return Target("file", given, given)
    if "://" not in given and not os.path.isdir(given):
        raise InputError("no such file or folder", source=given)
    if "://" not in given and os.path.isdir(os.path.join(given, "results")) \
            and os.path.isdir(os.path.join(given, "overrides")):
        found = find_published(os.path.join(given, "overrides"), device.properties)  # this CPU, other threads too
        if found is None:
            have = sorted(p.name for p in Path(given, "overrides").glob("*.json") if not p.name.startswith("."))
            raise InputError(f"holds no override file for this device ({sig}); it holds: {', '.join(have) or 'none'}",
                             source=given)
        if found[1]:  # another thread count's file: replayed as production here would, its run left as it is
            return Target("file", found[0], found[0], found[1])
        return Target("run", found[0], given)
    found = find_published(given, device.properties)
    if found is None:
        raise InputError(f"holds no override file for this device ({sig}) nor one of its arch", source=given)
    path, note = found
    kind = "root" if "://" in given or os.path.isfile(os.path.join(given, INDEX)) else "file"
    return Target(kind, path, given if kind == "root" else path, note)


def rewrite_entries(target: Target, f: OverrideFile, entries: list[OverrideEntry], signature: str) -> list[str]:
    """Write changed entries of ``f`` back where they were read: a file rewritten in place (temp file, rename), a
    published root republished with them (``farm publish --force``: a default may be recorded slower than what it
    replaces, which is the point of a check's fix). -> the paths written."""
    import tempfile

    from farm.store.publish.root import publish

    if target.kind == "file":
        write_overrides(target.path, entries, device=f.device, mode="append")
        return [target.path]
    with tempfile.TemporaryDirectory(prefix="farm-rewrite-") as tmp:
        # the changed entries only: publishing merges them into the published file by match key
        name = os.path.join(tmp, f"{f.device_signature or signature}.json")
        write_overrides(name, entries, device=f.device, mode="new", extra=f.extra)
        reports = publish(tmp, target.where, force=True)
    return [r.path for r in reports if r.written]
