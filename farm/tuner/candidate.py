"""One candidate's working state inside an autotune() call, and small helpers both the API and the session use."""

from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass
from typing import Any

from farm.model.engine import Engine, Plan
from farm.model.plans import PlanSpec
from farm.model.records import Disposition

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
