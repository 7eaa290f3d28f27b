"""Offline analysis of a results folder: what was tuned, what failed, what it bought, how noisy it was.

    farm report runs/x/results [--json] [--html report.html]

Per device signature: problems, candidates measured, failures by disposition,
tuning time, the winner's speed-up over the default engine (geomean and worst),
the noisiest problems, and where devices of one signature disagree. The winner
and the default are the reducer's (farm.tuner.judging.winner: the override file's entry, with
its reason when it is not the fastest); the default is the earliest-discovered
candidate with default knobs, what the runtime runs with nothing tuned.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from farm.analysis.phases import RunPhases, run_phases
from farm.store.dataset import ResultsDataset, results_folder
from farm.store.deciding.records import CONFIRM, VERIFY, Decisions, Winner
from farm.store.deciding.model_checks import MODEL
from farm.tuner.judging.winner import NOISE_SIGMAS, NOISY_RELATIVE, RELATIVE_FLOOR, noise_sigma

_COLUMNS = ["device_signature", "device_name", "host", "device_index", "problem_key", "problem_name", "problem_label",
            "candidate_key", "candidate_index", "engine_name", "knobs", "disposition", "succeeded", "median_ms",
            "avg_ms", "stddev_ms", "mad_ms", "samples_ms", "tuning_ms", "measured_at", "round", "node_id", "session_id",
            "call", "session_size"]


@dataclass
class ProblemSummary:
    key: str
    name: str
    label: str
    candidates: int
    winner: str
    winner_ms: float
    default: str
    default_ms: float | None
    why: str  # '' when the winner is the fastest measured candidate
    # the winner's robust noise, 1.4826 x MAD / median (what the winner rule uses), in the decision's round (``round``):
    # the stage's samples where one decided, else the main round's (the median over devices)
    noise: float
    near: int  # other candidates within the winner's noise band (a stage: its ties)
    device_winners: dict[str, str]  # device -> its fastest candidate of those every device measured (main round)
    spread: float  # the winner's slowest device / fastest device (main round)
    samples: dict[str, list[float]] = field(default_factory=dict)  # candidate -> samples of the decision's round
    speedup: float | None = None  # the winner's (paired, when confirmed) speed-up over the default
    interval: tuple[float, float] | None = None  # its interval (confirmed winners that are not the default)
    confirmation: Any = None  # farm.store.deciding.Confirmation, or None when no stage ran
    call: str = ""
    pruned: int = 0  # candidates a cost model ranked out (farm tune --prune) and nobody measured
    default_noisy: bool = False  # the default's own noise makes the speed-up over it doubtful (no stage)
    checks: tuple[dict[str, Any], ...] = ()  # each calling mode's decision: published and delivered (farm verify)
    winner_engine: str = ""  # the winner as its engine and knobs (``winner`` is its label), for scripts
    winner_knobs: dict[str, Any] = field(default_factory=dict)
    round: str = "main"  # the round winner_ms, default_ms, speedup, noise and samples come from (Parquet's ``round``)
    short_where_replayed: str = ""  # farm verify's verdict where it delivers less than published (Winner's)
    rule: str = ""  # the winner rule that decided (farm.tuner.judging.winner: Rule or ConfirmedRule value)

    @property
    def untrusted(self) -> bool:
        """Measure again before trusting it: the confirmation stage ended on its budget before it separated
        the leader from the default, farm verify found it short of its figure where replayed, or (no stage) the
        winner is noisy and others are within its noise."""
        if self.confirmation is not None:
            return not self.confirmation.decided or bool(self.short_where_replayed)
        return (self.noise > NOISY_RELATIVE and self.near > 0) or (self.default_noisy and self.winner != self.default)

    @property
    def doubt(self) -> str:
        """Why it is not trusted ('' when it is)."""
        if not self.untrusted:
            return ""
        if self.confirmation is not None and not self.confirmation.decided:
            return f"undecided after {self.confirmation.rounds} paired rounds (budget ended)"
        if self.short_where_replayed:
            return f"farm verify: {self.short_where_replayed}"
        if self.noise > NOISY_RELATIVE and self.near > 0:
            return f"winner within noise of {self.near} other(s), no confirmation stage"
        return "the default is noisy: the speed-up over it is doubtful, no confirmation stage"

    devices_compared: bool = False  # two devices or more measured at least two candidates in common

    @property
    def disagree(self) -> bool:
        """Devices that measured the same candidates rank a different one fastest."""
        return self.devices_compared and len(set(self.device_winners.values())) > 1


@dataclass
class SignatureSummary:
    signature: str
    device_name: str
    devices: list[str]
    rows: int
    problems: list[ProblemSummary]
    failures: dict[str, int]
    tuning_s: float
    device_noise: dict[str, list[float]]  # device -> robust noise of every successful candidate it measured
    confirm_s: float = 0.0  # of the tuning time, what the confirmation stages took

    @property
    def checks(self) -> list[dict[str, Any]]:
        return [{**c, "problem": p.name} for p in self.problems for c in p.checks]

    def verified(self) -> tuple[int, int]:
        """(decisions farm verify found holding, decisions it checked)."""
        done = [c for c in self.checks if c["verdict"]]
        return sum(c["verdict"] == "holds" for c in done), len(done)

    def cpu_notes(self) -> list[str]:
        """Where eager decisions were measured on hosts of several CPU models, or replayed on another than their
        own: an eager call's time is the host's as much as the device's."""
        eager = [c for c in self.checks if c["call"] == "eager"]
        models: dict[str, list[str]] = {}
        for c in eager:
            for cpu in c["measured_cpus"]:
                models.setdefault(cpu, []).append(c["problem"])
        notes = []
        if len(models) > 1:
            notes.append("eager decisions were measured on hosts of " + str(len(models)) + " CPU models ("
                         + "; ".join(f"{m}: {len(ps)} problem(s)" for m, ps in sorted(models.items())) + "): a decision "
                         "for a host-bound call is one for that host's CPU as much as for the device")
        for c in eager:
            if c["host_cpu"] and c["measured_cpus"] and c["host_cpu"] not in c["measured_cpus"]:
                notes.append(f"{c['problem']}: measured on {', '.join(c['measured_cpus'])}, verified on {c['host_cpu']}")
        return notes

    @property
    def pruned(self) -> int:
        return sum(p.pruned for p in self.problems)

    @property
    def speedups(self) -> list[float]:
        return [p.speedup for p in self.problems if p.speedup]

    @property
    def geomean_speedup(self) -> float | None:
        s = self.speedups
        return math.exp(sum(math.log(x) for x in s) / len(s)) if s else None

    @property
    def worst(self) -> ProblemSummary | None:
        with_speedup = [p for p in self.problems if p.speedup]
        return min(with_speedup, key=lambda p: p.speedup) if with_speedup else None  # type: ignore[arg-type, return-value]

    def noisiest(self, n: int = 5) -> list[ProblemSummary]:
        return sorted(self.problems, key=lambda p: -p.noise)[:n]

    def untrusted(self) -> list[ProblemSummary]:
        return [p for p in self.problems if p.untrusted]

    def disagreements(self) -> list[ProblemSummary]:
        return [p for p in self.problems if p.disagree]


