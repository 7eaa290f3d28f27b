"""Leave-a-group-out validation of pruning (farm model eval).

The problems are split into groups (model families, ops, or device signatures); for each group a model
is trained on all the others and a pruned tune of the group's problems is replayed on their exhaustive
measurements: which candidates it would measure, which it would publish, and the regret, that pick's main-round
time over the published winner's.

The exhaustive winner is the one the reducer published for the problem (its winner rule and confirmation stage:
what every other surface names). The pruned tune publishes the same when it measured that candidate (its stage
would see the same contest); otherwise the winner rule's pick among what it measured (no stage can be replayed
for candidates the stage never met).
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
    regret: float  # the pruned pick's main-round time over the exhaustive winner's
    winner: str  # the exhaustive winner: the reducer's published one (the fastest where it published none)
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
    label = lambda i: candidate_label(p.candidates[i].engine, p.candidates[i].knobs)  # noqa: E731
    timed = [i for i in choice.measure if p.candidates[i].median_ms is not None and p.candidates[i].median_ms > 0]
    fastest = min((c.median_ms, i) for i, c in enumerate(p.candidates) if c.median_ms is not None)[1]
    # the published winner, where its time is known (a row with no usable time is no winner to measure regret by)
    winner = next((i for i in range(len(p.candidates)) if p.published and label(i) == p.published
                   and p.candidates[i].median_ms is not None), fastest)
    if not timed:  # every measured candidate failed: the tune has no winner, the worst outcome
        return HeldOut(group, p.name, p.signature, len(cands), len(choice.measure), math.inf, label(winner),
                       "(none)", choice.full)
    picked = winner if winner in timed else _rule_pick(p, timed)
    regret = p.candidates[picked].median_ms / p.candidates[winner].median_ms  # type: ignore[operator]
    return HeldOut(group, p.name, p.signature, len(cands), len(choice.measure), regret, label(winner), label(picked),
                   choice.full)


def _rule_pick(p: ProblemTimes, measured: Sequence[int]) -> int:
    """The main round's winner rule over the candidates a pruned tune measured (farm.tuner.judging.winner)."""
    import numpy as np

    from farm.tuner.judging.winner import decide_groups

    c = [p.candidates[i] for i in measured]
    first_default = next((j for j, x in enumerate(c) if x.is_default), -1)
    d = decide_groups(np.zeros(len(c), dtype=np.int64), np.array([x.median_ms for x in c], dtype=float),
                      np.array([x.mad_ms or 0.0 for x in c], dtype=float), np.array([x.index for x in c]),
                      default=np.arange(len(c)) == first_default)
    return measured[int(d.winner[0])]


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
