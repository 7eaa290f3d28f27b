"""Publishing override files per architecture, and finding the one for a device.

    farm publish runs/x/overrides --to ROOT       # ROOT: a folder, or s3://bucket/prefix, gs://...

lays files out as ``ROOT/<arch>/<device_signature>.json`` with ``ROOT/index.json``.
Publishing over an existing file merges by match key (the reducer's append
rules) and reports what changed. A winner replaced by one measured slower
beyond noise is refused unless forced. Writes are temp-then-rename on POSIX
filesystems (a single PUT on object stores), under a lock, index last, so
readers never see an index naming a file that is not there.

Any filesystem pyarrow opens works (local, S3 and S3-compatible servers, GCS,
HDFS). Concurrent publishers are serialised by a lock file on POSIX
filesystems; object stores have no atomic create through pyarrow, so there the
lock is advisory (see docs/publish.md).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import posixpath
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from filelock import FileLock

from farm.devices.properties import DeviceProperties
from farm.errors import FarmError, InputError
from farm.fsutil import read_text_file
from farm.store.overrides import OverrideEntry, OverrideFile, merge_entries, parse_overrides, render

log = logging.getLogger("farm.store.publish")

INDEX = "index.json"
INDEX_VERSION = 1
NOISE_FLOOR = 0.03  # relative; below this a slower re-measurement is noise


def _arch_dir(arch: str) -> str:
    """A folder name for an arch: ``sm_90``, ``gfx942`` (target features dropped), ``x86_64-skylakex``."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", arch.split(":")[0]) or "unknown"
    return "_" + name if name.startswith(".") else name  # never "." or "..": a folder inside the root


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Store:
    """A publishing root on a pyarrow filesystem (local paths too)."""

    def __init__(self, root: str) -> None:
        import pyarrow.fs as pafs

        self.uri = root
        if "://" in root:
            self.fs, self.path = pafs.FileSystem.from_uri(root)
            self.local = isinstance(self.fs, pafs.LocalFileSystem)
        else:
            Path(root).mkdir(parents=True, exist_ok=True)
            self.fs, self.path, self.local = pafs.LocalFileSystem(), str(Path(root).resolve()), True

    def join(self, rel: str) -> str:
        """The full path of ``rel``, which must stay inside the root (paths come from index.json too)."""
        if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel or rel.startswith("/") \
                or re.match(r"^[A-Za-z]+:", rel):
            raise InputError("the path is not a relative path inside the published root", field="path",
                             value=rel, source=self.uri)
        norm = posixpath.normpath(rel)
        if norm == ".." or norm.startswith("../"):
            raise InputError("the path leaves the published root", field="path", value=rel, source=self.uri)
        target = posixpath.join(self.path, norm)
        if self.local:  # a symbolic link inside the root must not lead out of it either
            root = os.path.realpath(self.path)
            real = os.path.realpath(target)
            if real != root and not real.startswith(root + os.sep):
                raise InputError("the path leads out of the published root", field="path", value=rel,
                                 source=self.uri)
        return target

    def read(self, rel: str) -> str | None:
        import pyarrow as pa

        try:
            with self.fs.open_input_stream(self.join(rel)) as fh:
                return fh.read().decode("utf-8")
        except (FileNotFoundError, OSError, pa.ArrowException) as exc:
            if isinstance(exc, FileNotFoundError) or "not found" in str(exc).lower() or "does not exist" in str(exc).lower() \
                    or "No such file" in str(exc):
                return None
            raise

    def write(self, rel: str, text: str) -> None:
        target = self.join(rel)
        self.fs.create_dir(posixpath.dirname(target), recursive=True)
        if self.local:
            from farm.fsutil import atomic_write_text

            atomic_write_text(target, text)
        else:
            with self.fs.open_output_stream(target) as fh:  # one PUT: readers see the old object or the new one
                fh.write(text.encode("utf-8"))

    def restore(self, rel: str, text: str | None) -> None:
        """Put ``rel`` back as it was: ``text``, or absent when it was None."""
        if text is not None:
            self.write(rel, text)
            return
        try:
            self.fs.delete_file(self.join(rel))
        except FileNotFoundError:
            pass

    def lock(self) -> Any:
        if self.local:
            return FileLock(self.join(".publish.lock"), timeout=300)
        return _AdvisoryLock(self)


