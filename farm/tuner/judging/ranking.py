"""The order an autotune() call returns its results in.

Successes first, ranked by the winner rule (farm.tuner.judging.winner) or by a user's ranking
function, then the failures.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Sequence

from farm.model.records import AutotuneResult
from farm.tuner.judging.winner import decide

log = logging.getLogger("farm.tuner.autotuner")  # the tuner's lines


def _default_order(results: list[AutotuneResult]) -> list[AutotuneResult]:
    """The farm's winner rule (farm.tuner.judging.winner): the faster median wins; the default candidate is kept within noise."""
    if not results:
        return []
    med = [r.median_ms if r.median_ms is not None else (r.min_ms if r.min_ms is not None else float("inf"))
           for r in results]
    d = decide(med, [r.mad_ms or 0.0 for r in results], [r.candidate for r in results],
               default=_earliest_default(results))
    return [results[i] for i in d.ranked]


def _earliest_default(results: Sequence[AutotuneResult]) -> list[bool]:
    defaults = [r.candidate for r in results if not r.knobs]
    first = min(defaults) if defaults else None
    return [not r.knobs and r.candidate == first for r in results]


def _fastest_order(results: list[AutotuneResult]) -> list[AutotuneResult]:
    """The autotuning RFC's ranking: the lowest minimum time first (discovery order breaks a tie)."""
    inf = float("inf")
    return sorted(results, key=lambda r: (r.min_ms if r.min_ms is not None else inf, r.candidate))


def rank_results(results: list[AutotuneResult], ranking_fn: Callable[[list[AutotuneResult]], Any] | None,
          ranking: str = "winner_rule") -> list[AutotuneResult]:
    ok = [r for r in results if r.succeeded]
    failed = [r for r in results if not r.succeeded]
    ordered = _fastest_order(ok) if ranking == "fastest" else _default_order(ok)
    if ranking_fn is not None and ok:
        proposal = list(ordered)
        try:
            returned = ranking_fn(proposal)
            candidate = list(returned) if returned is not None else proposal
            if sorted(map(id, candidate)) != sorted(map(id, ordered)):
                raise ValueError("the ranking function must only reorder the results it was given")
            ordered = candidate
        except Exception as exc:
            log.warning("autotune: ranking function failed (%s); ranked by the winner rule instead", f"{type(exc).__name__}: {exc}")
    ranked = [replace(r, rank=i) for i, r in enumerate(ordered)]
    return ranked + [replace(r, rank=-1) for r in failed]
