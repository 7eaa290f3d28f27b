"""Reading and writing override files: the parser (every field validated, errors name the file and JSON path), the renderer, and append/replace writes under a lock."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from farm.errors import InputError
from farm.fsutil import MAX_TEXT_BYTES, PathLock, atomic_write_text, copy_aside, move_aside, read_text_file
from farm.model.dtypes import canonical_dtype
from farm.model.knobs import KnobSettings, KnobType
from farm.model.op_catalog import OPS
from farm.model.problem import INT64_MAX
from farm.store.hipdnn_names import HIPDNN_CRITERIA, HIPDNN_OPS, mode_from_hipdnn, tensor_id_of
from farm.store.overrides import (
    OVERRIDE_VERSION,
    WRITE_MODES,
    OverrideEntry,
    OverrideFile,
    TensorRule,
)

log = logging.getLogger("farm.store.overrides")


# -- reading -------------------------------------------------------------------------------
def load_overrides(path: str | Path, *, strict: bool = True, invalid_rule: str | None = None) -> OverrideFile:
    """Parse an override file; a malformed one raises InputError naming the file and JSON path.

    With ``strict=False`` (what production readers use) the file is read as hipDNN's reader reads it: a rule it
    loads but that can match nothing (a dim below -1, a stride list of another length than its dims) is skipped
    with a warning; a rule it cannot read at all (no dim, a v2 tensor without tensor_id, two tensors with one id,
    a field of the wrong JSON type) makes the whole file invalid: one warning naming the file, the rule and the
    field, and an OverrideFile with no entries and ``invalid`` set, so every query is declined.
    ``invalid_rule="skip"`` (or FARM_HEUR_CONFIG_INVALID_RULE=skip) skips such a rule instead. The document
    itself must still be an override document.
    """
    return parse_overrides(read_text_file(path, "override file"), source=str(path), strict=strict,
                           invalid_rule=invalid_rule)


def parse_overrides(text: str, *, source: str = "<overrides>", strict: bool = True,
                    invalid_rule: str | None = None) -> OverrideFile:
    data = load_json(text, source)
    if invalid_rule is None:
        invalid_rule = (os.environ.get(INVALID_RULE_ENV) or "file").strip().lower()
    try:
        return _parse_document(data, source, strict, invalid_rule)
    except InputError as exc:
        raise exc.within(source=source) from None


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def load_json(text: str, source: str) -> Any:
    """json.loads with an InputError for what a hostile file can hold: bad syntax, nesting too deep,
    integers too long to convert, NaN or Infinity (Python writes them; JSON has no such number)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except _NonFinite as exc:
        at = re.search(r"(?<![\w\"])-?" + re.escape(str(exc).lstrip("-")) + r"(?![\w\"])", text)
        where = f" at line {text.count(chr(10), 0, at.start()) + 1} column {at.start() - text.rfind(chr(10), 0, at.start())}" \
            if at else ""
        raise InputError(f"not valid JSON: {exc}{where} (a number that is not finite; JSON has none, and no time "
                         "or speed-up can be one)", source=source) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", source=source) from None
    except RecursionError:
        raise InputError("not valid JSON here: nested too deeply", source=source) from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        reason = "an integer of more than 4300 digits" if "digits" in str(exc) else str(exc).splitlines()[0]
        raise InputError(f"not valid JSON here: {reason}", source=source) from None


class UnusableRule(InputError):
    """A rule hipDNN's reader loads but that can match nothing (a dim below -1, a stride list of another length
    than its dims...): a production reader skips that rule alone. Any other error in a rule is structural: the
    file is invalid there, as in hipDNN (``load_overrides``)."""


def _need(cond: bool, message: str, path: str, value: Any, *, unusable: bool = False) -> None:
    if not cond:
        raise (UnusableRule if unusable else InputError)(message, field=path, value=value)


def _int_list(value: Any, path: str, *, allow_wildcard: bool) -> tuple[int, ...]:
    if type(value) is list and all(type(v) is int and (0 <= v <= INT64_MAX or (allow_wildcard and v == -1))
                                   for v in value):
        return tuple(value)  # the common case, checked without making a field path per element
    _need(isinstance(value, list), "expected a list of integers", path, value)
    out = []
    for i, v in enumerate(value):
        _need(isinstance(v, int) and not isinstance(v, bool), "expected an integer", f"{path}[{i}]", v)
        # hipDNN reads a -2 (or a number past 64 bits) as a dim it never sees: the rule loads and matches nothing
        _need(0 <= v <= INT64_MAX or (allow_wildcard and v == -1), "expected a non-negative 64-bit integer or -1 (any)",
              f"{path}[{i}]", v, unusable=True)
        out.append(v)
    return tuple(out)


