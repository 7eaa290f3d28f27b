"""What a tune will cost before it runs (``farm tune --dry-run``): candidates per device signature and an estimate of
the device time, from the results history where there is one.

Per candidate, the main round's time is, in this order: nothing (the run folder has its row: a resume skips it), its
own last measurement in the history, or the median of the same engine's candidates for the same op on the same
signature; a candidate with none of these has no estimate (counted apart, never guessed). The confirmation stage costs
what it cost these problems before, else at most its budget per problem and calling mode. With a cost model (the
workload's ``prune``), only the candidates it keeps are counted.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pyarrow.dataset as ds

from farm.store.dataset import ResultsDataset

log = logging.getLogger("farm.analysis.estimate")

_COLUMNS = ["device_signature", "op", "problem_key", "candidate_key", "engine_name", "round", "tuning_ms",
            "measured_at", "call", "session_id"]


@dataclass(frozen=True)
class ProblemPlan:
    """One problem's candidates on one device: (engine name, candidate key) each, in discovery order."""

    name: str
    problem_key: str
    op: str
    candidates: tuple[tuple[str, str], ...]
    calls: int = 1  # calling modes its confirmation stage decides
    pruned: int = 0  # candidates a cost model ranks out (not in ``candidates``)


@dataclass(frozen=True)
class Estimate:
    """The cost of one signature's tune. Seconds are device time (one device); ``None``: nothing to estimate from."""

    signature: str
    problems: int
    candidates: int  # to measure (after the cost model)
    pruned: int  # ranked out by the cost model
    measured_before: int  # rows in the run folder already: a resume skips them
    own: int  # timed from their own earlier measurement in the history
    alike: int  # timed from the same engine's candidates for the same op
    unknown: int  # no history for them
    main_s: float | None
    confirm_s: float | None  # from the stage's history for these problems, where every one has one
    confirm_budget_s: float  # the stage's most: budget x problems x calling modes (8 rounds always run)
    sources: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_s(self) -> float | None:
        """The main round and the stage (at its budget where it has no history); None: no main-round estimate
        while something is left to measure."""
        left = self.candidates - self.measured_before
        if left and self.main_s is None:
            return None
        stage = self.confirm_s if self.confirm_s is not None else self.confirm_budget_s
        return (self.main_s or 0.0) + stage

    def to_json(self) -> dict[str, Any]:
        return {"signature": self.signature, "problems": self.problems, "candidates": self.candidates,
                "pruned": self.pruned, "measured_before": self.measured_before,
                "estimated_from": {"own_history": self.own, "same_engine_and_op": self.alike, "none": self.unknown},
                "main_round_s": self.main_s, "confirmation_s": self.confirm_s,
                "confirmation_budget_s": self.confirm_budget_s, "total_s": self.total_s,
                "history": list(self.sources)}


MAX_TUNING_MS = 7 * 86_400_000.0  # a candidate tuned for a week is no measurement: NaN, inf and 1e308 are not history


class EarlierTimes:
    """Main-round and confirmation-stage times of earlier runs, per signature (results folders, read once)."""

    def __init__(self, folders: Sequence[str]) -> None:
        self.sources: list[str] = []
        self.own: dict[tuple[str, str, str], float] = {}  # (signature, problem, candidate) -> its last tuning ms
        self._alike: dict[tuple[str, str, str], list[float]] = {}  # (signature, op, engine) -> tuning ms
        self.stage: dict[tuple[str, str], dict[str, float]] = {}  # (signature, problem) -> call -> its last stage ms
        for folder in folders:
            try:
                data = ResultsDataset(folder)
            except Exception as exc:  # a folder not there (yet): no history from it
                log.info("estimate: no history in %s: %s", folder, exc)
                continue
            t = data.table(_COLUMNS, filter=ds.field("tuning_ms") > 0)
            if t.num_rows == 0:
                continue
            self.sources.append(str(folder))
            t = t.sort_by([("measured_at", "ascending")])
            sessions: dict[tuple[str, str, str], dict[str, list[Any]]] = {}  # -> session -> [latest at, ms]
            for row in t.to_pylist():
                sig, key, ms = row["device_signature"], row["problem_key"], float(row["tuning_ms"])
                if not 0 <= ms <= MAX_TUNING_MS:  # an impossible time (a hand-edited or hostile part) estimates nothing
                    continue
                if row["round"] in ("main", "finalist"):
                    self.own[(sig, key, row["candidate_key"])] = ms  # rows ascend in time: the last one stays
                    self._alike.setdefault((sig, row["op"], row["engine_name"]), []).append(ms)
                elif row["round"] == "confirm":  # a stage's cost: the sum of its rows, its latest session per call
                    s = sessions.setdefault((sig, key, row["call"] or ""), {}).setdefault(row["session_id"], [None, 0.0])
                    s[0], s[1] = row["measured_at"], s[1] + ms
            for (sig, key, call), by_session in sessions.items():
                self.stage.setdefault((sig, key), {})[call] = max(by_session.values(), key=lambda s: s[0])[1]

    def alike(self, signature: str, op: str, engine: str) -> float | None:
        times = self._alike.get((signature, op, engine))
        return statistics.median(times) if times else None


def estimate(signature: str, plans: Sequence[ProblemPlan], history: EarlierTimes, *, measured: Mapping[str, set[str]],
             confirm_budget_ms: float, confirm: bool = True) -> Estimate:
    """The cost of tuning ``plans`` on ``signature``; ``measured``: problem key -> candidate keys the run folder has
    already (a resume skips them)."""
    own = alike = unknown = before = 0
    main_ms = 0.0
    for p in plans:
        done = measured.get(p.problem_key, set())
        for engine, key in p.candidates:
            if key in done:
                before += 1
                continue
            ms = history.own.get((signature, p.problem_key, key))
            if ms is not None:
                own += 1
            else:
                ms = history.alike(signature, p.op, engine)
                if ms is None:
                    unknown += 1
                    continue
                alike += 1
            main_ms += ms
    stages = [history.stage.get((signature, p.problem_key)) for p in plans] if confirm else []
    confirm_ms = sum(sum(s.values()) for s in stages if s) if stages and all(stages) else None
    return Estimate(signature=signature, problems=len(plans), candidates=sum(len(p.candidates) for p in plans),
                    pruned=sum(p.pruned for p in plans), measured_before=before, own=own, alike=alike,
                    unknown=unknown, main_s=main_ms / 1e3 if own or alike else None,
                    confirm_s=confirm_ms / 1e3 if confirm_ms is not None else (0.0 if not confirm else None),
                    confirm_budget_s=(confirm_budget_ms / 1e3 * sum(p.calls for p in plans)) if confirm else 0.0,
                    sources=tuple(history.sources))


def already_measured(results: str, signature: str) -> dict[str, set[str]]:
    """Problem key -> candidate keys with a main-round row (any outcome) in a run's results: what a resume skips."""
    try:
        data = ResultsDataset(results, signatures=[signature])
    except Exception:  # no results folder yet: nothing measured
        return {}
    t = data.table(["problem_key", "candidate_key", "round"], filter=ds.field("round").isin(["main", "finalist"]))
    out: dict[str, set[str]] = {}
    for key, cand in zip(t["problem_key"].to_pylist(), t["candidate_key"].to_pylist()):
        out.setdefault(key, set()).add(cand)
    return out
