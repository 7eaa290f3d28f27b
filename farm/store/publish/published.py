"""A published root: its layout (ROOT/<arch>/<signature>.json), its index, and finding the file for a device."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import os
import posixpath
import re
import uuid
from pathlib import Path
from typing import Any

from farm.devices.properties import DeviceProperties
from farm.errors import FarmError, InputError
from farm.fsutil import PathLock

log = logging.getLogger("farm.store.publish.root")


INDEX = "index.json"


INDEX_VERSION = 1


def arch_dir(arch: str) -> str:
    """A folder name for an arch: ``sm_90``, ``gfx942`` (target features dropped), ``x86_64-skylakex``."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", arch.split(":")[0]) or "unknown"
    return "_" + name if name.startswith(".") else name  # never "." or "..": a folder inside the root


def now_stamp() -> str:
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
            self.fs, self.path, self.local = pafs.LocalFileSystem(), str(Path(root).resolve()), True

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def ensure(self) -> None:
        """Make the root folder (a plain path or a file:// URI) before the first write; object stores need none."""
        if self.local:
            os.makedirs(self.path, exist_ok=True)

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
                data = fh.read()
        except (FileNotFoundError, OSError, pa.ArrowException) as exc:
            if isinstance(exc, FileNotFoundError) or "not found" in str(exc).lower() or "does not exist" in str(exc).lower() \
                    or "No such file" in str(exc):
                return None
            raise
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            hint = " (it looks like UTF-16: save it as UTF-8)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
            raise InputError(f"not UTF-8 text: byte {exc.start} is 0x{data[exc.start]:02x}{hint}",
                             source=self.join(rel) if self.local else f"{self.uri.rstrip('/')}/{rel}") from None

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
            return PathLock(self.join(".publish.lock"), timeout=300)
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


def read_index(store: Store) -> dict[str, Any]:
    text = store.read(INDEX)
    if text is None:
        return {"version": INDEX_VERSION, "files": {}}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            raise ValueError("no files mapping")
        for sig, record in data["files"].items():
            if not isinstance(record, dict):  # rewriting it would drop what the index said of that file
                raise ValueError(f"files[{sig!r}] is {type(record).__name__}, not a mapping")
        return data
    except ValueError as exc:
        raise InputError(f"the publishing index is malformed ({exc}); fix or remove it", source=f"{store.uri}/{INDEX}") from None


def find_published(root: str, props: DeviceProperties) -> tuple[str, str] | None:
    """(path, note) of the published file for this device: its signature (in the published layout, or directly
    in the folder, as ``farm tune``'s ``RUN/overrides`` holds it), else one of the same arch.

    The note is empty for an exact match and names what differs otherwise.
    """
    store = Store(root) if "://" in root or os.path.isdir(root) else None
    if store is None:
        return None
    try:
        index = read_index(store)["files"]
    except InputError:
        index = {}
    exact = index.get(props.signature)
    rel = f"{arch_dir(props.arch)}/{props.signature}.json"
    if isinstance(exact, dict) and exact.get("path") != rel:
        log.warning("publish: %s/%s: entry %s names path %r, not %r; using the layout's path", root, INDEX,
                    props.signature, exact.get("path"), rel)
    if store.read(rel) is not None:
        return _local(store, rel), ""
    flat = f"{props.signature}.json"  # a folder of override files as farm tune / farm reduce write them
    if store.read(flat) is not None:
        return _local(store, flat), ""
    other_threads = _same_cpu_other_threads(store, root, props, index)
    if other_threads is not None:
        return other_threads
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


def _same_cpu_other_threads(store: Store, root: str, props: DeviceProperties, index: dict[str, Any]
                            ) -> tuple[str, str] | None:
    """(path, note) of a file of this very CPU tuned with another BLAS thread count (``farm tune --cpu-threads``),
    the nearest count first; None on a GPU or where there is none. A CPU's signature holds its thread count (the
    threads change which kernel wins), but a file of this machine is worth more than none: it is used, and the
    note says how to replay it as measured."""
    if props.vendor != "cpu":
        return None
    flat = set()
    if store.local:
        try:
            flat = {name for name in os.listdir(root) if name.endswith(".json")}
        except OSError:
            flat = set()
    most = max(os.cpu_count() or 1, props.compute_units, 256)
    for threads in sorted(range(1, most + 1), key=lambda k: (abs(k - props.compute_units), k)):
        if threads == props.compute_units:
            continue
        sig = dataclasses.replace(props, compute_units=threads).signature
        rel = f"{arch_dir(props.arch)}/{sig}.json" if sig in index else f"{sig}.json" if f"{sig}.json" in flat \
            else None
        if rel is None or store.read(rel) is None:
            continue
        note = (f"no file for {props.signature} ({props.compute_units} BLAS thread(s) in this process); using {sig}, "
                f"tuned on this CPU with {threads} BLAS thread(s): run with OMP_NUM_THREADS={threads} to replay its "
                "winners as they were measured")
        log.warning("publish: %s", note)
        return _local(store, rel), note
    return None


def _indexed_path_ok(store: Store, entry: dict[str, Any]) -> bool:
    """An index entry may be followed only where its path is the layout's for its own arch and signature."""
    sig, arch, path = entry.get("signature"), entry.get("arch"), entry.get("path")
    if not isinstance(sig, str) or not isinstance(arch, str) or path != f"{arch_dir(arch)}/{sig}.json":
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