@dataclass
class NodeSummary:
    """What one Ray node's workers measured (rows carry their node), and its fate in the latest farm run."""

    node_id: str
    hosts: list[str]
    signatures: list[str]
    rows: int
    candidates: int  # main-round rows
    failures: int
    state: str = ""  # in the last run that recorded it: active / lost ('' when none did)
    joined_s: float | None = None
    lost_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Report:
    root: str
    signatures: list[SignatureSummary]
    skipped_files: list[tuple[str, str]]
    phases: RunPhases | None = None  # the latest farm run's device time by phase (job.json), when there is one
    nodes: list[NodeSummary] = field(default_factory=list)  # per Ray node (rows measured by a farm's workers)
    waiting: dict[str, list[str]] = field(default_factory=dict)  # the latest run's problems waiting for a device


def _candidate(row: dict[str, Any]) -> str:
    from farm.model.knobs import candidate_label
    from farm.model.plans import spec_of

    return candidate_label(row["engine_name"], spec_of(row["candidate_key"]).knobs)


def _noise(row: dict[str, Any]) -> float:
    """1.4826 x MAD / median of one row: one outlier among its samples does not move it (a CoV it would)."""
    median, mad = row["median_ms"], row["mad_ms"]
    if not median or median <= 0 or mad is None:
        return 0.0
    return float(noise_sigma([mad])[0]) / median


