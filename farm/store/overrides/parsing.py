"""Reading override files: the parser, as hipDNN's reader reads them (every field validated; an error names the
file and JSON path; a rule that can match nothing is an UnusableRule a production reader skips)."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from farm.errors import InputError
from farm.fsutil import read_text_file
from farm.model.dtypes import canonical_dtype
from farm.model.knobs import KnobSettings, KnobType
from farm.model.problem import INT64_MAX
from farm.store.overrides.hipdnn_names import (HIPDNN_CRITERIA, HIPDNN_OPS, IMPLIED_CRITERIA, IMPLIED_TENSORS, mode_from_hipdnn,
                                     tensor_id_of)
from farm.store.overrides.entries import OverrideEntry, OverrideFile, TensorRule

log = logging.getLogger("farm.store.overrides.entries")


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


def need(cond: bool, message: str, path: str, value: Any, *, unusable: bool = False) -> None:
    if not cond:
        raise (UnusableRule if unusable else InputError)(message, field=path, value=value)


def _int_list(value: Any, path: str, *, allow_wildcard: bool) -> tuple[int, ...]:
    if type(value) is list and all(type(v) is int and (0 <= v <= INT64_MAX or (allow_wildcard and v == -1))
                                   for v in value):
        return tuple(value)  # the common case, checked without making a field path per element
    need(isinstance(value, list), "expected a list of integers", path, value)
    out = []
    for i, v in enumerate(value):
        need(isinstance(v, int) and not isinstance(v, bool), "expected an integer", f"{path}[{i}]", v)
        # hipDNN reads a -2 (or a number past 64 bits) as a dim it never sees: the rule loads and matches nothing
        need(0 <= v <= INT64_MAX or (allow_wildcard and v == -1), "expected a non-negative 64-bit integer or -1 (any)",
              f"{path}[{i}]", v, unusable=True)
        out.append(v)
    return tuple(out)


INVALID_RULE_ENV = "FARM_HEUR_CONFIG_INVALID_RULE"  # "file" (hipDNN's way, the default) or "skip"


def _parse_document(data: Any, source: str, strict: bool = True, invalid_rule: str = "file") -> OverrideFile:
    need(isinstance(data, dict), "an override file is a JSON object with engine_overrides", "$", type(data).__name__)
    version = data.get("version", 1)
    # v1 matches tensors by position; any later version by tensor_id (a newer file is read, not refused)
    need(isinstance(version, int) and not isinstance(version, bool) and version >= 1,
          "expected a version number >= 1", "version", version)
    device = data.get("device")
    need(device is None or (isinstance(device, dict) and isinstance(device.get("signature", ""), str)),
          "expected an object with a signature", "device", device)
    raw_entries = data.get("engine_overrides")
    need(isinstance(raw_entries, list), "expected a list", "engine_overrides", raw_entries)
    extra = {k: v for k, v in data.items() if k not in ("version", "device", "engine_overrides")}
    entries = []
    for i, e in enumerate(raw_entries):
        try:
            entries.append(parse_entry(e, f"engine_overrides[{i}]", version))
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


def parse_entry(obj: Any, path: str, version: int) -> OverrideEntry:
    """One rule. What hipDNN's reader cannot read either (a missing op, engine_name, tensors, dim or v2
    tensor_id, a field of the wrong JSON type, two tensors with one id) raises InputError; what it reads but
    can never match raises UnusableRule."""
    need(isinstance(obj, dict), "expected an object", path, obj)
    op_spelled = obj.get("op")
    if not (isinstance(op_spelled, str) and op_spelled):  # checked once, named only when wrong (10,000s of rules)
        need(isinstance(op_spelled, str), "expected an op name", f"{path}.op", op_spelled)
        need(False, "expected an op name", f"{path}.op", op_spelled, unusable=True)
    op = HIPDNN_OPS.get(op_spelled, op_spelled)
    engine = obj.get("engine_name")
    if not (isinstance(engine, str) and engine):
        need(isinstance(engine, str), "expected an engine name", f"{path}.engine_name", engine)
        need(False, "expected an engine name", f"{path}.engine_name", engine, unusable=True)
    criteria, criteria_spelled, implied_criteria = _parse_criteria(obj.get("criteria", {}), op, path)
    tensors, implied_tensors = _parse_tensors(obj.get("tensors"), op, path, version)
    meta = obj.get("autotune_metadata")
    need(meta is None or isinstance(meta, dict), "expected an object", f"{path}.autotune_metadata", meta, unusable=True)
    knobs = _entry_knobs(obj, meta, path)
    cdt = obj.get("compute_data_type")
    need(cdt is None or isinstance(cdt, str), "expected a dtype name", f"{path}.compute_data_type", cdt, unusable=True)
    extra = {k: v for k, v in obj.items() if k not in _KNOWN_ENTRY_FIELDS}
    canonical_cdt = _dtype_name(cdt, compute=True)
    return OverrideEntry(op, engine, tuple(tensors), tuple(sorted(criteria.items())), knobs, canonical_cdt, meta, extra,
                         cdt if canonical_cdt != cdt else None, op_spelled if op_spelled != op else None,
                         tuple(criteria_spelled), implied_criteria, implied_tensors)


def _parse_criteria(raw: Any, op: str, path: str
                    ) -> tuple[dict[str, int | None], list[tuple[str, str, int]], tuple[tuple[str, int], ...]]:
    """The criteria under our names, those the file spelled hipDNN's way: (ours, theirs, their value), and those
    of hipDNN's key with the value our problems imply (a norm's inference phase): kept, not matched."""
    if type(raw) is not dict:
        need(False, "criteria must be an object", f"{path}.criteria", raw)
    criteria: dict[str, int | None] = {}
    spelled = []
    implied = []
    aliases = HIPDNN_CRITERIA.get(op, {})
    for k, v in raw.items():
        if not (type(v) is int and -INT64_MAX - 1 <= v <= INT64_MAX):
            need(False, "criteria values are 64-bit integers", f"{path}.criteria.{k}", v)
        if IMPLIED_CRITERIA.get(op, {}).get(k, object()) == v:
            implied.append((k, v))
            continue
        ours = aliases.get(k, k)
        if ours in criteria:
            need(False, "criterion given twice (under our name and hipDNN's)", f"{path}.criteria.{k}", v,
                 unusable=True)
        value: int | None = v
        if ours != k:  # hipDNN's name: its value is hipDNN's enum (ADD is 2 there, our add 0)
            value = mode_from_hipdnn(op, v) if ours == "mode" else v
            spelled.append((ours, k, v))
        criteria[ours] = value
    return criteria, spelled, tuple(implied)


def _parse_tensors(raw: Any, op: str, path: str, version: int) -> tuple[list[TensorRule], tuple[dict[str, Any], ...]]:
    """The tensor rules, and (v2) the tensors of hipDNN's key our problems imply (an epsilon), as the file wrote
    them: kept, not matched."""
    if not (type(raw) is list and raw):
        need(isinstance(raw, list), "expected a list of tensors", f"{path}.tensors", raw)
        need(False, "expected a non-empty list of tensors", f"{path}.tensors", raw, unusable=True)
    tensors = []
    implied = []
    for j, t in enumerate(raw):
        tp = f"{path}.tensors[{j}]"
        need(isinstance(t, dict), "expected an object with dim and stride", tp, t)
        tid = spelled_id = t.get("tensor_id")
        if version >= 2:
            if not (isinstance(tid, str) and tid):
                need(False, "v2 tensors need a tensor_id", f"{tp}.tensor_id", tid)
            tid = tensor_id_of(op, tid)
        else:
            tid = None  # v1 matches by position: its tensor ids are ignored
        if "dim" not in t:
            raise InputError("missing", field=tp + ".dim")
        dims = _int_list(t["dim"], tp + ".dim", allow_wildcard=True)
        strides = _int_list(t["stride"], tp + ".stride", allow_wildcard=True) if t.get("stride") is not None else ()
        if strides and len(strides) != len(dims):
            need(False, "stride needs one entry per dim (or [] for any)", f"{tp}.stride", list(strides), unusable=True)
        if tid is not None and tid in IMPLIED_TENSORS.get(op, ()):
            implied.append(t)
            continue
        dtype = t.get("data_type")
        if dtype is not None and not isinstance(dtype, str):
            need(False, "expected a dtype name", f"{tp}.data_type", dtype, unusable=True)
        extra = {k: v for k, v in t.items() if k not in _KNOWN_TENSOR_FIELDS} if not t.keys() <= _KNOWN_TENSOR_FIELDS \
            else {}
        canonical = _dtype_name(dtype)  # matched as ours, written back as the file spelled it
        tensors.append(TensorRule(tid, dims, strides, canonical, extra, dtype if canonical != dtype else None,
                                  spelled_id if tid is not None and spelled_id != tid else None))
    if version >= 2:
        ids = [t.tensor_id for t in tensors] + [t["tensor_id"] for t in implied]
        need(len(set(ids)) == len(ids), "tensor_id values must be unique", f"{path}.tensors", ids)
    return tensors, tuple(implied)


def _entry_knobs(obj: dict[str, Any], meta: dict[str, Any] | None, path: str) -> KnobSettings:
    """The entry's knobs: the RFC's place (``autotune_metadata.knobs``, the list staying there as written), else the
    list earlier tunefarm files carry beside it. Where both are there, both are read and must agree: a list no
    reader checks could hold anything, and a rewrite keeps only one."""
    try:
        beside = parse_knobs(obj.get("knobs"), f"{path}.knobs")
        if meta is None or "knobs" not in meta:
            return beside
        knobs = parse_knobs(meta["knobs"], f"{path}.autotune_metadata.knobs")
        if "knobs" in obj and sorted(beside) != sorted(knobs):
            raise InputError("two knob lists that disagree (knobs beside the metadata, and autotune_metadata.knobs): "
                             "keep one", field=f"{path}.knobs", value=dict(beside))
        return knobs
    except InputError as exc:  # hipDNN does not read the knobs it records: the rule loads there
        raise UnusableRule(exc.reason, field=exc.field, value=exc.value) if exc.has_value else \
            UnusableRule(exc.reason, field=exc.field) from None


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


def parse_knobs(raw: Any, path: str) -> KnobSettings:
    if raw is None:
        return ()
    need(isinstance(raw, list), "expected a list of {knob_id, type, value}", path, raw)
    out = []
    for i, k in enumerate(raw):
        kp = f"{path}[{i}]"
        need(isinstance(k, dict), "expected an object", kp, k)
        kid = k.get("knob_id")
        need(isinstance(kid, str) and kid, "expected a knob_id", f"{kp}.knob_id", kid)
        try:
            ktype = KnobType.parse(k.get("type", ""))
        except InputError:
            raise InputError("knob type must be int, double or string", field=f"{kp}.type", value=k.get("type")) from None
        v = k.get("value")
        if ktype is KnobType.INT:
            need(isinstance(v, int) and not isinstance(v, bool), "an int knob needs an integer value", f"{kp}.value", v)
        elif ktype is KnobType.FLOAT:
            need(isinstance(v, (int, float)) and not isinstance(v, bool), "a double knob needs a number", f"{kp}.value", v)
            v = float(v)
        else:
            need(isinstance(v, str), "a string knob needs a string value", f"{kp}.value", v)
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
        need(calls is None or isinstance(calls, dict), "expected an object of calling modes", "autotune_metadata.calls",
              calls)
        return None
    rec = calls[call]
    path = f"autotune_metadata.calls.{call}"
    need(isinstance(rec, dict), "expected an object with engine_name and knobs", path, rec)
    name = rec.get("engine_name")
    need(isinstance(name, str) and bool(name), "expected an engine name", f"{path}.engine_name", name)
    return name, parse_knobs(rec.get("knobs"), f"{path}.knobs")


# -- writing -------------------------------------------------------------------------------