INVALID_RULE_ENV = "FARM_HEUR_CONFIG_INVALID_RULE"  # "file" (hipDNN's way, the default) or "skip"


def _parse_document(data: Any, source: str, strict: bool = True, invalid_rule: str = "file") -> OverrideFile:
    _need(isinstance(data, dict), "an override file is a JSON object with engine_overrides", "$", type(data).__name__)
    version = data.get("version", 1)
    # v1 matches tensors by position; any later version by tensor_id (a newer file is read, not refused)
    _need(isinstance(version, int) and not isinstance(version, bool) and version >= 1,
          "expected a version number >= 1", "version", version)
    device = data.get("device")
    _need(device is None or (isinstance(device, dict) and isinstance(device.get("signature", ""), str)),
          "expected an object with a signature", "device", device)
    raw_entries = data.get("engine_overrides")
    _need(isinstance(raw_entries, list), "expected a list", "engine_overrides", raw_entries)
    extra = {k: v for k, v in data.items() if k not in ("version", "device", "engine_overrides")}
    entries = []
    for i, e in enumerate(raw_entries):
        try:
            entries.append(_parse_entry(e, f"engine_overrides[{i}]", version))
        except UnusableRule as exc:
            if strict:
                raise
            log.warning("overrides: %s: %s; that rule is skipped (it can match nothing), the others load", source, exc)
        except InputError as exc:
            if strict:
                raise
            if invalid_rule == "skip":
                log.warning("overrides: %s: %s; that rule is skipped (%s=skip), the others load", source, exc,
                            INVALID_RULE_ENV)
                continue
            # hipDNN's reader refuses the whole file at a rule it cannot read, and declines every query
            why = f"{exc.field}: {exc.reason}" + (f" (got {exc.value!r})" if exc.has_value else "")
            log.warning("overrides: %s: rule %d is invalid (%s): the whole file is invalid, as hipDNN reads it, "
                        "and no rule of it is used (%s=skip uses the others)", source, i, why, INVALID_RULE_ENV)
            return OverrideFile(version, [], device, extra, source, invalid=why)
    return OverrideFile(version, entries, device, extra, source)


_KNOWN_ENTRY_FIELDS = {"op", "engine_name", "criteria", "tensors", "knobs", "autotune_metadata", "compute_data_type"}
_KNOWN_TENSOR_FIELDS = {"tensor_id", "dim", "stride", "data_type"}


