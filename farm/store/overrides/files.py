"""Override files: reading them (farm.store.overrides.parsing, whose names are here too) and writing them: the
renderer, and append/replace writes under a lock that never lose or corrupt what is there."""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from farm.errors import InputError
from farm.fsutil import MAX_TEXT_BYTES, PathLock, atomic_write_text, copy_aside, move_aside, read_text_file
from farm.store.overrides.hipdnn_dialect import hipdnn_spelled, shared_key, spelled_like_twin
from farm.store.overrides.parsing import (INVALID_RULE_ENV, UnusableRule, load_json, need,
                                         parse_entry, parse_knobs)
from farm.store.overrides.entries import (
    OVERRIDE_VERSION,
    WRITE_MODES,
    OverrideEntry,
    OverrideFile,
)

log = logging.getLogger("farm.store.overrides.entries")

__all__ = ["ISO_SECONDS_FORMAT", "WriteReport", "autotune_metadata", "iso_seconds", "lock_path", "merge_entries",
           "render", "write_overrides"]


def render(doc: OverrideFile, entries: Sequence[dict[str, Any]] | None = None) -> str:
    """JSON text with one entry per line: readable, diff-friendly, and written by json's C encoder.
    ``entries``: the entries' JSON objects when the caller has them already."""
    head: dict[str, Any] = {"version": doc.version}
    if doc.device is not None:
        head["device"] = dict(doc.device)
    head.update({k: v for k, v in doc.extra.items() if k not in ("version", "device", "engine_overrides")})
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"  {json.dumps(k)}: {_dumps(v, sort_keys=True)},")
    if entries is None:
        entries = [e.to_json() for e in doc.entries]
    if not entries:
        lines.append('  "engine_overrides": []')
    else:
        lines.append('  "engine_overrides": [')
        lines.append(",\n".join(f"    {_dumps(e)}" for e in entries))
        lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dumps(value: Any, **kw: Any) -> str:
    """JSON text; a non-finite number (NaN, an infinity: no JSON number) is written as null."""
    try:
        return json.dumps(value, allow_nan=False, **kw)
    except ValueError:
        return json.dumps(_finite_only(value), allow_nan=False, **kw)


def _finite_only(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_only(v) for v in value]
    return value


def lock_path(path: Path) -> Path:
    """The lock file serialising writers of ``path`` (hidden, so globs for *.json skip it)."""
    return path.with_name(f".{path.name}.lock")


def merge_entries(existing: Sequence[OverrideEntry], new: Iterable[OverrideEntry]) -> tuple[list[OverrideEntry], int, int]:
    """Existing entries with same-key ones replaced in place, the others appended. -> (entries, replaced, added)."""
    out = list(existing)
    where = {e.match_key(): i for i, e in enumerate(out)}
    twins = _hipdnn_twins(out)
    replaced = added = 0
    for e in new:
        k = e.match_key()
        if k not in where and twins:  # a rule the file holds in hipDNN's spelling (publish --dialect hipdnn)
            e = spelled_like_twin(e, twins.get(shared_key(e), ()))
            k = e.match_key()
        if k in where:
            out[where[k]] = e.spelled_like(out[where[k]])  # a rule hipDNN wrote stays in its words
            replaced += 1
        else:
            where[k] = len(out)
            out.append(e)
            added += 1
    return out, replaced, added


def _hipdnn_twins(entries: Sequence[OverrideEntry]) -> dict[Any, list[OverrideEntry]]:
    """The rules of a file by their key in both spellings, where it holds any in hipDNN's ({} otherwise)."""
    if not any(hipdnn_spelled(e) for e in entries):
        return {}
    out: dict[Any, list[OverrideEntry]] = {}
    for e in entries:
        out.setdefault(shared_key(e), []).append(e)
    return out


@dataclass(frozen=True)
class WriteReport:
    path: str
    mode: str
    entries: int
    replaced: int
    added: int
    moved_aside: str = ""
    set_aside: int = 0  # unreadable entries left out (unreadable="set_aside"), the file as it was in moved_aside


UNREADABLE_CHOICES = ("refuse", "set_aside")


