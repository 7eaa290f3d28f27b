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

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from farm.devices.properties import DeviceProperties
from farm.errors import FarmError, InputError
from farm.fsutil import read_text_file
from farm.store.overrides.files import merge_entries, render
from farm.store.overrides.parsing import parse_overrides
from farm.store.overrides.entries import OverrideEntry, OverrideFile

log = logging.getLogger("farm.store.publish.root")

NOISE_FLOOR = 0.03  # relative; below this a slower re-measurement is noise
from farm.store.publish.published import INDEX, Store, arch_dir, now_stamp, read_index


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
    untrusted: list[str] = field(default_factory=list)  # problems published whose decision is marked untrusted
    left_out: list[str] = field(default_factory=list)  # untrusted ones not published (--trusted-only)
    skipped: str = ""  # why nothing of this file was written though the publish went ahead (--trusted-only)
    dialect: str = "farm"  # the spelling written: ours, or hipDNN's (--dialect hipdnn)
    dialect_notes: list[Any] = field(default_factory=list)  # hipdnn_dialect.Note: entries its key cannot tell apart


def entry_label(e: OverrideEntry) -> str:
    meta = e.metadata or {}
    return str(meta.get("problem_name") or meta.get("problem_key") or e.op)


def untrusted(e: OverrideEntry) -> bool:
    """An entry the reducer marked untrusted (``autotune_metadata.selection.trusted: false``); older files,
    without the mark, are taken as trusted."""
    sel = (e.metadata or {}).get("selection")
    return isinstance(sel, dict) and sel.get("trusted") is False


def entry_desc(e: OverrideEntry) -> str:
    from farm.model.knobs import candidate_label

    return candidate_label(e.engine_name, e.knobs)


def entry_ms(e: OverrideEntry) -> float | None:
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
            added.append(Change(entry_label(e), "", entry_desc(e), None, entry_ms(e)))
        elif (o.engine_name, o.knobs) != (e.engine_name, e.knobs):
            changed.append(Change(entry_label(e), entry_desc(o), entry_desc(e), entry_ms(o), entry_ms(e)))
        else:
            same += 1
    for k, o in old_by.items():
        if k not in new_by:
            removed.append(Change(entry_label(o), entry_desc(o), "", entry_ms(o), None))
    return added, changed, removed, same


def _regressions(old: Iterable[OverrideEntry], new: Iterable[OverrideEntry]) -> list[Change]:
    """Changed winners whose new recorded time is slower than the old beyond noise."""
    old_by = {e.match_key(): e for e in old}
    out = []
    for e in new:
        o = old_by.get(e.match_key())
        # an untrusted figure is no baseline: replacing it is never a regression
        if o is None or (o.engine_name, o.knobs) == (e.engine_name, e.knobs) or untrusted(o):
            continue
        a, b = entry_ms(o), entry_ms(e)
        if a is not None and b is not None and b - a > max(_noise(o, e), NOISE_FLOOR * a):
            out.append(Change(entry_label(e), entry_desc(o), entry_desc(e), a, b))
    return out


def validate_for_publish(f: OverrideFile, name: str) -> DeviceProperties:
    """The device a file is for; InputError when it cannot be published."""
    if f.version != 2 or not f.is_autotune_file:
        raise InputError("only version-2 override files written by autotuning are published", source=name)
    if not f.device or not f.device.get("signature") or not f.device.get("properties"):
        raise InputError("the file names no device (signature and properties)", source=name)
    props = DeviceProperties.parse(f.device["properties"], source=name, field="device.properties")
    if props.signature != f.device["signature"]:
        raise InputError(f"the device signature {f.device['signature']} does not match its properties "
                         f"({props.signature})", source=name)
    if Path(name).suffix == ".json" and Path(name).stem not in (props.signature,) and "://" not in name:
        raise InputError(f"the file name does not match its device signature {props.signature}", source=name)
    check_knobs(f, name)
    return props


def check_knobs(f: OverrideFile, name: str) -> None:
    """Every knob of an entry whose engine this process has is one of its knobs with a valid value (a string for
    an int knob, a value off its range: an InputError naming the file, the entry and the knob)."""
    from farm.model.engine import default_engine_registry, file_knobs

    registry = default_engine_registry()
    checked: set[tuple[str, Any]] = set()  # a file's entries share a few engines and settings: each checked once
    for i, e in enumerate(f.entries):
        try:
            seen = (e.engine_name, e.knobs) in checked
        except TypeError:  # an unhashable value (a list where a number belongs): checked, and refused, below
            seen = False
        if seen or e.engine_name not in registry:
            continue  # engines we do not have (hipDNN's own) are checked by their owners
        try:
            file_knobs(registry.get(e.engine_name), e.knobs, source=name)
        except InputError as exc:
            raise exc.within(prefix=f"engine_overrides[{i}]") from None
        checked.add((e.engine_name, e.knobs))