def build_report(results_dir: str | Path, decisions: Decisions | None = None) -> Report:
    from farm.store.deciding.rule import decide_folder
    from farm.store.deciding.incumbents import job_record

    results_dir = results_folder(results_dir)  # a run folder (farm tune --out) works too
    data = ResultsDataset(results_dir)
    decisions = decisions or decide_folder(results_dir)
    table = data.table(_COLUMNS)
    rows = table.to_pylist()
    by_sig: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_sig.setdefault(r["device_signature"], []).append(r)
    skipped = list(dict.fromkeys([*decisions.skipped_files, *((s.path, s.reason) for s in data.skipped)]))
    record = job_record(data)
    return Report(str(results_dir), [_signature(sig, rs, decisions) for sig, rs in sorted(by_sig.items())], skipped,
                  run_phases(record), _nodes(rows, record), _waiting(record))


def _latest_run(record: Any) -> Mapping[str, Any]:
    runs = record.get("runs") if isinstance(record, Mapping) else None
    last = runs[-1] if isinstance(runs, list) and runs else None
    return last if isinstance(last, Mapping) else {}


def _nodes(rows: list[dict[str, Any]], record: Any) -> list[NodeSummary]:
    """Rows per Ray node, with what the job record's latest run with that node says of it (lost, joined)."""
    runs = record.get("runs") if isinstance(record, Mapping) else None
    fate = {n.get("node_id"): n for run in (runs if isinstance(runs, list) else []) if isinstance(run, Mapping)
            for n in (run.get("nodes") if isinstance(run.get("nodes"), list) else []) if isinstance(n, Mapping)}
    by_node: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("node_id"):
            by_node.setdefault(r["node_id"], []).append(r)
    out = []
    for node, rs in by_node.items():
        seen = fate.get(node, {})
        out.append(NodeSummary(node, sorted({r["host"] for r in rs}), sorted({r["device_signature"] for r in rs}),
                               len(rs), sum(r["round"] == "main" for r in rs), sum(not r["succeeded"] for r in rs),
                               str(seen.get("state", "")), seen.get("joined_s"), seen.get("lost_s")))
    return sorted(out, key=lambda n: (-n.rows, n.node_id))


def _waiting(record: Any) -> dict[str, list[str]]:
    run = _latest_run(record)
    waiting = run.get("waiting_for_devices") if run.get("state") == "waiting" else None
    if not isinstance(waiting, Mapping):
        return {}
    return {str(sig): list(v.get("problems") or []) for sig, v in waiting.items() if isinstance(v, Mapping)}


