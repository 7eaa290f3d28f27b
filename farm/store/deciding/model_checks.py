"""The model check's rows (round ``model``) read back into the decisions: what ``farm apply`` found on a model's step.

A model check (farm.nn.step_check) times a model's whole step with and without each routed decision, in paired
rounds, in its calling mode. It writes two rows per decision it judged (session size 2, samples paired by
position, step milliseconds): the step with the decision (``call_path`` ``replay``: the decision's candidate)
and without it (``direct``: the default's candidate), the ``verdict`` (``holds: ...`` or ``withdrawn: ...``) and
the model's name (``workload_name``). The reducer attaches the newest check of each decision still in force; a
``withdrawn`` one publishes the default in its place (rule ``withdrawn_in_model``), timed by its own row of the
decision's round, so the override file, the winners table, ``farm report`` and a replay agree.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from farm.model.ids import engine_name_to_id
from farm.model.plans import candidate_key, spec_of
from farm.store.dataset import ResultsDataset
from farm.tuner.judging.paired import CONFIDENCE, paired_ratio
from farm.tuner.judging.winner import ConfirmedRule

__all__ = ["MODEL", "ModelCheck", "apply_model_checks"]

MODEL = "model"  # the round of a model check's rows
_COLUMNS = ("device_signature", "problem_key", "call", "session_id", "session_size", "candidate_key", "engine_name",
            "call_path", "verdict", "workload_name", "samples_ms", "measured_at", "succeeded")


@dataclass(frozen=True)
class ModelCheck:
    """A decision checked on a model's step: the step's paired speed-up with it (untouched / with), its interval."""

    model: str
    call: str
    speedup: float | None
    low: float | None
    high: float | None
    rounds: int
    verdict: str  # 'holds: why' | 'withdrawn: why'
    checked_at: str
    confidence: float = CONFIDENCE

    @property
    def withdrawn(self) -> bool:
        return self.verdict.startswith("withdrawn")

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "call": self.call, "step_speedup": self.speedup,
                "interval": [self.low, self.high] if self.speedup is not None else None, "rounds": self.rounds,
                "confidence": self.confidence, "verdict": self.verdict, "checked_at": self.checked_at}


def apply_model_checks(data: ResultsDataset, table: pa.Table, winners: dict[tuple[str, str], Any],
                       top: dict[tuple[str, str], list[int]] | None = None) -> dict[tuple[str, str], Any]:
    """Each decision with the newest model check of it (of its own candidate, not older than the decision); a
    withdrawn one replaced by the default of its round (``top`` then ranks the default first)."""
    rows = data.table(list(_COLUMNS), filter=ds.field("round") == MODEL)
    if rows.num_rows == 0:
        return winners
    sessions = _sessions(rows)
    made_at = pc.cast(table["measured_at"], pa.int64()).to_numpy(zero_copy_only=False)
    out = dict(winners)
    for (sig, pkey, call), found in sessions.items():
        main = out.get((sig, pkey))
        decision = main.for_call(call) if main is not None else None
        if decision is None:
            continue
        want = _candidate_key(decision.engine_name, decision.knobs)
        since = int(made_at[decision.row]) if 0 <= decision.row < len(made_at) else 0
        hit = next((s for s in found if s["key"] == want and s["at"] >= since), None)
        if hit is None:
            continue
        check = hit["check"]
        if check.withdrawn and decision.default_row >= 0:
            decision = _withdrawn(decision, check, table, hit)
            if top is not None and main.for_call(call) is main:
                top[(sig, pkey)] = [decision.row] + [i for i in top.get((sig, pkey), []) if i != decision.row]
        else:
            decision = dataclasses.replace(decision, model_check=check)
        out[(sig, pkey)] = main.with_call(call, decision)
    return out


def _sessions(rows: pa.Table) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """(signature, problem, call) -> its whole sessions, newest first: the check, the decision's candidate key,
    the default's engine and knobs, and when."""
    d = rows.to_pydict()
    by_id: dict[str, list[int]] = {}
    for i, sid in enumerate(d["session_id"]):
        if d["succeeded"][i]:
            by_id.setdefault(str(sid), []).append(i)
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for members in by_id.values():
        mine = next((i for i in members if d["call_path"][i] == "replay"), None)
        base = next((i for i in members if i != mine), None)
        if mine is None or base is None or len(members) < (d["session_size"][mine] or 2):
            continue
        r = paired_ratio(d["samples_ms"][mine] or [], d["samples_ms"][base] or [])
        ok = r.rounds > 0 and math.isfinite(r.ratio)
        at = d["measured_at"][mine]
        check = ModelCheck(str(d["workload_name"][mine] or ""), str(d["call"][mine] or "eager"),
                           r.speedup if ok else None, r.speedup_low if ok else None, r.speedup_high if ok else None,
                           r.rounds, str(d["verdict"][mine] or ""), at.strftime("%Y-%m-%dT%H:%M:%SZ"))
        key = (str(d["device_signature"][mine]), str(d["problem_key"][mine]), check.call)
        out.setdefault(key, []).append({"check": check, "key": str(d["candidate_key"][mine]),
                                        "at": int(at.timestamp() * 1000),
                                        "default": (str(d["engine_name"][base]), spec_of(str(d["candidate_key"][base])).knobs)})
    for found in out.values():
        found.sort(key=lambda s: -s["at"])
    return out


def _withdrawn(decision: Any, check: ModelCheck, table: pa.Table, hit: dict[str, Any]) -> Any:
    """The default in place of a decision the model check withdrew, with its figures from the decision's round."""
    engine, knobs = hit["default"]
    row = decision.default_row
    return decision.default_in_place(
        engine, knobs, median_ms=decision.default_ms, min_ms=table["min_ms"][row].as_py(),
        mad_ms=table["mad_ms"][row].as_py(), row=row, rule=ConfirmedRule.WITHDRAWN_IN_MODEL, model_check=check,
        why=f"default published by the model check of {check.model} ({check.call}): {decision.label} "
            f"{check.verdict.split(': ', 1)[-1]}")


def _candidate_key(engine: str, knobs: Any) -> str:
    return candidate_key(engine_name_to_id(engine), tuple(sorted(knobs)))