class _AdvisoryLock:
    """A lock object on an object store: taken if absent, released after; not atomic (documented)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.token = uuid.uuid4().hex

    def __enter__(self) -> "_AdvisoryLock":
        import time

        for _ in range(600):
            current = self.store.read(".publish.lock")
            if current is None:
                self.store.write(".publish.lock", self.token)
                if self.store.read(".publish.lock") == self.token:
                    return self
            time.sleep(0.5)
        raise FarmError(f"{self.store.uri}: another publisher has held .publish.lock for 5 minutes")

    def __exit__(self, *exc: Any) -> None:
        try:
            self.store.fs.delete_file(self.store.join(".publish.lock"))
        except OSError:
            pass


@dataclass
class Change:
    key: str  # problem name or label
    old_engine: str = ""
    new_engine: str = ""
    old_ms: float | None = None
    new_ms: float | None = None


@dataclass
class PublishedFile:
    signature: str
    path: str
    added: list[Change] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    removed: list[Change] = field(default_factory=list)
    unchanged: int = 0
    regressions: list[Change] = field(default_factory=list)
    written: bool = False
    refused: str = ""


def _label(e: OverrideEntry) -> str:
    meta = e.metadata or {}
    return str(meta.get("problem_name") or meta.get("problem_key") or e.op)


def _desc(e: OverrideEntry) -> str:
    from farm.model.knobs import candidate_label

    return candidate_label(e.engine_name, e.knobs)


def _ms(e: OverrideEntry) -> float | None:
    meta = e.metadata or {}
    v = meta.get("median_time_ms", meta.get("min_time_ms"))
    return float(v) if isinstance(v, (int, float)) else None


def _noise(a: OverrideEntry, b: OverrideEntry) -> float:
    noise = [((x.metadata or {}).get("selection") or {}).get("noise_ms") for x in (a, b)]
    return max([n for n in noise if isinstance(n, (int, float))] + [0.0])


def diff_entries(old: Iterable[OverrideEntry], new: Iterable[OverrideEntry]) -> tuple[list[Change], list[Change], list[Change], int]:
    """(added, changed, removed, unchanged) between two sets of entries, by match key."""
    old_by = {e.match_key(): e for e in old}
    new_by = {e.match_key(): e for e in new}
    added, changed, removed, same = [], [], [], 0
    for k, e in new_by.items():
        o = old_by.get(k)
        if o is None:
            added.append(Change(_label(e), "", _desc(e), None, _ms(e)))
        elif (o.engine_name, o.knobs) != (e.engine_name, e.knobs):
            changed.append(Change(_label(e), _desc(o), _desc(e), _ms(o), _ms(e)))
        else:
            same += 1
    for k, o in old_by.items():
        if k not in new_by:
            removed.append(Change(_label(o), _desc(o), "", _ms(o), None))
    return added, changed, removed, same


def _regressions(old: Iterable[OverrideEntry], new: Iterable[OverrideEntry]) -> list[Change]:
    """Changed winners whose new recorded time is slower than the old beyond noise."""
    old_by = {e.match_key(): e for e in old}
    out = []
    for e in new:
        o = old_by.get(e.match_key())
        if o is None or (o.engine_name, o.knobs) == (e.engine_name, e.knobs):
            continue
        a, b = _ms(o), _ms(e)
        if a is not None and b is not None and b - a > max(_noise(o, e), NOISE_FLOOR * a):
            out.append(Change(_label(e), _desc(o), _desc(e), a, b))
    return out


def validate_for_publish(f: OverrideFile, name: str) -> DeviceProperties:
    """The device a file is for; InputError when it cannot be published."""
    if f.version != 2 or not f.is_autotune_file:
        raise InputError("only version-2 override files written by autotuning are published", source=name)
    if not f.device or not f.device.get("signature") or not f.device.get("properties"):
        raise InputError("the file names no device (signature and properties)", source=name)
    props = DeviceProperties.from_dict(f.device["properties"])
    if props.signature != f.device["signature"]:
        raise InputError(f"the device signature {f.device['signature']} does not match its properties "
                         f"({props.signature})", source=name)
    if Path(name).suffix == ".json" and Path(name).stem not in (props.signature,) and "://" not in name:
        raise InputError(f"the file name does not match its device signature {props.signature}", source=name)
    from farm.model.engine import default_engine_registry, file_knobs

    registry = default_engine_registry()
    for i, e in enumerate(f.entries):
        if e.engine_name in registry:  # engines we do not have (hipDNN's own) are published as they are
            try:
                file_knobs(registry.get(e.engine_name), e.knobs, source=name)
            except InputError as exc:
                raise exc.within(prefix=f"engine_overrides[{i}]") from None
    return props


def publish(overrides_dir: str | Path, root: str, *, force: bool = False, replace: bool = False,
            dry_run: bool = False) -> list[PublishedFile]:
    """Publish every ``<signature>.json`` of ``overrides_dir`` under ``root``: all of them, or none.

    Every file is read, validated and merged before anything is written; one that is invalid (an
    error) or refused (a regression, a foreign file in its place) means nothing is published. A write
    that fails half-way is rolled back (the files written are restored) before the error is raised.
    """
    src = Path(overrides_dir)
    if not src.is_dir():
        raise InputError("overrides folder not found", source=str(src))
    files = sorted(p for p in src.glob("*.json") if not p.name.startswith("."))
    if not files:
        raise InputError("no override files (*.json) to publish", source=str(src))
    store = Store(root)
    with store.lock():
        index = _read_index(store)
        plans = [_plan(store, root, path, index, force=force, replace=replace) for path in files]
        reports = [p.report for p in plans]
        refused = [r for r in reports if r.refused]
        if refused:
            for r in reports:
                if not r.refused:
                    r.refused = (f"not published: {', '.join(x.signature for x in refused)} refused, and a publish "
                                 "is all or nothing")
            return reports
        if dry_run:
            return reports
        _write_all(store, plans, index)
    return reports


@dataclass
class _Plan:
    """One file of a publish, ready to write: the new text, the old one (to roll back to) and the index record."""

    rel: str
    body: str
    old_text: str | None
    record: dict[str, Any]
    report: PublishedFile


def _plan(store: Store, root: str, path: Path, index: dict[str, Any], *, force: bool, replace: bool) -> _Plan:
    new = parse_overrides(read_text_file(path, "override file"), source=str(path))
    props = validate_for_publish(new, str(path))
    rel = f"{_arch_dir(props.arch)}/{props.signature}.json"
    rep = PublishedFile(props.signature, f"{root.rstrip('/')}/{rel}")
    old_text = store.read(rel)
    old = parse_overrides(old_text, source=f"{root}/{rel}") if old_text is not None else None
    if old is not None and old.device_signature != props.signature:
        rep.refused = f"{root}/{rel} holds device {old.device_signature}, not {props.signature}"
        return _Plan(rel, "", old_text, {}, rep)
    old_entries = old.entries if old else []
    merged = list(new.entries) if replace else merge_entries(old_entries, new.entries)[0]
    rep.added, rep.changed, rep.removed, rep.unchanged = diff_entries(old_entries, merged)
    rep.regressions = _regressions(old_entries, new.entries)
    if rep.regressions and not force:
        rep.refused = (f"{len(rep.regressions)} winner(s) would be replaced by one measured slower beyond noise "
                       "(use --force to publish anyway)")
        return _Plan(rel, "", old_text, {}, rep)
    jobs = sorted(set(((old.extra if old else {}).get("generated_by") or {}).get("job_ids", []))
                  | set((new.extra.get("generated_by") or {}).get("job_ids", [])))
    extra = {**(old.extra if old else {}), **new.extra}
    extra["generated_by"] = {**(extra.get("generated_by") or {}), "job_ids": jobs}
    body = render(OverrideFile(2, merged, new.device, extra, rel))
    prev = index["files"].get(props.signature, {})
    record = {
        "path": rel, "signature": props.signature, "arch": props.arch, "device_name": props.name,
        "vendor": props.vendor, "driver_version": props.driver_version,
        "runtime_version": props.runtime_version, "libraries": dict(props.libraries),
        "entries": len(merged), "sha256": hashlib.sha256(body.encode()).hexdigest(),
        "created": (prev.get("created") if isinstance(prev, dict) else None) or _now(), "updated": _now(),
        "job_ids": jobs,
    }
    return _Plan(rel, body, old_text, record, rep)


def _write_all(store: Store, plans: list[_Plan], index: dict[str, Any]) -> None:
    """Write every planned file, then the index; on a failure put back what was there and raise."""
    old_index = store.read(INDEX)
    done: list[_Plan] = []
    try:
        for plan in plans:
            store.write(plan.rel, plan.body)
            done.append(plan)
            index["files"][plan.report.signature] = plan.record
        index["updated"] = _now()
        store.write(INDEX, json.dumps(index, indent=2, sort_keys=True) + "\n")  # last: it names written files
    except Exception as exc:
        problems = []
        for rel, text in [(INDEX, old_index)] + [(p.rel, p.old_text) for p in reversed(done)]:
            try:
                store.restore(rel, text)
            except Exception as again:  # noqa: BLE001 - report every file that could not be put back
                problems.append(f"{store.uri}/{rel}: {again}")
        rolled = "rolled back: nothing published" if not problems else "could not roll back " + "; ".join(problems)
        raise FarmError(f"publishing to {store.uri} failed ({type(exc).__name__}: {exc}); {rolled}") from None
    for plan in plans:
        plan.report.written = True


def _read_index(store: Store) -> dict[str, Any]:
    text = store.read(INDEX)
    if text is None:
        return {"version": INDEX_VERSION, "files": {}}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            raise ValueError("no files mapping")
        return data
    except ValueError as exc:
        raise InputError(f"the publishing index is malformed ({exc}); fix or remove it", source=f"{store.uri}/{INDEX}") from None


def find_published(root: str, props: DeviceProperties) -> tuple[str, str] | None:
    """(path, note) of the published file for this device: its signature, else one of the same arch.

    The note is empty for an exact match and names what differs otherwise.
    """
    store = Store(root) if "://" in root or os.path.isdir(root) else None
    if store is None:
        return None
    try:
        index = _read_index(store)["files"]
    except InputError:
        index = {}
    exact = index.get(props.signature)
    rel = f"{_arch_dir(props.arch)}/{props.signature}.json"
    if isinstance(exact, dict) and exact.get("path") != rel:
        log.warning("publish: %s/%s: entry %s names path %r, not %r; using the layout's path", root, INDEX,
                    props.signature, exact.get("path"), rel)
    if store.read(rel) is not None:
        return _local(store, rel), ""
    same_arch = [e for e in index.values() if isinstance(e, dict) and e.get("arch") == props.arch
                 and _indexed_path_ok(store, e)]
    if not same_arch:
        return None
    best = same_arch[0]
    mine = props.signature_fields()
    theirs = DeviceProperties(vendor=best.get("vendor", props.vendor), name=best.get("device_name", ""), arch=best["arch"],
                              compute_units=props.compute_units, total_memory=props.total_memory, l2_bytes=props.l2_bytes,
                              clock_mhz=0, warp_size=props.warp_size, driver_version=best.get("driver_version", ""),
                              runtime_version=best.get("runtime_version", ""),
                              libraries=tuple(sorted((best.get("libraries") or {}).items())))
    differs = [k for k, v in theirs.signature_fields().items() if mine.get(k) != v and k != "v"]
    note = (f"no file for {props.signature}; using {best['signature']} of the same arch {props.arch} "
            f"(differs in: {', '.join(differs) or 'the hash only'})")
    log.warning("publish: %s", note)
    return _local(store, best["path"]), note


def _indexed_path_ok(store: Store, entry: dict[str, Any]) -> bool:
    """An index entry may be followed only where its path is the layout's for its own arch and signature."""
    sig, arch, path = entry.get("signature"), entry.get("arch"), entry.get("path")
    if not isinstance(sig, str) or not isinstance(arch, str) or path != f"{_arch_dir(arch)}/{sig}.json":
        log.warning("publish: %s/%s: entry %r with path %r is not the layout's; ignored", store.uri, INDEX, sig, path)
        return False
    try:
        store.join(path)
    except InputError as exc:
        log.warning("publish: %s", exc)
        return False
    return True


def _local(store: Store, rel: str) -> str:
    if store.local:
        return store.join(rel)
    text = store.read(rel)  # object stores: a local copy to read
    cache = Path(os.environ.get("FARM_PUBLISH_CACHE", Path.home() / ".cache" / "tunefarm")) / hashlib.sha256(
        f"{store.uri}/{rel}".encode()).hexdigest()[:16]
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / Path(rel).name
    from farm.fsutil import atomic_write_text

    atomic_write_text(target, text or "")
    return str(target)