def _parse_entry(obj: Any, path: str, version: int) -> OverrideEntry:
    """One rule. What hipDNN's reader cannot read either (a missing op, engine_name, tensors, dim or v2
    tensor_id, a field of the wrong JSON type, two tensors with one id) raises InputError; what it reads but
    can never match raises UnusableRule."""
    _need(isinstance(obj, dict), "expected an object", path, obj)
    op_spelled = obj.get("op")
    if not (isinstance(op_spelled, str) and op_spelled):  # checked once, named only when wrong (10,000s of rules)
        _need(isinstance(op_spelled, str), "expected an op name", f"{path}.op", op_spelled)
        _need(False, "expected an op name", f"{path}.op", op_spelled, unusable=True)
    op = HIPDNN_OPS.get(op_spelled, op_spelled)
    engine = obj.get("engine_name")
    if not (isinstance(engine, str) and engine):
        _need(isinstance(engine, str), "expected an engine name", f"{path}.engine_name", engine)
        _need(False, "expected an engine name", f"{path}.engine_name", engine, unusable=True)
    raw_criteria = obj.get("criteria", {})
    if type(raw_criteria) is not dict:
        _need(False, "criteria must be an object", f"{path}.criteria", raw_criteria)
    criteria: dict[str, int | None] = {}
    criteria_spelled = []
    aliases = HIPDNN_CRITERIA.get(op, {})
    for k, v in raw_criteria.items():
        if not (type(v) is int and -INT64_MAX - 1 <= v <= INT64_MAX):
            _need(False, "criteria values are 64-bit integers", f"{path}.criteria.{k}", v)
        ours = aliases.get(k, k)
        if ours in criteria:
            _need(False, "criterion given twice (under our name and hipDNN's)", f"{path}.criteria.{k}", v,
                  unusable=True)
        value: int | None = v
        if ours != k:  # hipDNN's name: its value is hipDNN's enum (ADD is 2 there, our add 0)
            value = mode_from_hipdnn(op, v) if ours == "mode" else v
            criteria_spelled.append((ours, k, v))
        criteria[ours] = value
    tensors_raw = obj.get("tensors")
    if not (type(tensors_raw) is list and tensors_raw):
        _need(isinstance(tensors_raw, list), "expected a list of tensors", f"{path}.tensors", tensors_raw)
        _need(False, "expected a non-empty list of tensors", f"{path}.tensors", tensors_raw, unusable=True)
    tensors = []
    for j, t in enumerate(tensors_raw):
        tp = f"{path}.tensors[{j}]"
        _need(isinstance(t, dict), "expected an object with dim and stride", tp, t)
        tid = spelled_id = t.get("tensor_id")
        if version >= 2:
            if not (isinstance(tid, str) and tid):
                _need(False, "v2 tensors need a tensor_id", f"{tp}.tensor_id", tid)
            tid = tensor_id_of(op, tid)
        else:
            tid = None  # v1 matches by position: its tensor ids are ignored
        if "dim" not in t:
            raise InputError("missing", field=tp + ".dim")
        dims = _int_list(t["dim"], tp + ".dim", allow_wildcard=True)
        strides = _int_list(t["stride"], tp + ".stride", allow_wildcard=True) if t.get("stride") is not None else ()
        if strides and len(strides) != len(dims):
            _need(False, "stride needs one entry per dim (or [] for any)", f"{tp}.stride", list(strides), unusable=True)
        dtype = t.get("data_type")
        if dtype is not None and not isinstance(dtype, str):
            _need(False, "expected a dtype name", f"{tp}.data_type", dtype, unusable=True)
        extra = {k: v for k, v in t.items() if k not in _KNOWN_TENSOR_FIELDS} if not t.keys() <= _KNOWN_TENSOR_FIELDS \
            else {}
        canonical = _dtype_name(dtype)  # matched as ours, written back as the file spelled it
        tensors.append(TensorRule(tid, dims, strides, canonical, extra, dtype if canonical != dtype else None,
                                  spelled_id if tid is not None and spelled_id != tid else None))
    if version >= 2:
        ids = [t.tensor_id for t in tensors]
        _need(len(set(ids)) == len(ids), "tensor_id values must be unique", f"{path}.tensors", ids)
    meta = obj.get("autotune_metadata")
    _need(meta is None or isinstance(meta, dict), "expected an object", f"{path}.autotune_metadata", meta, unusable=True)
    try:
        if meta is not None and "knobs" in meta:  # the RFC's place (the list stays in the metadata, as written)
            knobs = _parse_knobs(meta["knobs"], f"{path}.autotune_metadata.knobs")
        else:  # earlier tunefarm files carry them beside the metadata
            knobs = _parse_knobs(obj.get("knobs"), f"{path}.knobs")
    except InputError as exc:  # hipDNN does not read the knobs it records: the rule loads there
        raise UnusableRule(exc.reason, field=exc.field, value=exc.value) if exc.has_value else \
            UnusableRule(exc.reason, field=exc.field) from None
    cdt = obj.get("compute_data_type")
    _need(cdt is None or isinstance(cdt, str), "expected a dtype name", f"{path}.compute_data_type", cdt, unusable=True)
    extra = {k: v for k, v in obj.items() if k not in _KNOWN_ENTRY_FIELDS}
    canonical_cdt = _dtype_name(cdt, compute=True)
    return OverrideEntry(op, engine, tuple(tensors), tuple(sorted(criteria.items())), knobs, canonical_cdt, meta, extra,
                         cdt if canonical_cdt != cdt else None, op_spelled if op_spelled != op else None,
                         tuple(criteria_spelled))