def write_overrides(path: str | Path, entries: Sequence[OverrideEntry], *, device: Mapping[str, Any] | None,
                    mode: str = "append", extra: Mapping[str, Any] | None = None,
                    lock_timeout: float = 120.0, unreadable: str = "refuse") -> WriteReport:
    """Write ``entries`` to ``path``.

    An existing file appended to that holds entries no reader can read (production's reader, hipDNN's and
    farm.ops', refuses the whole file while one is there, the entries just written included) is refused:
    nothing written, an InputError naming the entry and what to do. ``unreadable="set_aside"`` copies the file
    as it was, byte for byte, to ``<file>.unreadable-<epoch>`` and writes without those entries.

    Modes: ``new`` (the file must not exist), ``append`` (replace entries with the
    same match key, keep the rest; creates the file if missing), ``replace``
    (delete everything already there). Appending to a file of another version than 2, or of another device
    signature, is refused and writes nothing; a v2 file keeps its entries (hand-written ones too) and fields.
    What is written is first read back with the strict reader: an entry it would refuse is an InputError.
    In append mode only a file that is not valid JSON is corrupt: it is moved aside to
    ``<file>.corrupt-<epoch>`` (if that fails, a warning, and it is overwritten). Valid JSON that is not an
    override document is refused: nothing written, the file untouched.
    """
    if mode not in WRITE_MODES:
        raise InputError(f"write mode must be one of {', '.join(WRITE_MODES)}", field="mode", value=mode)
    if unreadable not in UNREADABLE_CHOICES:
        raise InputError(f"expected one of {', '.join(UNREADABLE_CHOICES)}", field="unreadable", value=unreadable)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with PathLock(lock_path(path), timeout=lock_timeout):
        current, raws, old_extra, moved, set_aside = _existing(path, mode, device, unreadable)
        positions = [i for i, e in enumerate(current) if isinstance(e, OverrideEntry)]
        parsed, replaced, added = merge_entries([current[i] for i in positions], entries)
        lost = [current[i] for i, e in zip(positions, parsed) if e is not current[i]]
        if lost and not moved and _unusable_knobs(lost):
            # an entry replaced that no reader could use as written (a string for an int knob): the file as it
            # was is kept beside, so what someone wrote there is not lost without a trace
            moved = str(copy_aside(path, "replaced"))
            log.warning("overrides: %s held an entry with knobs its engine cannot take; replaced by a measured one, "
                        "the file as it was is kept at %s", path, moved)
        merged: list[Any] = list(current)
        for i, e in zip(positions, parsed):
            merged[i] = e
        merged += parsed[len(positions):]
        doc = OverrideFile(OVERRIDE_VERSION, parsed, dict(device) if device is not None else None,
                           {**old_extra, **(extra or {})}, str(path))
        # what was there and is not replaced is written as it was read, field for field
        # (an entry of an older tunefarm, knobs beside its metadata, is rewritten: they move into the metadata)
        # (a rule this build cannot use is always written as read: it has no JSON of ours)
        raw = {id(e): r for e, r in zip(current, raws) if isinstance(e, _Kept) or
               not (isinstance(r, dict) and "knobs" in r)}
        rendered = [raw[id(e)] if id(e) in raw else e.to_json() for e in merged]
        _check_written(merged, rendered, entries, path)
        atomic_write_text(path, render(doc, rendered))
    return WriteReport(str(path), mode, len(merged), replaced, added, moved, set_aside)


def _existing(path: Path, mode: str, device: Mapping[str, Any] | None, unreadable: str
              ) -> tuple[list[Any], list[Any], dict[str, Any], str, int]:
    """What an append keeps of the file there: its entries, their JSON, its other fields, where the file as it
    was went (or ""), and how many unreadable entries were set aside."""
    if not path.exists() or mode == "replace":
        return [], [], {}, "", 0
    if mode == "new":
        raise InputError("refusing to overwrite an existing file in mode 'new'", source=str(path))
    data = _existing_json(path)
    if data is _CORRUPT:
        return [], [], {}, _set_aside(path), 0
    current, raws, extra, moved = _existing_document(data, path, (device or {}).get("signature"))
    current, raws, moved, set_aside = _unreadable_out(current, raws, moved, path, unreadable)
    return current, raws, extra, moved, set_aside


