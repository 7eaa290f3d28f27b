"""Incumbents: the decisions a current override file holds (one file, a folder of them, or a published root), which
the reducer gives the benefit of the doubt, and the job record that names them for a results folder."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from farm.model.ids import engine_name_to_id
from farm.store.dataset import ResultsDataset
from farm.store.overrides.parsing import load_overrides
from farm.store.overrides.entries import OverrideEntry
from farm.model.plans import candidate_key

log = logging.getLogger("farm.store.deciding")


def incumbent_keys(table: pa.Table, first_rows: np.ndarray, signatures: list[str], keys: list[str],
                    incumbents: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(signature, problem key) -> the candidate key the incumbent override file names for that problem."""
    from farm.model.problem import Problem

    out: dict[tuple[str, str], str] = {}
    by_key: dict[str, dict[str, OverrideEntry]] = {}
    for sig, f in incumbents.items():
        if f is not None:
            by_key[sig] = {(e.metadata or {}).get("problem_key"): e for e in f.entries if e.metadata}
    for row, sig, key in zip(first_rows.tolist(), signatures, keys):
        f = incumbents.get(sig)
        if f is None:
            continue
        entry = by_key[sig].get(key)
        if entry is None:
            try:
                entry = f.match(Problem.from_canonical(json.loads(table["problem_json"][row].as_py())))
            except Exception:  # a problem the file cannot describe has no incumbent
                entry = None
        if entry is not None:
            out[(sig, key)] = candidate_key(engine_name_to_id(entry.engine_name), tuple(sorted(entry.knobs)))
    return out


def job_record(data: ResultsDataset) -> dict[str, Any]:
    """The record (job.json) of the job folder holding these results, local or on shared storage; {} when there is
    none or it is not a JSON object (farm tune moves a corrupt record aside when it resumes)."""
    if data.location.name != "results":
        return {}
    try:
        text = data.location.parent().read_text("job.json")
        record = json.loads(text) if text is not None else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def load_incumbents(source: str | Path | None, data: ResultsDataset) -> dict[str, Any]:
    """signature -> the override file whose winners are the incumbents for it (exact signatures only).

    ``source`` is one override file, a folder of ``<signature>.json`` files, or a published root
    (``farm publish``'s layout, local or ``s3://``/``gs://``); None means no incumbents.
    """
    if not source:
        return {}
    from farm.devices.properties import DeviceProperties

    source = str(source)
    if "://" not in source and not os.path.exists(source):
        log.warning("reduce: incumbents %s not found; no incumbents", source)
        return {}
    t = data.table(["device_signature", "device_json"]) if data.files else None
    devices = {} if t is None else dict(zip(t["device_signature"].to_pylist(), t["device_json"].to_pylist()))
    found: dict[str, Any] = {}
    for sig, device_json in devices.items():
        f = incumbent_file(source, DeviceProperties.from_dict(json.loads(device_json)))
        if f is not None:
            found[sig] = f
    return found


def incumbent_file(source: str | Path | None, props: Any) -> Any:
    """The override file (an :class:`~farm.store.overrides.OverrideFile`) holding the incumbents for the device
    ``props`` describes, from one file, a folder of ``<signature>.json`` files or a published root; None
    when there is none for that exact signature (or it cannot be read: a warning says so)."""
    from farm.errors import FarmError
    from farm.store.publish.published import find_published

    if not source:
        return None
    source, sig = str(source), props.signature
    path = ""
    if "://" not in source and os.path.isfile(source):
        path = source
    elif "://" not in source and os.path.isfile(os.path.join(source, f"{sig}.json")):
        path = os.path.join(source, f"{sig}.json")
    elif "://" in source or os.path.isdir(source):
        hit = find_published(source, props)
        path = hit[0] if hit is not None and not hit[1] else ""  # another signature is no incumbent
    if not path:
        return None
    try:
        f = load_overrides(path)
    except FarmError as exc:
        log.warning("reduce: incumbents file %s unreadable (%s); none for %s", path, exc, sig)
        return None
    return f if path != source or f.device_signature == sig else None  # one file: for its own signature only


def incumbent_spec(f: Any, problem: Any) -> Any:
    """The plan spec the incumbent file names for ``problem`` (by its problem key, else by matching), or None."""
    from farm.model.plans import PlanSpec

    if f is None:
        return None
    entry = next((e for e in f.entries if (e.metadata or {}).get("problem_key") == problem.key), None) \
        or f.match(problem)
    return PlanSpec(engine_name_to_id(entry.engine_name), tuple(sorted(entry.knobs))) if entry is not None else None


def decided_keys(f: Any) -> frozenset[str]:
    """The problem keys the override file ``f`` holds decisions made for (a rule that merely matches a problem
    is no decision for it)."""
    return frozenset(k for e in f.entries if (k := (e.metadata or {}).get("problem_key")))