@functools.lru_cache(maxsize=256)  # a file spells a handful of dtypes, once per tensor of every entry
def _dtype_name(name: str | None, *, compute: bool = False) -> str | None:
    """Our name of a dtype a file spells its own way (``HALF``, ``float``, ``HIPDNN_DATA_TYPE_BFLOAT16``);
    a name we do not know is kept as it is (it then matches no problem)."""
    if name is None:
        return None
    key = name.strip()
    for prefix in ("HIPDNN_DATA_TYPE_", "hipdnn_data_type_", "DATA_TYPE_", "data_type_"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    try:
        return canonical_dtype(key, compute=compute)
    except InputError:
        return name


def _parse_knobs(raw: Any, path: str) -> KnobSettings:
    if raw is None:
        return ()
    _need(isinstance(raw, list), "expected a list of {knob_id, type, value}", path, raw)
    out = []
    for i, k in enumerate(raw):
        kp = f"{path}[{i}]"
        _need(isinstance(k, dict), "expected an object", kp, k)
        kid = k.get("knob_id")
        _need(isinstance(kid, str) and kid, "expected a knob_id", f"{kp}.knob_id", kid)
        try:
            ktype = KnobType.parse(k.get("type", ""))
        except InputError:
            raise InputError("knob type must be int, double or string", field=f"{kp}.type", value=k.get("type")) from None
        v = k.get("value")
        if ktype is KnobType.INT:
            _need(isinstance(v, int) and not isinstance(v, bool), "an int knob needs an integer value", f"{kp}.value", v)
        elif ktype is KnobType.FLOAT:
            _need(isinstance(v, (int, float)) and not isinstance(v, bool), "a double knob needs a number", f"{kp}.value", v)
            v = float(v)
        else:
            _need(isinstance(v, str), "a string knob needs a string value", f"{kp}.value", v)
        out.append((kid, v))
    return tuple(sorted(out))


def call_choice(entry: OverrideEntry, call: str) -> tuple[str, KnobSettings] | None:
    """(engine name, knobs) an entry records for production calls of kind ``call`` (``eager`` or ``graph``):
    its own engine when that is the decision for ``call`` (``autotune_metadata.call``), else the one in
    ``autotune_metadata.calls[call]``; None when it has no decision for that kind. A malformed record is an
    InputError naming the JSON path."""
    meta = entry.metadata or {}
    if meta.get("call") == call:
        return entry.engine_name, entry.knobs
    calls = meta.get("calls")
    if calls is None or call not in (calls if isinstance(calls, dict) else {}):
        _need(calls is None or isinstance(calls, dict), "expected an object of calling modes", "autotune_metadata.calls",
              calls)
        return None
    rec = calls[call]
    path = f"autotune_metadata.calls.{call}"
    _need(isinstance(rec, dict), "expected an object with engine_name and knobs", path, rec)
    name = rec.get("engine_name")
    _need(isinstance(name, str) and bool(name), "expected an engine name", f"{path}.engine_name", name)
    return name, _parse_knobs(rec.get("knobs"), f"{path}.knobs")


# -- writing -------------------------------------------------------------------------------
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
    replaced = added = 0
    for e in new:
        k = e.match_key()
        if k in where:
            out[where[k]] = e.spelled_like(out[where[k]])  # a rule hipDNN wrote stays in its words
            replaced += 1
        else:
            where[k] = len(out)
            out.append(e)
            added += 1
    return out, replaced, added


@dataclass(frozen=True)
class WriteReport:
    path: str
    mode: str
    entries: int
    replaced: int
    added: int
    moved_aside: str = ""
    kept: int = 0  # entries this build cannot read, kept as they were (hipDNN's writer keeps them too)


def write_overrides(path: str | Path, entries: Sequence[OverrideEntry], *, device: Mapping[str, Any] | None,
                    mode: str = "append", extra: Mapping[str, Any] | None = None,
                    lock_timeout: float = 120.0) -> WriteReport:
    """Write ``entries`` to ``path``.

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with PathLock(lock_path(path), timeout=lock_timeout):
        moved = ""
        current: list[Any] = []
        raws: list[Any] = []
        old_extra: dict[str, Any] = {}
        if path.exists():
            if mode == "new":
                raise InputError("refusing to overwrite an existing file in mode 'new'", source=str(path))
            if mode == "append":
                data = _existing_json(path)
                if data is _CORRUPT:
                    moved = _set_aside(path)
                else:
                    current, raws, old_extra, moved = _existing_document(data, path, (device or {}).get("signature"))
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
        raw = {id(e): r for e, r in zip(current, raws) if not (isinstance(r, dict) and "knobs" in r)}
        rendered = [raw[id(e)] if id(e) in raw else e.to_json() for e in merged]
        _check_written(merged, rendered, entries, path)
        atomic_write_text(path, render(doc, rendered))
    return WriteReport(str(path), mode, len(merged), replaced, added, moved, len(merged) - len(parsed))


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
    """An entry of an existing file this build cannot read (no op, no tensors, a tensor without tensor_id...),
    written back as it was."""

    raw: Any


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
            items.append(_parse_entry(raw, f"engine_overrides[{i}]", version))
        except InputError as exc:
            log.info("overrides: %s: engine_overrides[%d] kept as it is (%s: %s)", path, i, exc.field, exc.reason)
            items.append(_Kept(raw))
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
                _need(isinstance(e.engine_name, str) and bool(e.engine_name), "expected an engine name",
                      f"{where}.engine_name", e.engine_name)
                _parse_knobs((obj.get("autotune_metadata") or {}).get("knobs"), f"{where}.autotune_metadata.knobs")
            else:
                _parse_entry(obj, where, OVERRIDE_VERSION)
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