def _unreadable_out(current: list[Any], raws: list[Any], moved: str, path: Path, unreadable: str
                    ) -> tuple[list[Any], list[Any], str, int]:
    """The existing entries without the unreadable ones, where ``unreadable`` says to set them aside (the file as
    it was copied first); else an InputError naming the first of them: a file production refuses is never
    written (hipDNN's writer would keep them, and its reader then refuse the winners just written too)."""
    for i, e in enumerate(current):
        if isinstance(e, _Kept) and e.unusable:  # readers skip it and read the rest: kept as written
            log.warning("overrides: %s: engine_overrides[%d] can match nothing (%s): production's readers skip it and "
                        "read the others; kept as written", path, i, e.why)
    bad = [(i, e) for i, e in enumerate(current) if isinstance(e, _Kept) and not e.unusable]
    if not bad:
        return current, raws, moved, 0
    if unreadable == "refuse":
        i, first = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(f"engine_overrides[{i}]{more} cannot be read ({first.why}); hipDNN's reader and farm.ops "
                         "refuse the whole file while it is there, so the winners written now would never be used: "
                         "fix or remove it, or write with --set-aside-unreadable (the file as it is kept beside, "
                         f"those entries left out); {INVALID_RULE_ENV}=skip makes farm.ops read the rest meanwhile. "
                         "Nothing written", source=str(path))
    copy = moved or str(copy_aside(path, "unreadable"))
    log.warning("overrides: %s: %d entr%s no reader can read (engine_overrides[%s]) left out; the file as it was is "
                "kept at %s", path, len(bad), "y" if len(bad) == 1 else "ies", ", ".join(str(i) for i, _ in bad), copy)
    keep = [i for i, e in enumerate(current) if not isinstance(e, _Kept) or e.unusable]
    return [current[i] for i in keep], [raws[i] for i in keep], copy, len(bad)


def _unusable_knobs(entries: Sequence[OverrideEntry]) -> bool:
    """Whether an entry names knobs its engine (one this process has) does not have or cannot take."""
    from farm.model.engine import default_engine_registry, file_knobs

    registry = default_engine_registry()
    for e in entries:
        if e.knobs and e.engine_name in registry:
            try:
                file_knobs(registry.get(e.engine_name), e.knobs, source="")
            except InputError:
                return True
    return False


@dataclass(frozen=True)
class _Kept:
    """An entry of an existing file this build cannot read (no op, no tensors, a tensor without tensor_id...), or
    one it reads but that can match nothing (``unusable``: a dim below -1; readers skip it alone)."""

    raw: Any
    why: str = ""
    unusable: bool = False


def _existing_document(data: Any, path: Path,
                       new_sig: str | None) -> tuple[list[Any], list[Any], dict[str, Any], str]:
    """The entries (OverrideEntry, or _Kept when unreadable), their JSON as read, the top-level fields and the
    backup of a file appended to.

    Refused, as hipDNN's writer refuses them (nothing written): JSON that is not an object, a file without
    ``version`` (version 1), a version other than 2. Ours too: a file for another device signature."""
    source = str(path)

    def refuse(why: str) -> InputError:
        return InputError(f"refusing to append to {why}; nothing written", source=source)

    if not isinstance(data, dict):
        raise refuse(f"JSON that is not an override document (a {type(data).__name__}, not an object)")
    version = data.get("version")
    if "version" not in data:
        raise refuse(f"a version 1 override file (no version; this build writes version {OVERRIDE_VERSION}): "
                     "write to a new file or use mode 'replace'")
    if not isinstance(version, int) or isinstance(version, bool):
        raise refuse(f"an override file whose version is not an integer ({version!r})")
    if version != OVERRIDE_VERSION:
        raise refuse(f"a version {version} override file (this build writes version {OVERRIDE_VERSION}): "
                     "write to a new file or use mode 'replace'")
    device = data.get("device")
    if device is not None and not (isinstance(device, dict) and isinstance(device.get("signature", ""), str)):
        raise refuse(f"an override file whose device is not an object with a signature ({device!r})")
    old_sig = (device or {}).get("signature")
    if old_sig and new_sig and old_sig != new_sig:
        raise InputError(f"refusing to append results of device {new_sig} to a file for device {old_sig}",
                         source=source)
    moved = ""
    raw_entries = data.get("engine_overrides")
    if raw_entries is None:
        raw_entries = []
    elif not isinstance(raw_entries, list):  # hipDNN replaces it with a list: ours too, a copy of the file kept
        moved = str(copy_aside(path, "replaced"))
        log.warning("overrides: %s: engine_overrides is not a list; a copy of the file is kept at %s, and the "
                    "list starts empty", path, moved)
        raw_entries = []
    items: list[Any] = []
    for i, raw in enumerate(raw_entries):
        try:
            items.append(parse_entry(raw, f"engine_overrides[{i}]", version))
        except InputError as exc:
            items.append(_Kept(raw, f"{exc.field}: {exc.reason}" + (f" (got {exc.value!r:.80})" if exc.has_value else ""),
                               isinstance(exc, UnusableRule)))
    extra = {k: v for k, v in data.items() if k not in ("version", "device", "engine_overrides")}
    return items, list(raw_entries), extra, moved


_CORRUPT = object()


