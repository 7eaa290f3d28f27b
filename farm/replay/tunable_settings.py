"""The replay runtime's settings: FARM_TUNABLE_* environment variables, checked, and the per-device file name."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger("farm.replay.tunable_runtime")


ENV_PREFIX = "FARM_TUNABLE_"
# the runtime tuner's design document's names, read where ours are not set (ours win when both are)
DOCUMENT_ENV = {"enabled": "TP_TUNABLEOP_ENABLED", "tuning": "TP_TUNABLEOP_TUNING",
                "record_untuned": "TP_TUNABLEOP_RECORD_UNTUNED", "verbose": "TP_TUNABLEOP_VERBOSE",
                "max_tuning_duration_ms": "TP_TUNABLEOP_MAX_TUNING_DURATION_MS",
                "max_tuning_samples": "TP_TUNABLEOP_MAX_TUNING_SAMPLES", "filename": "TP_TUNABLEOP_FILENAME"}


DEFAULT_FILENAME = "farm_tunable_results.json"
DOCUMENT_FILENAME = "tunableop_results.csv"  # the document's default: tunableop_results<device>.csv


@dataclass(frozen=True)
class TunableSettings:
    enabled: bool = False
    tuning: bool = True
    record_untuned: bool = False
    verbose: bool = False
    max_tuning_duration_ms: float = 30.0  # per candidate; 0: no time limit
    max_tuning_samples: int = 100  # per candidate; 0: no sample limit (run_until_stable still stops)
    filename: str = DEFAULT_FILENAME

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> "TunableSettings":
        env = os.environ if environ is None else environ
        s = TunableSettings()
        changes: dict[str, Any] = {}
        for field, parse in (("enabled", _bool), ("tuning", _bool), ("record_untuned", _bool), ("verbose", _bool),
                             ("max_tuning_duration_ms", parse_budget_ms), ("max_tuning_samples", parse_budget_samples),
                             ("filename", _nonempty)):
            name = ENV_PREFIX + field.upper()
            if name not in env:
                name = DOCUMENT_ENV[field]
            if name not in env:
                continue
            try:
                changes[field] = parse(env[name])
            except ValueError as exc:
                log.warning("autotune: %s=%r ignored: %s", name, env[name], exc)
        if "filename" not in changes and any(n in env for n in DOCUMENT_ENV.values()):
            # configured by the runtime tuner's variables: its results file, in its format, by default
            changes["filename"] = DOCUMENT_FILENAME
        return dataclasses.replace(s, **changes)


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def parse_budget_ms(text: str) -> float:
    """A time budget in ms: >= 0, where 0 turns that limit off (TunableOp's meaning)."""
    v = float(text)
    if not (v >= 0 and v != float("inf")):
        raise ValueError("must be a number of milliseconds >= 0 (0: no limit)")
    return v


def parse_budget_samples(text: str) -> int:
    """A sample budget: an integer >= 0, where 0 turns that limit off."""
    v = int(text)
    if v < 0:
        raise ValueError("must be an integer >= 0 (0: no limit)")
    return v


def _nonempty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def with_ordinal(filename: str, ordinal: int) -> str:
    """``results.json`` -> ``results0.json``; ``{ordinal}`` in the name is replaced instead."""
    if "{ordinal}" in filename:
        return filename.replace("{ordinal}", str(ordinal))
    p = Path(filename)
    return str(p.with_name(f"{p.stem}{ordinal}{p.suffix}"))
