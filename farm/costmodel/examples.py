"""What a cost model learns from: every problem of results datasets with its candidates' measured times.

Per (device signature, problem): each candidate's main-round median (the fastest session's, when it was
measured more than once), or its failure. A problem counts when at least two candidates succeeded; rows
a cost model pruned, and candidates a filter or a limit skipped, are no examples of anything.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from farm.costmodel.features import Row, candidate_rows, device_features, problem_features
from farm.errors import InputError
from farm.model.knobs import KnobSettings
from farm.model.problem import Problem
from farm.model.records import Disposition
from farm.store.dataset import ResultsDataset, results_folder
from farm.store.results import knobs_from_structs

log = logging.getLogger("farm.costmodel")

# the target: log2 of the time over the problem's best, capped (a failure counts as the cap: never worth measuring)
TARGET_CAP = 5.0  # 32x the best

_COLUMNS = ["device_signature", "job_id", "run_id", "workload_name", "problem_name", "problem_key", "problem_json",
            "device_json", "engine_name", "knobs", "candidate_key", "candidate_index", "round", "disposition",
            "succeeded", "median_ms", "mad_ms"]


@dataclass(frozen=True)
class CandidateTime:
    engine: str
    knobs: KnobSettings
    key: str  # candidate_key
    index: int  # discovery position
    median_ms: float | None  # None: it failed
    mad_ms: float | None = None  # its median absolute deviation (the winner rule's noise), same session

    @property
    def is_default(self) -> bool:
        return not self.knobs


@dataclass(frozen=True)
class ProblemTimes:
    """One problem on one device signature, every candidate measured."""

    signature: str
    key: str
    name: str
    family: str
    workload: str
    problem: Problem
    device: dict
    candidates: tuple[CandidateTime, ...]  # in discovery order
    published: str = ""  # the label of the reducer's winner (what the override file names), '' when it has none

    @property
    def best_ms(self) -> float:
        return min(c.median_ms for c in self.candidates if c.median_ms is not None)

    @property
    def default(self) -> CandidateTime | None:
        """The earliest-discovered candidate with default knobs: what the runtime runs with nothing tuned."""
        return next((c for c in self.candidates if c.is_default), None)

    def feature_rows(self) -> list[Row]:
        return candidate_rows(problem_features(self.problem), device_features(self.device),
                              ((c.engine, c.knobs) for c in self.candidates))

    def targets(self) -> list[float]:
        """log2(time / best), capped at TARGET_CAP; a failed candidate is the cap."""
        best = self.best_ms
        return [min(TARGET_CAP, math.log2(c.median_ms / best)) if c.median_ms is not None else TARGET_CAP
                for c in self.candidates]


@dataclass(frozen=True)
class TrainingSet:
    problems: tuple[ProblemTimes, ...]
    sources: tuple[str, ...]
    runs: tuple[str, ...]
    jobs: tuple[str, ...]
    rows: int  # results rows read (main round)

    def describe(self) -> dict:
        """What the model file records of its training data."""
        sigs: dict[str, dict[str, int]] = {}
        for p in self.problems:
            s = sigs.setdefault(p.signature, {"problems": 0, "candidates": 0})
            s["problems"] += 1
            s["candidates"] += len(p.candidates)
        return {"datasets": list(self.sources), "runs": list(self.runs), "jobs": list(self.jobs),
                "rows": self.rows, "problems": len(self.problems),
                "candidates": sum(len(p.candidates) for p in self.problems), "signatures": sigs,
                "families": sorted({p.family for p in self.problems})}


def family_of(problem_name: str, workload_name: str) -> str:
    """A problem's family: the part of its name before the first '/' (``llama3-8b/qkv/m16`` -> ``llama3-8b``),
    else its workload's name (a workload of one model's shapes)."""
    return problem_name.split("/", 1)[0] if "/" in problem_name else workload_name


_SKIPPED = {Disposition.PRUNED.value, Disposition.EXCLUDED_BY_FILTER.value, Disposition.BARRED_BY_DESELECT.value,
            Disposition.EXCEEDS_WORKSPACE_LIMIT.value, Disposition.TIMED_OUT.value, Disposition.CRASHED.value}


def load_training_set(sources: Sequence[str | Path]) -> TrainingSet:
    """Every problem of the results datasets ``sources`` (run folders, results folders or pyarrow.fs URIs)."""
    import pyarrow.dataset as ds

    from farm.store.deciding.rule import decide_results

    by_problem: dict[tuple[str, str], dict] = {}
    published: dict[tuple[str, str], str] = {}  # the reducer's winner per problem; a later source's decision counts
    runs: set[str] = set()
    jobs: set[str] = set()
    rows = 0
    bad: list[str] = []  # rows whose median is 0, negative or not a number: skipped, said once
    for source in sources:
        dataset = ResultsDataset(results_folder(source))
        if not dataset.files:
            raise InputError("holds no results files", source=str(source))
        published.update({key: w.label for key, w in decide_results(dataset).winners.items()})
        t = dataset.table(_COLUMNS, filter=ds.field("round") == "main")
        rows += t.num_rows
        cols = {c: t.column(c).to_pylist() for c in _COLUMNS}
        for i in range(t.num_rows):
            if cols["disposition"][i] in _SKIPPED:
                continue
            sig, pk = cols["device_signature"][i], cols["problem_key"][i]
            entry = by_problem.get((sig, pk))
            if entry is None:
                entry = by_problem[(sig, pk)] = {
                    "name": cols["problem_name"][i], "workload": cols["workload_name"][i],
                    "problem_json": cols["problem_json"][i], "device_json": cols["device_json"][i], "cands": {}}
            runs.add(cols["run_id"][i])
            jobs.add(cols["job_id"][i])
            ck = cols["candidate_key"][i]
            med = cols["median_ms"][i] if cols["succeeded"][i] else None
            if med is not None and not (med > 0 and math.isfinite(med)):  # no time to learn from: a bad row
                bad.append(f"{cols['problem_name'][i]} {cols['engine_name'][i]} ({med!r} ms, {source})")
                med = None
            have = entry["cands"].get(ck)
            if have is None or (med is not None and (have[3] is None or med < have[3])):
                entry["cands"][ck] = (cols["engine_name"][i], cols["knobs"][i], cols["candidate_index"][i], med,
                                      cols["mad_ms"][i] if med is not None else None)
    if bad:
        log.warning("costmodel: %d row(s) with a median time of 0 or below (or not a number) skipped, e.g. %s",
                    len(bad), bad[0])
    problems = []
    for (sig, pk), e in sorted(by_problem.items()):
        cands = tuple(sorted((CandidateTime(engine, knobs_from_structs(knobs), ck, int(idx), med, mad)
                              for ck, (engine, knobs, idx, med, mad) in e["cands"].items()),
                             key=lambda c: (c.index, c.key)))
        if sum(c.median_ms is not None and c.median_ms > 0 for c in cands) < 2:
            continue  # nothing to rank
        try:
            problem = Problem.from_canonical(json.loads(e["problem_json"]))
            device = json.loads(e["device_json"])
        except (ValueError, InputError) as exc:
            log.warning("costmodel: skipping problem %s on %s: unreadable (%s)", e["name"], sig, exc)
            continue
        problems.append(ProblemTimes(sig, pk, e["name"], family_of(e["name"], e["workload"]), e["workload"], problem,
                                     device, cands, published.get((sig, pk), "")))
    return TrainingSet(tuple(problems), tuple(str(s) for s in sources), tuple(sorted(runs)), tuple(sorted(jobs)), rows)


def stack(problems: Iterable[ProblemTimes]) -> tuple[list[Row], list[float], list[int]]:
    """Feature rows, targets and group sizes (candidates per problem) of ``problems``."""
    rows: list[Row] = []
    targets: list[float] = []
    groups: list[int] = []
    for p in problems:
        rows.extend(p.feature_rows())
        targets.extend(p.targets())
        groups.append(len(p.candidates))
    return rows, targets, groups