def _check_written(merged: Sequence[OverrideEntry], rendered: Sequence[dict[str, Any]], new: Sequence[OverrideEntry],
                   path: Path) -> None:
    """Read the new entries as they will be written, as strictly as publish does: the writer never produces a
    file its reader refuses (an entry without tensor ids, ids repeated, a stride list of another length...).
    The entries already in the file were read strictly when it was opened."""
    fresh = {id(e) for e in new}
    try:
        for i, (e, obj) in enumerate(zip(merged, rendered)):
            if id(e) not in fresh or not isinstance(e, OverrideEntry):
                continue
            where = f"engine_overrides[{i}]"
            if e.from_problem:  # op, tensors and criteria come from a validated Problem: the rest is checked
                need(isinstance(e.engine_name, str) and bool(e.engine_name), "expected an engine name",
                      f"{where}.engine_name", e.engine_name)
                parse_knobs((obj.get("autotune_metadata") or {}).get("knobs"), f"{where}.autotune_metadata.knobs")
            else:
                parse_entry(obj, where, OVERRIDE_VERSION)
    except InputError as exc:
        value = {"value": exc.value} if exc.has_value else {}
        raise InputError(f"{exc.reason}: refusing to write what the reader would refuse; nothing written",
                         field=exc.field, source=str(path), **value) from None


def _existing_json(path: Path) -> Any:
    """The JSON an existing file holds, or _CORRUPT when it is not JSON (not UTF-8 included); a FIFO, a
    folder or a file too large is an InputError (never opened, never replaced)."""
    try:
        text = read_text_file(path, "override file")
    except InputError:
        if path.is_file() and path.stat().st_size <= MAX_TEXT_BYTES:
            return _CORRUPT  # a regular file of the right size that does not decode: not JSON
        raise
    try:
        return load_json(text, str(path))
    except InputError:
        return _CORRUPT


def _set_aside(path: Path) -> str:
    """Move a corrupt file aside (an error in the log); when that fails, it is overwritten with a warning."""
    try:
        moved = str(move_aside(path))
    except OSError as exc:
        log.warning("overrides: %s is not valid JSON and could not be moved aside (%s); overwriting it", path, exc)
        return ""
    log.error("overrides: %s is not valid JSON; moved aside to %s, writing a fresh file", path, moved)
    return moved


def autotune_metadata(*, rank: int, min_ms: float, avg_ms: float, stddev_ms: float, workspace: int, mode: str,
                      ran_exhaustive: bool, strategy: str, iterations: int, converged: bool, device: str,
                      timestamp: str, supports_exhaustive: bool = False, not_run_reason: str | None = None,
                      **extra: Any) -> dict[str, Any]:
    """The RFC's autotune_metadata (``converged`` only for run_until_stable), plus extra fields.

    ``exhaustive_not_run_reason`` is empty unless EXHAUSTIVE mode did not prime the winner: the tuner's
    reason (``not_run_reason``) when it recorded one, else what mode and support imply; ``timestamp``
    is written as ISO 8601 in whole seconds, UTC (``2026-04-21T10:30:00Z``).
    """
    meta: dict[str, Any] = {
        "rank": rank, "min_time_ms": min_ms, "avg_time_ms": avg_ms, "stddev_ms": stddev_ms,
        "workspace_size": workspace, "mode": mode, "ran_exhaustive": ran_exhaustive,
        "supports_exhaustive": supports_exhaustive, "exhaustive_not_run_reason":
            (not_run_reason or _not_primed(mode, supports_exhaustive, ran_exhaustive)) if mode == "exhaustive" and not ran_exhaustive
            else "",
        "strategy": strategy, "iterations_run": iterations,
    }
    if strategy == "run_until_stable":
        meta["converged"] = converged
    meta["device"] = device
    meta["timestamp"] = iso_seconds(timestamp)
    meta.update(extra)
    return meta


def _not_primed(mode: str, supports: bool, ran: bool) -> str:
    if mode != "exhaustive" or ran:
        return ""
    return "priming did not run (benchmarked unprimed)" if supports else "the engine does not support exhaustive priming"


ISO_SECONDS_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_ISO_SECONDS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def iso_seconds(timestamp: Any) -> str:
    """``2026-04-21T10:30:00Z`` from a datetime or an ISO 8601 text (UTC assumed when it names no zone)."""
    import datetime as dt

    if isinstance(timestamp, str) and _ISO_SECONDS.fullmatch(timestamp):
        return timestamp  # already in this form (the reducer formats a whole column at once)
    if isinstance(timestamp, dt.datetime):
        value = timestamp
    else:
        try:
            value = dt.datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
        except ValueError:
            value = dt.datetime.now(dt.timezone.utc)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc).strftime(ISO_SECONDS_FORMAT)