def _signature(sig: str, rows: list[dict[str, Any]], decisions: Decisions) -> SignatureSummary:
    failures: dict[str, int] = {}
    device_noise: dict[str, list[float]] = {}
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}  # (problem, candidate, device) -> latest success
    paired: dict[tuple[str, str, str], list[dict[str, Any]]] = {}  # (problem, round, call) -> its rows
    pruned: dict[str, set[str]] = {}  # problem -> candidates with a pruned row
    measured: dict[str, set[str]] = {}  # problem -> candidates with any other row
    for r in rows:
        if r["disposition"] == "pruned":  # not measured: no failure, no time, never a winner
            pruned.setdefault(r["problem_key"], set()).add(r["candidate_key"])
            continue
        if r["round"] == MODEL:  # a model's step times (farm apply's check): its decision shows it, no candidate's
            continue
        measured.setdefault(r["problem_key"], set()).add(r["candidate_key"])
        if r["round"] in (CONFIRM, VERIFY):  # paired rounds: the figures of a decision made there
            paired.setdefault((r["problem_key"], r["round"], r["call"] or ""), []).append(r)
        if not r["succeeded"]:
            failures[r["disposition"]] = failures.get(r["disposition"], 0) + 1
            continue
        if r["round"] in (CONFIRM, VERIFY):
            continue
        dev = f"{r['host']}:{r['device_index']}"
        key = (r["problem_key"], r["candidate_key"], dev)
        if key not in latest or r["measured_at"] > latest[key]["measured_at"]:
            latest[key] = r
    per_problem: dict[str, list[dict[str, Any]]] = {}
    for (pk, _, dev), r in latest.items():
        per_problem.setdefault(pk, []).append({**r, "_device": dev})
        device_noise.setdefault(dev, []).append(_noise(r))
    for at, rs in paired.items():  # the newest whole session of each, as the reducer reads it (load_confirmations)
        sessions: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            sessions.setdefault(r["session_id"], []).append(r)
        whole = [x for x in sessions.values() if len(x) >= (x[0]["session_size"] or 0)]
        newest = max(whole, key=lambda x: max(r["measured_at"] for r in x)) if whole else []
        paired[at] = [r for r in newest if r["succeeded"]]
    problems = []
    for pk, rs in per_problem.items():
        w = decisions.winners.get((sig, pk))
        if w is not None:
            stage = paired.get((pk, w.round, w.call), []) if w.round in (CONFIRM, VERIFY) else []
            problems.append(_problem(rs, w, len(pruned.get(pk, set()) - measured.get(pk, set())), stage))
    problems.sort(key=lambda p: p.name)
    devices = sorted({f"{r['host']}:{r['device_index']}" for r in rows})
    return SignatureSummary(sig, rows[0]["device_name"], devices, len(rows), problems, dict(sorted(failures.items())),
                            sum(r["tuning_ms"] or 0.0 for r in rows) / 1e3, device_noise,
                            sum(r["tuning_ms"] or 0.0 for r in rows if r["round"] == CONFIRM) / 1e3)


def _device_winners(rows: list[dict[str, Any]]) -> tuple[dict[str, tuple[float, str]], bool]:
    """Each device's fastest candidate (ms, label) among the candidates every device of the problem measured, and
    whether that compares them (two devices or more with at least two candidates in common). Candidates split
    across devices (a node lost mid-run, shards on several) are no disagreement: each device ranks its own."""
    by_device: dict[str, dict[str, float]] = {}
    for r in rows:
        mine = by_device.setdefault(r["_device"], {})
        label = _candidate(r)
        mine[label] = min(mine.get(label, math.inf), r["median_ms"])
    common = set.intersection(*(set(m) for m in by_device.values())) if by_device else set()
    compared = len(by_device) > 1 and len(common) > 1
    pool = {d: ({k: v for k, v in m.items() if k in common} if compared else m) for d, m in by_device.items()}
    return {d: min((ms, label) for label, ms in m.items()) for d, m in pool.items() if m}, compared


def _problem(rows: list[dict[str, Any]], winner: Winner, pruned: int = 0,
             stage: list[dict[str, Any]] | None = None) -> ProblemSummary:
    """One problem's summary; ``stage``: the rows of the paired session that decided it (its figures are theirs)."""
    cands: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        cands.setdefault(r["candidate_key"], []).append(r)
    by_label = {_candidate(rs[0]): rs for rs in cands.values()}
    win_rows = by_label.get(winner.label, [])
    device_best, compared = _device_winners(rows)
    win_times = [r["median_ms"] for r in win_rows] or [winner.median_ms]
    noise = statistics.median(_noise(r) for r in win_rows) if win_rows else 0.0
    sigma_w = noise * winner.median_ms
    near = 0
    for label, rs in by_label.items():
        if label == winner.label:
            continue
        other = statistics.median(r["median_ms"] for r in rs)
        sigma_c = statistics.median(_noise(r) for r in rs) * other
        band = NOISE_SIGMAS * math.sqrt(sigma_w ** 2 + sigma_c ** 2) + RELATIVE_FLOOR * winner.median_ms
        near += abs(other - winner.median_ms) <= band
    samples = {_candidate(rs[0]): [s for r in rs for s in (r["samples_ms"] or [r["median_ms"]])] for rs in cands.values()}
    if stage:  # the decision's round: its samples, its noise and its ties, not the main round's
        failed = set(winner.stage_failed)
        samples = {label: list(r["samples_ms"] or [r["median_ms"]]) for r in stage
                   if (label := _candidate(r)) not in failed}
        noise = float(noise_sigma([winner.mad_ms or 0.0])[0]) / winner.median_ms if winner.median_ms else 0.0
        near = len(winner.confirmed.ties) if winner.confirmed is not None and winner.round == CONFIRM else 0
    first = rows[0]
    return ProblemSummary(
        key=first["problem_key"], name=first["problem_name"], label=first["problem_label"], candidates=len(cands),
        winner=winner.label, winner_ms=winner.median_ms, default=winner.default or "-", default_ms=winner.default_ms,
        why=winner.why,
        noise=noise, near=near,
        device_winners={d: c for d, (_, c) in device_best.items()}, devices_compared=compared,
        spread=max(win_times) / min(win_times) if min(win_times) > 0 else 1.0,
        samples=samples, speedup=winner.speedup_over_default, interval=winner.speedup_interval, confirmation=winner.confirmed,
        call=winner.call, pruned=pruned, default_noisy=winner.default_noisy, checks=_checks(winner),
        winner_engine=winner.engine_name, winner_knobs=dict(winner.knobs), round=winner.round,
        short_where_replayed=winner.verified.verdict if winner.short_where_replayed and winner.verified else "",
        rule=winner.rule.value,
    )