def publish(overrides_dir: str | Path, root: str, *, force: bool = False, replace: bool = False,
            dry_run: bool = False, trusted_only: bool = False, dialect: str = "farm") -> list[PublishedFile]:
    """Publish every ``<signature>.json`` of ``overrides_dir`` under ``root``: all of them, or none.

    Every file is read, validated and merged before anything is written; one that is invalid (an
    error) or refused (a regression, a foreign file in its place) means nothing is published. A write
    that fails half-way is rolled back (the files written are restored) before the error is raised.
    ``dialect="hipdnn"`` writes the published files in hipDNN's spelling (farm.store.overrides.hipdnn_dialect).
    """
    from farm.store.overrides.hipdnn_dialect import DIALECTS

    if dialect not in DIALECTS:
        raise InputError(f"expected one of {', '.join(DIALECTS)}", field="--dialect", value=dialect)
    src = Path(overrides_dir)
    if not src.is_dir():
        raise InputError("overrides folder not found", source=str(src))
    files = sorted(p for p in src.glob("*.json") if not p.name.startswith("."))
    if not files:
        raise InputError("no override files (*.json) to publish", source=str(src))
    for path in files:  # every file checked before anything is made at the root
        validate_for_publish(parse_overrides(read_text_file(path, "override file"), source=str(path)), str(path))
    store = Store(root)
    if dry_run and not store.exists():
        return [_plan(store, root, path, {"files": {}}, force=force, replace=replace,
                      trusted_only=trusted_only, dialect=dialect).report for path in files]
    store.ensure()
    with store.lock():
        index = read_index(store)
        plans = [_plan(store, root, path, index, force=force, replace=replace, trusted_only=trusted_only,
                       dialect=dialect) for path in files]
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


def _plan(store: Store, root: str, path: Path, index: dict[str, Any], *, force: bool, replace: bool,
          trusted_only: bool = False, dialect: str = "farm") -> _Plan:
    new = parse_overrides(read_text_file(path, "override file"), source=str(path))
    props = validate_for_publish(new, str(path))
    shaky = [e for e in new.entries if untrusted(e)]
    if trusted_only and shaky:
        new = OverrideFile(new.version, [e for e in new.entries if not untrusted(e)], new.device, new.extra, new.source)
    report_untrusted = [] if trusted_only else [entry_label(e) for e in shaky]
    rel = f"{arch_dir(props.arch)}/{props.signature}.json"
    rep = PublishedFile(props.signature, f"{root.rstrip('/')}/{rel}", untrusted=report_untrusted,
                        left_out=[entry_label(e) for e in shaky] if trusted_only else [])
    old_text = store.read(rel)
    old = parse_overrides(old_text, source=f"{root}/{rel}") if old_text is not None else None
    if old is not None and old.device_signature != props.signature:
        rep.refused = f"{root}/{rel} holds device {old.device_signature}, not {props.signature}"
        return _Plan(rel, "", old_text, {}, rep)
    warning = (new.extra.get("generated_by") or {}).get("measurement_warning") \
        if isinstance(new.extra.get("generated_by"), dict) else None
    if warning and not force:
        rep.refused = f"{path}: {warning} (use --force to publish anyway)"
        return _Plan(rel, "", old_text, {}, rep)
    old_entries = old.entries if old else []
    if dialect == "hipdnn":
        new, old_entries, shaky = _in_hipdnns_spelling(new, old_entries, shaky, rep)
    if trusted_only and shaky and not new.entries:
        # nothing trusted: no file (an empty one would hide what this device falls back to now), and with
        # --replace the entries published before stay
        rep.skipped = "no trusted entry to publish: " + ("the published file is left as it is" if old is not None
                                                         else "no file written")
        return _Plan(rel, "", old_text, {}, rep)
    merged = _replaced(old_entries, new.entries, shaky if trusted_only else []) if replace \
        else merge_entries(old_entries, new.entries)[0]
    if dialect == "hipdnn":
        merged.sort(key=lambda e: not e.exact)  # hipDNN takes the first rule that matches: exact ones first
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
        "created": (prev.get("created") if isinstance(prev, dict) else None) or now_stamp(), "updated": now_stamp(),
        "job_ids": jobs, "dialect": dialect,
    }
    return _Plan(rel, body, old_text, record, rep)


def _in_hipdnns_spelling(new: OverrideFile, old: list[OverrideEntry], shaky: list[OverrideEntry],
                         rep: PublishedFile) -> tuple[OverrideFile, list[OverrideEntry], list[OverrideEntry]]:
    """Both sides of a publish in hipDNN's spelling, so a rule and its respelled twin share a match key; what the
    respelling did goes in the report."""
    from farm.store.overrides.hipdnn_dialect import to_hipdnn

    entries, rep.dialect_notes = to_hipdnn(new.entries, [entry_label(e) for e in new.entries])
    rep.dialect = "hipdnn"
    return (OverrideFile(new.version, entries, new.device, new.extra, new.source), to_hipdnn(old)[0],
            to_hipdnn(shaky)[0])


def _replaced(old: Sequence[OverrideEntry], new: Sequence[OverrideEntry], left_out: Sequence[OverrideEntry]
              ) -> list[OverrideEntry]:
    """``--replace``: the new entries, and of the old ones those of the problems whose new decision was left out as
    untrusted (--trusted-only: what was published for them stays until a trusted decision replaces it)."""
    keep = {e.match_key() for e in left_out}
    return list(new) + [e for e in old if e.match_key() in keep]


def _write_all(store: Store, plans: list[_Plan], index: dict[str, Any]) -> None:
    """Write every planned file, then the index; on a failure put back what was there and raise."""
    old_index = store.read(INDEX)
    done: list[_Plan] = []
    try:
        for plan in plans:
            if plan.report.skipped:
                continue
            store.write(plan.rel, plan.body)
            done.append(plan)
            index["files"][plan.report.signature] = plan.record
        index["updated"] = now_stamp()
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
        plan.report.written = not plan.report.skipped


