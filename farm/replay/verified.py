"""What farm verify checks and finds, as values: its settings, a decision an override file records (``decisions_in``),
and a decision verified beside the direct call, with its verdict (what the file and the results record of it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from farm.errors import FarmError
from farm.model.knobs import KnobSettings, candidate_label
from farm.model.problem import Problem
from farm.store.overrides.parsing import call_choice
from farm.store.overrides.entries import OverrideFile
from farm.tuner.judging.paired import CONFIDENCE, PairedRatio

CALLS = ("eager", "graph")


@dataclass(frozen=True)
class VerifySettings:
    """How decisions are checked. A sample holds as many calls as the decision's confirmation stage's did (the
    file records it), else ``calls`` (or ``calls`` always, with ``calls_given``): back-to-back calls (eager) or
    calls in the captured graph (graph); an eager sample fewer when it would last longer than ``sample_ms``
    (None: 50 ms on a GPU, 20 ms on a CPU). ``rounds`` paired rounds, the order drawn anew each round, up to three
    times as many where the verdict is not clear of the noise."""

    calls: int = 400
    rounds: int = 9
    sample_ms: float | None = None
    min_delivered: float = 0.99
    max_gap: float = 0.05
    seed: int = 0
    calls_given: bool = False  # ``calls`` over the calls a sample the file records for a decision
    # a decision's replay beside the direct call ends within this (None: unbounded); one that does not hangs where
    # it is replayed: fixed (the default published), and the decisions after it are not replayed
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        from farm.errors import InputError

        for name, low in (("calls", 1), ("rounds", 2)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise InputError(f"must be an integer >= {low}", field=name, value=v)
        if self.sample_ms is not None and not (isinstance(self.sample_ms, (int, float)) and self.sample_ms > 0):
            raise InputError("must be a number of milliseconds > 0", field="sample_ms", value=self.sample_ms)
        if not 0 < self.min_delivered <= 10:
            raise InputError("must be a ratio > 0, e.g. 0.99", field="min_delivered", value=self.min_delivered)
        if not 0 < self.max_gap < 1:
            raise InputError("must be a fraction in (0, 1), e.g. 0.05", field="max_gap", value=self.max_gap)
        t = self.timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
            raise InputError("must be a positive, finite number of seconds", field="candidate_timeout", value=t)


@dataclass(frozen=True)
class Decision:
    """One published decision: a problem, the calling mode it is for, what runs, and what was published."""

    problem: Problem
    name: str  # the problem's name in the file (its workload's), else its label
    call: str  # eager | graph
    engine_name: str
    knobs: KnobSettings
    published: float | None  # the speed-up over the default the file records for this mode (1.0: the default)
    interval: tuple[float, float] | None
    measured_cpus: tuple[str, ...] = ()  # the host CPU models the decision was measured on, where recorded
    input_sets: int | None = None  # the input sets its confirmation stage rotated over, where recorded
    entry_index: int = -1
    calls_per_sample: int | None = None  # the calls a sample of its confirmation stage held, where recorded
    default_failed: str = ""  # its stage found the default failing (why): there is no direct call to replay beside

    @property
    def label(self) -> str:
        return candidate_label(self.engine_name, self.knobs)


@dataclass(frozen=True)
class Verified:
    """A decision replayed beside the direct call, and the verdict."""

    decision: Decision
    signature: str
    host_cpu: str
    replayed: str = ""  # the candidate farm.ops ran
    direct: str = ""  # what the direct side called ("torch.matmul(A, B)")
    direct_engine: str = ""  # the default engine (the direct call's)
    direct_path: str = ""  # "direct", or "plan" where the default engine has no direct call
    delivered: PairedRatio | None = None  # the paired ratio farm.ops / direct (its ``speedup``: direct / farm.ops)
    replay_samples: tuple[float, ...] = ()
    direct_samples: tuple[float, ...] = ()
    calls_per_sample: int = 0
    input_sets: int = 0
    flagged: str = ""  # why the decision does not hold ('' when it does)
    skipped: str = ""  # why it was not measured
    notes: tuple[str, ...] = ()
    fixable: bool = False  # flagged, and not the default already: publishing the default changes something
    loses: bool = False  # flagged for losing to the direct call (or running another candidate), not only its figure
    fixed: bool = False
    corrected: bool = False  # flagged for its figure alone while it beats the direct call beyond noise: --fix
    hung: bool = False  # its replay did not end within the candidate timeout (VerifySettings.timeout_s)
    after_hang: bool = False  # not replayed: an earlier replay in the same process hung (a new process replays it)
    # records the delivered figure instead of undoing the decision
    measured_at: str = ""

    @property
    def delivered_speedup(self) -> float | None:
        return self.delivered.speedup if self.delivered is not None and self.delivered.rounds else None

    @property
    def ratio_to_published(self) -> float | None:
        d, p = self.delivered_speedup, self.decision.published
        return d / p if d is not None and p else None

    @property
    def verdict(self) -> str:
        if self.skipped:
            return f"not verified: {self.skipped}"
        if not self.flagged:
            return "holds"
        if self.corrected:
            return (f"corrected: {self.flagged}; it still beats the direct call beyond noise, so it stays and its "
                    f"published figure is now the delivered {self.delivered_speedup:.3f}x")
        return f"{'fixed' if self.fixed else 'flagged'}: {self.flagged}"

    def as_dict(self) -> dict[str, Any]:
        d = self.delivered
        return {"problem": self.decision.name, "problem_key": self.decision.problem.key, "call": self.decision.call,
                "published_winner": self.decision.label, "replayed": self.replayed, "direct": self.direct,
                "published": self.decision.published,
                "published_interval": list(self.decision.interval) if self.decision.interval else None,
                "delivered": self.delivered_speedup,
                "delivered_interval": [d.speedup_low, d.speedup_high] if d is not None and d.rounds else None,
                "rounds": d.rounds if d is not None else 0, "calls_per_sample": self.calls_per_sample,
                "input_sets": self.input_sets, "replay_ms": median_of(self.replay_samples),
                "direct_ms": median_of(self.direct_samples), "verdict": self.verdict, "flagged": self.flagged,
                "fixed": self.fixed, "corrected": self.corrected, "host_cpu": self.host_cpu,
                "measured_cpus": list(self.decision.measured_cpus),
                "notes": list(self.notes), "signature": self.signature}

    def metadata(self) -> dict[str, Any]:
        """What the override file records of this check (``selection.verified``)."""
        d = self.delivered
        return {"call": self.decision.call, "published": self.decision.published,
                "delivered": self.delivered_speedup,
                "interval": [d.speedup_low, d.speedup_high] if d is not None and d.rounds else None,
                "rounds": d.rounds if d is not None else 0, "confidence": CONFIDENCE,
                "calls_per_sample": self.calls_per_sample, "input_sets": self.input_sets,
                "direct_call": self.direct, "verdict": self.verdict, "host_cpu": self.host_cpu,
                "verified_at": self.measured_at}


def median_of(x: Sequence[float]) -> float | None:
    return float(np.median(x)) if len(x) else None


def decisions_in(f: OverrideFile, *, keys: Sequence[str] | None = None,
                 calls: Sequence[str] = CALLS) -> tuple[list[Decision], list[tuple[str, str]]]:
    """Every decision of ``f`` for the calling modes ``calls`` (of the problems ``keys`` when given), and
    (name, why) of the entries that cannot be replayed as one problem (wildcard or positional rules)."""
    wanted = set(keys) if keys is not None else None
    out: list[Decision] = []
    skipped: list[tuple[str, str]] = []
    for i, e in enumerate(f.entries):
        meta = e.metadata if isinstance(e.metadata, Mapping) else {}
        problem = e.problem()
        name = str(meta.get("problem_name") or (problem.label() if problem else f"engine_overrides[{i}]"))
        if problem is None:
            if wanted is None:
                skipped.append((name, "a rule of wildcards, positions or no layouts describes no one problem"))
            continue
        if wanted is not None and problem.key not in wanted and meta.get("problem_key") not in wanted:
            continue
        own_call = meta.get("call") if meta.get("call") in CALLS else "eager"
        for call in calls:
            if call == own_call:
                engine, knobs, selection = e.engine_name, tuple(e.knobs), meta.get("selection")
            else:
                try:
                    picked = call_choice(e, call)
                except FarmError as exc:
                    skipped.append((name, f"its {call} decision is malformed: {exc}"))
                    continue
                if picked is None:
                    continue
                engine, knobs = picked
                rec = (meta.get("calls") or {}).get(call) or {}
                selection = rec.get("selection") if isinstance(rec, Mapping) else None
            published, interval, cpus, sets, per_sample = _published(selection)
            conf = selection.get("confirmation") if isinstance(selection, Mapping) else None
            failed = conf.get("default_failed") if isinstance(conf, Mapping) else None
            out.append(Decision(problem, name, call, engine, canonical_knobs(engine, knobs), published, interval, cpus,
                                sets, i, per_sample, str(failed) if isinstance(failed, str) and failed else ""))
    return out, skipped


def canonical_knobs(engine_name: str, knobs: Any) -> KnobSettings:
    """A file's knobs as the engine's candidate names them, the one replay runs: a spelled-out default
    (``split_k=1``) and knobs the engine does not have (hipDNN's ``SPLIT_K``) dropped. As written where the engine
    is not known here or a value is bad (the replay says why)."""
    from farm.model.engine import default_engine_registry, known_file_knobs

    registry = default_engine_registry()
    written = tuple(sorted(knobs))
    if engine_name not in registry:
        return written
    try:
        return known_file_knobs(registry.get(engine_name), written, source="")[0]
    except FarmError:
        return written


def _published(selection: Any) -> tuple[float | None, tuple[float, float] | None, tuple[str, ...], int | None,
                                         int | None]:
    """(speed-up over the default, its interval, host CPUs, input sets, calls a sample) a file's ``selection``
    records."""
    if not isinstance(selection, Mapping):
        return None, None, (), None, None
    speedup = selection.get("speedup_over_default")
    conf = selection.get("confirmation") if isinstance(selection.get("confirmation"), Mapping) else {}
    interval = conf.get("interval")
    ok = isinstance(interval, list) and len(interval) == 2 and all(_finite(x) for x in interval)
    cpus = tuple(str(c) for c in conf.get("host_cpus") or () if isinstance(c, str))
    return (float(speedup) if _finite(speedup) and speedup > 0 else None,
            (float(interval[0]), float(interval[1])) if ok else None, cpus, _count(conf.get("input_sets")),
            _count(conf.get("calls_per_sample")))


def _count(value: Any, most: int = 1 << 16) -> int | None:
    """A positive count a file records (a value read from a file: bounded), else None."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= most else None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
