"""SelectionHeuristic::StaticOrdering: a fixed, documented order that never declines.

Engines the engine registry knows come first, by their declared ``priority``
(lower first: the vendor library or framework default path, e.g.
torch.matmul 10, torch.blas 20, triton.gemm 50; cpu.matmul.blas 10), then by
name; engines it does not know keep their given order after those.
"""

from __future__ import annotations

from typing import Sequence

from farm.plugin import (
    POLICY_API_VERSION,
    STATIC_ORDERING,
    default_engine_registry,
    engine_id,
    engine_priority,
    policy_name_to_id,
)


class _Session:
    def __init__(self) -> None:
        registry = default_engine_registry()
        self.rank = {}
        for e in registry:
            self.rank[engine_id(e)] = (engine_priority(e), e.name)

    def order(self, candidates: Sequence[int], problem: bytes) -> list[int]:
        known = sorted((c for c in candidates if c in self.rank), key=lambda c: self.rank[c])
        return known + [c for c in candidates if c not in self.rank]


class StaticOrderingPolicy:
    name = STATIC_ORDERING
    id = policy_name_to_id(STATIC_ORDERING)
    api_version = POLICY_API_VERSION

    def session(self, device_properties: bytes) -> _Session:
        return _Session()


POLICIES = (StaticOrderingPolicy(),)
