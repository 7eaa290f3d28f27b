"""Leave-a-group-out validation of pruning (farm model eval).

The problems are split into groups (model families, ops, or device signatures); for each group a model
is trained on all the others and a pruned tune of the group's problems is replayed on their exhaustive
measurements: which candidates it would measure, which it would pick (the fastest it measured), and the
regret, that pick's time over the fastest of all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from farm.costmodel.examples import ProblemTimes, TrainingSet
from farm.costmodel.model import CostModel
from farm.costmodel.pruning import Pruner
from farm.errors import InputError
from farm.model.knobs import candidate_label
from farm.model.records import PruneSettings

HOLDOUTS = ("family", "op", "signature")
GOOD_REGRET = 1.02


def group_of(p: ProblemTimes, holdout: str) -> str:
    return {"family": p.family, "op": p.problem.op, "signature": p.signature}[holdout]


@dataclass(frozen=True)
class HeldOut:
    """One held-out problem's replayed pruned tune."""

    group: str
    name: str
    signature: str
    candidates: int
    measured: int
    regret: float  # the pruned pick's measured time over the exhaustive winner's
    winner: str  # the exhaustive winner (fastest measured)
    picked: str  # the pruned tune's
    full: str = ""  # why it was measured in full ('' when pruned)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "problem": self.name, "signature": self.signature,
                "candidates": self.candidates, "measured": self.measured, "regret": round(self.regret, 5),
                "winner": self.winner, "picked": self.picked, "measured_in_full": self.full}


@dataclass(frozen=True)
class Evaluation:
    holdout: str
    settings: PruneSettings
    problems: tuple[HeldOut, ...]
    groups: int

    @property
    def candidates(self) -> int:
        return sum(p.candidates for p in self.problems)

    @property
    def measured(self) -> int:
        return sum(p.measured for p in self.problems)

    @property
    def fewer(self) -> float:
        """How many times fewer measurements than exhaustive."""
        return self.candidates / self.measured if self.measured else math.inf

    @property
    def within(self) -> float:
        """The share of problems with regret <= 1.02."""
        return sum(p.regret <= GOOD_REGRET for p in self.problems) / len(self.problems) if self.problems else 0.0

    @property
    def geomean(self) -> float:
        if not self.problems:
            return math.nan
        return math.exp(sum(math.log(p.regret) for p in self.problems) / len(self.problems))

    @property
    def worst(self) -> HeldOut | None:
        return max(self.problems, key=lambda p: p.regret, default=None)

    def summary(self) -> str:
        w = self.worst
        return (f"{len(self.problems)} problem(s) in {self.groups} held-out {self.holdout} group(s): "
                f"{self.measured} of {self.candidates} candidates measured ({self.fewer:.1f}x fewer); "
                f"regret <= {GOOD_REGRET} on {100 * self.within:.0f} %, geomean {self.geomean:.4f}, "
                f"worst {w.regret:.3f} ({w.name})" if w else "no problem to evaluate")

    def to_json(self) -> dict[str, Any]:
        w = self.worst
        return {"holdout": self.holdout, "settings": {k: v for k, v in self.settings.to_json().items() if k != "model"},
                "groups": self.groups, "problems": [p.to_json() for p in self.problems],
                "summary": {"problems": len(self.problems), "candidates": self.candidates, "measured": self.measured,
                            "fewer": round(self.fewer, 3), "within_1_02": round(self.within, 4),
                            "geomean_regret": round(self.geomean, 5),
                            "worst": {"problem": w.name, "regret": round(w.regret, 5)} if w else None}}


def replay_pruned(p: ProblemTimes, pruner: Pruner, group: str) -> HeldOut:
    """The pruned tune of ``p`` as its exhaustive measurements say it would have gone."""
    cands = [(c.engine, c.knobs) for c in p.candidates]
    choice = pruner.decide(p.signature, p.name, p.problem, p.device, cands)
    timed = [(p.candidates[i].median_ms, i) for i in choice.measure if p.candidates[i].median_ms is not None]
    best = min((c.median_ms, i) for i, c in enumerate(p.candidates) if c.median_ms is not None)
    label = lambda i: candidate_label(p.candidates[i].engine, p.candidates[i].knobs)  # noqa: E731
    if timed:
        picked_ms, picked = min(timed)
        regret = picked_ms / best[0]
    else:  # every measured candidate failed: the tune has no winner, the worst outcome
        picked, regret = -1, math.inf
    return HeldOut(group, p.name, p.signature, len(cands), len(choice.measure), regret, label(best[1]),
                   label(picked) if picked >= 0 else "(none)", choice.full)


def evaluate(data: TrainingSet, holdout: str, settings: PruneSettings, *, rounds: int = 600,
             progress: Callable[[str, int, int], None] | None = None) -> Evaluation:
    """Hold each group out in turn: train on the rest, replay a pruned tune of the group's problems."""
    if holdout not in HOLDOUTS:
        raise InputError(f"expected one of {', '.join(HOLDOUTS)}", field="--holdout", value=holdout)
    groups: dict[str, list[ProblemTimes]] = {}
    for p in data.problems:
        groups.setdefault(group_of(p, holdout), []).append(p)
    if len(groups) < 2:
        raise InputError(f"the data holds one {holdout} group ({next(iter(groups), 'none')}): nothing to hold out",
                         field="--holdout", value=holdout)
    out: list[HeldOut] = []
    for n, (group, held) in enumerate(sorted(groups.items()), 1):
        if progress is not None:
            progress(group, n, len(groups))
        rest: Sequence[ProblemTimes] = [p for p in data.problems if group_of(p, holdout) != group]
        model = CostModel.train(rest, rounds=rounds, seed=settings.seed)
        pruner = Pruner(settings, model)
        out.extend(replay_pruned(p, pruner, group) for p in held)
    return Evaluation(holdout, settings, tuple(out), len(groups))