def _checks(winner: Winner) -> tuple[dict[str, Any], ...]:
    """Each calling mode's decision of a problem: what was published, and what farm verify found it delivers."""
    out = []
    for w in (winner, *winner.others):
        v = w.verified
        out.append({"call": w.call or "eager", "winner": w.label, "published": w.speedup_over_default,
                    "published_interval": list(w.speedup_interval) if w.speedup_interval else None,
                    "delivered": v.delivered if v else None,
                    "delivered_interval": [v.low, v.high] if v and v.delivered is not None else None,
                    "verdict": v.verdict if v else "", "host_cpu": v.host_cpu if v else "",
                    "measured_cpus": list(w.confirmed.host_cpus) if w.confirmed else [],
                    "verified_at": v.verified_at if v else ""})
    return tuple(out)


def report_dict(report: Report) -> dict[str, Any]:
    out = []
    for s in report.signatures:
        worst = s.worst
        out.append({
            "signature": s.signature, "device_name": s.device_name, "devices": s.devices, "rows": s.rows,
            "problems": len(s.problems), "candidates_measured": sum(p.candidates for p in s.problems),
            "candidates_pruned": s.pruned,
            "failures": s.failures, "tuning_s": round(s.tuning_s, 3),
            "speedup_geomean": s.geomean_speedup, "speedup_worst": worst.speedup if worst else None,
            "speedup_worst_problem": worst.name if worst else None,
            "noisiest": [{"problem": p.name, "noise": p.noise, "winner": p.winner} for p in s.noisiest()],
            "confirmation_s": round(s.confirm_s, 3),
            "untrusted": [{"problem": p.name, "winner": p.winner, "noise": p.noise, "within_noise_of": p.near,
                           "why": p.doubt} for p in s.untrusted()],
            "disagreements": [{"problem": p.name, "device_winners": p.device_winners} for p in s.disagreements()],
            "per_problem": [{"problem": p.name, "label": p.label, "problem_key": p.key, "candidates": p.candidates,
                             "pruned": p.pruned,
                             "winner": p.winner, "winner_engine": p.winner_engine, "winner_knobs": p.winner_knobs,
                             "winner_ms": p.winner_ms, "why": p.why, "default": p.default,
                             "default_ms": p.default_ms, "speedup": p.speedup,
                             "speedup_interval": list(p.interval) if p.interval else None, "call": p.call,
                             "confirmation": p.confirmation.as_dict() if p.confirmation is not None else None,
                             "noise": p.noise, "within_noise_of": p.near, "untrusted": p.untrusted, "round": p.round,
                             "device_spread": p.spread, "decisions": list(p.checks)} for p in s.problems],
            "verified": dict(zip(("holds", "checked"), s.verified())), "cpu_notes": s.cpu_notes(),
        })
    return {"results": report.root, "signatures": out,
            "phases": report.phases.to_json() if report.phases is not None else None,
            "nodes": [n.to_json() for n in report.nodes], "waiting_for_devices": report.waiting,
            "skipped_files": [{"path": p, "reason": r} for p, r in report.skipped_files]}
