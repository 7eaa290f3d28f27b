"""One candidate's working state inside an autotune() call, and small helpers both the API and the session use."""

from __future__ import annotations

import datetime as _dt
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

from farm.model.engine import Engine, Plan
from farm.model.plans import PlanSpec
from farm.model.measurement import summarize
from farm.model.records import AutotuneConfig, AutotuneResult, Disposition, TuneMode

log = logging.getLogger("farm.tuner.autotuner")  # the tuner's lines


@dataclass
class CandidateRun:
    """Per-candidate working state inside one autotune() call."""

    index: int
    spec: PlanSpec
    engine: Engine | None
    estimated_workspace: int | None = None
    plan: Plan | None = None
    compile_ms: float | None = None
    error: str = ""
    disposition: Disposition | None = None
    ran_exhaustive: bool = False
    not_primed: str = ""  # EXHAUSTIVE mode: why this candidate was not primed
    note: str = ""
    started: float = 0.0
    started_at: str = ""
    spent_ms: float = 0.0


def started_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def close_plan(plan: Any) -> None:
    close = getattr(plan, "close", None)
    if callable(close):
        try:
            close()
        except Exception as exc:
            log.debug("autotune: closing a plan failed: %s", exc)


def candidate_row(cand: CandidateRun, problem_key: str, cfg: AutotuneConfig, device_name: str,
                  disposition: Disposition, *, error: str = "", workspace: int | None = None, warmups: int = 0,
                  samples: Sequence[float] = (), converged: bool = False, max_err: float | None = None) -> AutotuneResult:
    """The candidate's result row: its samples summarized, its time spent (compile and measurement) counted."""
    stats = summarize(samples)
    engine = cand.engine
    spent = cand.spent_ms + (cand.compile_ms or 0.0) + ((time.perf_counter() - cand.started) * 1e3 if cand.started else 0.0)
    return AutotuneResult(
        problem_key=problem_key,
        engine_id=cand.spec.engine_id,
        engine_name=engine.name if engine is not None else str(cand.spec.engine_id),
        knobs=cand.spec.knobs,
        disposition=disposition,
        candidate=cand.index,
        mode=cfg.mode,
        strategy=cfg.strategy,
        error=error,
        min_ms=stats.min,
        avg_ms=stats.mean,
        stddev_ms=stats.stddev,
        median_ms=stats.median,
        mad_ms=stats.mad,
        samples=tuple(float(s) for s in samples),
        iterations=len(samples),
        warmups=warmups,
        converged=converged,
        workspace_size=-1 if workspace is None else workspace,
        estimated_workspace=cand.estimated_workspace,
        ran_exhaustive=cand.ran_exhaustive,
        supports_exhaustive=bool(engine.supports_exhaustive) if engine is not None else False,
        exhaustive_not_run_reason=cand.not_primed if cfg.mode is TuneMode.EXHAUSTIVE and not cand.ran_exhaustive
        else "",
        device_name=device_name,
        max_rel_error=max_err,
        compile_ms=cand.compile_ms,
        tuning_ms=spent,
        started_at=cand.started_at,
    )


def log_finished(result: AutotuneResult, error: str) -> None:
    """A candidate's line: its times, or what it failed at (the RFC's failures at WARNING; a limit that skips a
    candidate is no failure, a deselected or filtered one only at DEBUG)."""
    disposition = result.disposition
    if disposition is Disposition.SUCCEEDED:
        log.info("autotune: %s: %.4f ms min, %.4f ms avg, %d iterations%s", result.label, result.min_ms,
                 result.avg_ms, result.iterations, ", converged" if result.converged else "")
    elif disposition in (Disposition.BARRED_BY_DESELECT, Disposition.EXCLUDED_BY_FILTER):
        log.debug("autotune: %s %s: %s", result.label, disposition.value, error)
    else:
        level = logging.INFO if disposition is Disposition.EXCEEDS_WORKSPACE_LIMIT else logging.WARNING
        log.log(level, "autotune: %s %s: %s", result.label, disposition.value, error)
