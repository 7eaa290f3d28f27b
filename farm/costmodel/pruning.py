"""Which candidates of a problem a pruned tune measures (farm tune --prune; docs/costmodel.md).

Per problem: the default, the incumbent, the ``top_k`` candidates by predicted time, and an exploration
share of the rest drawn at random (a generator seeded by the settings' seed and the problem's key, so a
run is repeatable and a resume makes the same choice). The others get a ``pruned`` row with the model's
predicted relative time. A problem outside what the model was trained on is measured in full.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from farm.costmodel.model import CostModel
from farm.model.knobs import KnobSettings
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig, AutotuneResult, Disposition, PruneSettings

log = logging.getLogger("farm.costmodel")


def choose(predicted: Sequence[float], *, keep: Sequence[int], top_k: int, explore: float, seed: int,
           key: str) -> list[int]:
    """Positions to measure: ``keep`` (the default, the incumbent), the ``top_k`` lowest predictions, and
    ``ceil(explore x the rest)`` of the others at random; sorted."""
    n = len(predicted)
    order = sorted(range(n), key=lambda i: (predicted[i], i))
    chosen = {i for i in keep if 0 <= i < n} | set(order[:top_k])
    rest = [i for i in range(n) if i not in chosen]
    draws = min(len(rest), math.ceil(explore * len(rest) - 1e-9)) if rest else 0
    if draws:
        rng = np.random.default_rng([seed, int(hashlib.sha256(key.encode()).hexdigest()[:12], 16)])
        chosen |= {rest[i] for i in rng.choice(len(rest), size=draws, replace=False)}
    return sorted(chosen)


def default_position(candidates: Sequence[tuple[str, KnobSettings]]) -> int | None:
    """The earliest candidate with default knobs: what the runtime runs with nothing tuned."""
    return next((i for i, (_, knobs) in enumerate(candidates) if not knobs), None)


@dataclass(frozen=True)
class PruneChoice:
    """One problem's decision: ``measure`` and ``pruned`` hold positions in its candidate list."""

    measure: tuple[int, ...]
    pruned: tuple[int, ...]
    predicted: tuple[float, ...] = ()  # per candidate: predicted time over the best (empty when measured in full)
    full: str = ""  # why every candidate is measured ('' when pruned)

    def rank(self, position: int) -> int:
        """The candidate's 1-based place by predicted time."""
        p = self.predicted[position]
        return 1 + sum(q < p or (q == p and i < position) for i, q in enumerate(self.predicted))


@dataclass
class PruneTally:
    """What a run pruned (job.json's ``pruning``)."""

    problems: int = 0
    candidates: int = 0
    measured: int = 0
    pruned: int = 0
    full: dict[str, dict[str, str]] = field(default_factory=dict)  # signature -> problem name -> why in full

    def to_json(self) -> dict[str, Any]:
        return {"problems": self.problems, "candidates": self.candidates, "measured": self.measured,
                "pruned": self.pruned, "measured_in_full": self.full}


class Pruner:
    """A model file loaded once, deciding problem by problem."""

    def __init__(self, settings: PruneSettings, model: CostModel | None = None) -> None:
        self.settings = settings
        self.model = model or CostModel.load(settings.model)
        self.tally = PruneTally()

    def decide(self, signature: str, name: str, problem: Problem, device: Mapping[str, Any],
               candidates: Sequence[tuple[str, KnobSettings]], *, incumbent: int | None = None) -> PruneChoice:
        """``candidates`` in discovery order; ``incumbent``: the position of the incumbent's winner."""
        n = len(candidates)
        s = self.settings
        self.tally.problems += 1
        self.tally.candidates += n
        why = self.model.outside(problem, device, [e for e, _ in candidates])
        if why:
            log.warning("autotune: %s: measured in full: %s", name, why)
            self.tally.full.setdefault(signature, {})[name] = why
            self.tally.measured += n
            return PruneChoice(tuple(range(n)), (), (), why)
        predicted = [float(x) for x in self.model.predict(problem, device, candidates)]
        keep = [i for i in (default_position(candidates), incumbent) if i is not None]
        measure = choose(predicted, keep=keep, top_k=s.top_k, explore=s.explore, seed=s.seed, key=problem.key)
        pruned = tuple(i for i in range(n) if i not in set(measure))
        self.tally.measured += len(measure)
        self.tally.pruned += len(pruned)
        log.info("autotune: %s: measuring %d of %d candidates (cost model)", name, len(measure), n)
        return PruneChoice(tuple(measure), pruned, tuple(predicted))

    def record(self) -> dict[str, Any]:
        """The settings and the model's provenance, for job.json."""
        t = self.model.training
        return {**self.settings.to_json(), "trained_on": {"runs": len(t.get("runs", ())),
                                                          "problems": t.get("problems"),
                                                          "signatures": sorted(t.get("signatures", {})),
                                                          "families": t.get("families", []),
                                                          **({"held_out": t["held_out"]} if "held_out" in t else {})}}


def pruned_result(problem_key: str, engine_id: int, engine_name: str, knobs: KnobSettings, index: int,
                  choice: PruneChoice, position: int, config: AutotuneConfig, started_at: str) -> AutotuneResult:
    """The row of a candidate not measured."""
    rel = choice.predicted[position]
    return AutotuneResult(
        problem_key=problem_key, engine_id=engine_id, engine_name=engine_name, knobs=knobs,
        disposition=Disposition.PRUNED, mode=config.mode, strategy=config.strategy, candidate=index,
        error=f"not measured: the cost model predicts {rel:.2f}x the best (place {choice.rank(position)} of "
              f"{len(choice.predicted)})", predicted_rel=rel, started_at=started_at)
