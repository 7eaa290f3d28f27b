"""The autotuning RFC's storage config: ``autotune()`` writes its rank-0 winner into an override file itself."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from farm.errors import InputError
from farm.model.problem import Problem
from farm.model.records import AutotuneResult
from farm.store.overrides.files import autotune_metadata, write_overrides
from farm.store.overrides.entries import OverrideEntry


def winner_entry(problem: Problem, winner: AutotuneResult, *, device_arch: str, **extra: Any) -> OverrideEntry:
    """The override entry recording ``winner`` for ``problem`` (rank 0, the RFC's metadata, its knobs)."""
    meta = autotune_metadata(rank=0, min_ms=winner.min_ms, avg_ms=winner.avg_ms, stddev_ms=winner.stddev_ms,
                             workspace=max(winner.workspace_size or 0, 0), mode=winner.mode.value,
                             ran_exhaustive=winner.ran_exhaustive, strategy=winner.strategy.value,
                             iterations=winner.iterations, converged=winner.converged, device=device_arch,
                             timestamp=winner.started_at, supports_exhaustive=winner.supports_exhaustive,
                             not_run_reason=winner.exhaustive_not_run_reason or None, median_time_ms=winner.median_ms,
                             problem_key=problem.key, **extra)
    return OverrideEntry.for_problem(problem, winner.engine_name, winner.knobs, meta)


@dataclass(frozen=True)
class AutotuneStorageConfig:
    """``AutotuneConfig(storage=AutotuneStorageConfig("overrides.json"))``: autotune() appends its winner to that
    file (an entry of the same problem replaced, the others kept), or with ``delete_all_existing`` rewrites the
    file with the winner alone. The file is the v2 override file a Config policy reads (HIPDNN_HEUR_CONFIG_PATH)."""

    file_path: str | Path
    delete_all_existing: bool = False

    def __post_init__(self) -> None:
        if not str(self.file_path):
            raise InputError("a file path is needed", field="storage.file_path", value=self.file_path)

    def write(self, problem: Problem, results: Sequence[AutotuneResult], device: Any) -> None:
        winner = next((r for r in results if r.succeeded), None)
        if winner is None:  # nothing succeeded: nothing written, as in the RFC
            return
        entry = winner_entry(problem, winner, device_arch=device.properties.arch, source="autotune()")
        write_overrides(self.file_path, [entry],
                        device={"signature": device.signature, "properties": device.properties.to_dict()},
                        mode="replace" if self.delete_all_existing else "append")
