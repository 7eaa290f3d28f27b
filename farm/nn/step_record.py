"""A model check (farm.nn.step_check) written where the decisions live.

* A ``farm tune --out`` folder: two rows per judged decision in its results (round ``model``: the step with the
  decision alone and untouched, paired by position; the verdict; the model's name as ``workload_name``), then the
  device's override file reduced again (farm.store.deciding.model_checks reads them: a withdrawn decision publishes the
  default, rule ``withdrawn_in_model``).
* An override file or a published root: the entries rewritten (a withdrawn decision's calling mode runs the
  default; every judged one records ``selection.model_check``); a root is republished (``farm publish --force``:
  the default may be recorded slower than what it replaces, which is the point).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from farm.devices.device import Device
from farm.model.ids import engine_name_to_id
from farm.model.measurement import summarize
from farm.model.records import AutotuneResult, Disposition, TuneMode
from farm.model.measurement import Strategy
from farm.nn.step_check import Judged, StepCheck
from farm.store.deciding.model_checks import MODEL, ModelCheck
from farm.store.overrides.entries import OverrideEntry, OverrideFile
from farm.store.results import MeasurementContext, new_id
from farm.store.run_records import Row, record_in_run
from farm.store.targets import Target, rewrite_entries
from farm.tuner.judging.winner import ConfirmedRule


def record_check(check: StepCheck, target: Target, f: OverrideFile, device: Device) -> list[str]:
    """Keep what the check found (see the module's text); -> lines saying what was written."""
    judged = [j for j in check.judged if j.alone is not None]
    if not judged:
        return []
    if target.kind == "run":
        count, report = record_in_run(Path(target.where), target.path, check_rows(check, f, device), device.signature,
                                      name="model", workload_name=check.model)
        written = [s.write.path for s in report.signatures if s.write is not None]
        return [f"{count} model check row(s) in {Path(target.where) / 'results'}; reduced again: {', '.join(written)}"]
    entries = checked_entries(f, check)
    if not entries:
        return []
    written = rewrite_entries(target, f, entries, device.signature)
    if target.kind == "file":
        return [f"{target.path}: {len(check.withdrawn)} decision(s) withdrawn, {len(judged)} check(s) recorded"]
    return [f"republished {path}: {len(check.withdrawn)} decision(s) withdrawn" for path in written]


def model_check_of(check: StepCheck, j: Judged) -> ModelCheck:
    a = j.alone
    return ModelCheck(check.model, check.call, a.speedup if a else None, a.speedup_low if a else None,
                      a.speedup_high if a else None, a.rounds if a else 0, j.verdict, check.checked_at)


def check_rows(check: StepCheck, f: OverrideFile, device: Device) -> list[Row]:
    """Two rows per judged decision: the step with it alone (``replay``) and untouched (``direct``)."""
    out: list[Row] = []
    for j in check.judged:
        if j.alone is None:
            continue
        name = _problem_name(f, j)
        where = MeasurementContext(device.properties, session_id=new_id(), round=MODEL, call=check.call,
                                   session_size=2, verdict=j.verdict)
        for engine, knobs, samples, path, note in (
                (j.engine, j.knobs, j.with_samples, "replay", f"the step with {j.label} alone"),
                (j.default, (), j.without_samples, "direct", "the step untouched (every call the library's)")):
            s = summarize(list(samples))
            out.append((AutotuneResult(
                problem_key=j.problem.key, engine_id=engine_name_to_id(engine), engine_name=engine, knobs=knobs,
                disposition=Disposition.SUCCEEDED, mode=TuneMode.STANDARD, strategy=Strategy.FIXED_AVERAGE,
                candidate=-1, min_ms=s.min, avg_ms=s.mean, stddev_ms=s.stddev, median_ms=s.median, mad_ms=s.mad,
                samples=tuple(samples), iterations=len(samples), warmups=1, converged=True,
                error=f"model check of {check.model} ({check.call}): {note}, {check.steps_per_sample} step(s) a "
                      f"sample; {j.verdict}", device_name=device.properties.name, started_at=check.checked_at,
                calls_per_sample=check.steps_per_sample, call_path=path), j.problem, name, where))
    return out


def _problem_name(f: OverrideFile, j: Judged) -> str:
    entry = f.match(j.problem)
    meta = entry.metadata if entry is not None else None
    name = meta.get("problem_name") if isinstance(meta, Mapping) else None
    return str(name) if name else j.problem.label()


def checked_entries(f: OverrideFile, check: StepCheck) -> list[OverrideEntry]:
    """The entries of ``f`` the check judged: ``selection.model_check`` recorded in the calling mode's decision,
    and a withdrawn one replaced by the default."""
    out: dict[int, OverrideEntry] = {}
    for j in check.judged:
        if j.alone is None:
            continue
        entry = f.match(j.problem)
        if entry is None:
            continue
        index = f.entries.index(entry)
        out[index] = _with_check(out.get(index, entry), check, j)
    return [out[i] for i in sorted(out)]


def _with_check(entry: OverrideEntry, check: StepCheck, j: Judged) -> OverrideEntry:
    meta = dict(entry.metadata or {})
    record = model_check_of(check, j).as_dict()
    calls = {k: dict(v) for k, v in (meta.get("calls") or {}).items()} if isinstance(meta.get("calls"), Mapping) \
        else None
    own = check.call == (meta.get("call") or check.call) and (entry.engine_name, tuple(entry.knobs)) == (j.engine, j.knobs)
    engine, knobs = entry.engine_name, tuple(entry.knobs)
    if own:
        meta["selection"] = _selection(meta.get("selection"), record, j, check)
        if not j.kept:
            engine, knobs = j.default, ()
            meta.pop("knobs", None)
    elif calls is not None and check.call in calls:
        rec = calls[check.call]
        rec["selection"] = _selection(rec.get("selection"), record, j, check)
        if not j.kept:
            rec["engine_name"], rec["knobs"] = j.default, []
        meta["calls"] = calls
    return dataclasses.replace(entry, engine_name=engine, knobs=knobs, metadata=meta)


def _selection(selection: Any, record: dict[str, Any], j: Judged, check: StepCheck) -> dict[str, Any]:
    sel = dict(selection) if isinstance(selection, Mapping) else {}
    sel["model_check"] = record
    if not j.kept:
        sel.update(rule=ConfirmedRule.WITHDRAWN_IN_MODEL.value, speedup_over_default=1.0, replaced=j.label,
                   why=f"default published by the model check of {check.model} ({check.call}): {j.label} "
                       f"{j.verdict.split(': ', 1)[-1]}")
    return sel


__all__ = ["record_check", "check_rows", "checked_entries", "model_check_of"]
