"""Where the devices' time went in a farm run, as job.json records it (farm.tuner.phases): per worker and in
total, with the reading a person wants first: how far the run is from "every device measuring all the time"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from farm.tuner.phases import MEASURE, PHASES, PhaseSplit


@dataclass(frozen=True)
class WorkerPhases:
    name: str
    signature: str
    host: str
    split: PhaseSplit


@dataclass(frozen=True)
class RunPhases:
    """One run's split: each worker's, over ``tuning_s`` (the window from the workers' start to the last result)."""

    run_id: str
    tuning_s: float
    workers: tuple[WorkerPhases, ...]
    recorded_total: PhaseSplit | None = None  # job.json's own sum (unrounded when it was made): shown as written

    @property
    def total(self) -> PhaseSplit:
        if self.recorded_total is not None:
            return self.recorded_total
        out = PhaseSplit()
        for w in self.workers:
            out = out + w.split
        return out

    def overhead(self) -> list[tuple[str, float]]:
        """The phases other than measuring, largest first, as fractions of all device time."""
        total = self.total
        whole = total.total
        if whole <= 0:
            return []
        rest = [(p, total.get(p) / whole) for p in PHASES if p != MEASURE and total.get(p) > 0]
        return sorted(rest, key=lambda x: -x[1])

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tuning_s": round(self.tuning_s, 3), "total": self.total.to_json(),
                "workers": [{"name": w.name, "signature": w.signature, "host": w.host, "phases": w.split.to_json()}
                            for w in self.workers]}


def run_phases(record: Any) -> RunPhases | None:
    """The latest run of a job record (job.json's object) that has a phase split; None when none has."""
    runs = record.get("runs") if isinstance(record, Mapping) else None
    for run in reversed(runs if isinstance(runs, list) else []):
        if not isinstance(run, Mapping) or not isinstance(run.get("workers"), list):
            continue
        workers = [w for w in run["workers"] if isinstance(w, Mapping) and isinstance(w.get("phases"), Mapping)]
        if not workers:
            continue
        info = run.get("phases") if isinstance(run.get("phases"), Mapping) else {}
        tuning = info.get("tuning_s")
        return RunPhases(str(run.get("run_id", "")), float(tuning) if isinstance(tuning, (int, float)) else 0.0,
                         tuple(WorkerPhases(str(w.get("name", "?")), str(w.get("signature", "")), str(w.get("host", "")),
                                            PhaseSplit.from_json(w["phases"])) for w in workers),
                         PhaseSplit.from_json(info["total"]) if isinstance(info.get("total"), Mapping) else None)
    return None


def from_statuses(run_id: str, tuning_s: float, statuses: Sequence[Any]) -> RunPhases:
    """A run's split from the driver's worker statuses (farm tune's own summary)."""
    return RunPhases(run_id, tuning_s, tuple(WorkerPhases(s.name, s.signature, s.host, s.phases) for s in statuses))

