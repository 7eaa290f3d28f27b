"""TunableOp's settings API on the runtime tuner (farm.replay.tunable_runtime.TunableRuntime): enable, tuning,
recording untuned problems, verbosity, the per-candidate budget and the results file's name, each a change of the
runtime's TunableSettings (farm.replay.tunable_settings) that forgets the choices made under the old ones."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

from farm.devices.device import Device
from farm.replay.tunable_settings import TunableSettings, parse_budget_ms, parse_budget_samples, with_ordinal


class TunableOpSettings:
    """The settings half of the runtime: what it reads of the runtime is named here."""

    device: Device
    _settings: TunableSettings | None
    _lock: threading.RLock
    _bound: dict[Any, Any]
    _results_loaded: bool
    _insert_ordinal: bool
    _filename_used: bool

    @property
    def settings(self) -> TunableSettings:
        if self._settings is None:
            self._settings = TunableSettings.from_env()
        return self._settings

    def _set(self, **changes: Any) -> None:
        self._settings = dataclasses.replace(self.settings, **changes)

    def configure(self, **changes: Any) -> None:
        """Change settings; choices made so far are forgotten (they may depend on them)."""
        with self._lock:
            if "filename" in changes:
                self._results_loaded = False
            self._set(**changes)
            self._bound.clear()

    def enable(self, on: bool = True) -> None:
        self._set(enabled=on)

    def disable(self) -> None:
        self.enable(False)

    def is_enabled(self) -> bool:
        return self.settings.enabled

    def tuning_enable(self, on: bool = True) -> None:
        self._set(tuning=on)

    def tuning_disable(self) -> None:
        self.tuning_enable(False)

    def tuning_is_enabled(self) -> bool:
        return self.settings.tuning

    def record_untuned_enable(self, on: bool = True) -> None:
        self._set(record_untuned=on)

    def record_untuned_disable(self) -> None:
        self.record_untuned_enable(False)

    def record_untuned_is_enabled(self) -> bool:
        return self.settings.record_untuned

    def set_verbose(self, on: bool = True) -> None:
        self._set(verbose=on)

    def is_verbose(self) -> bool:
        return self.settings.verbose

    def set_max_tuning_duration(self, ms: float) -> None:
        """Per candidate, in ms; 0 turns the time limit off."""
        self._set(max_tuning_duration_ms=parse_budget_ms(str(ms)))

    def get_max_tuning_duration(self) -> float:
        return self.settings.max_tuning_duration_ms

    def set_max_tuning_samples(self, samples: int) -> None:
        """Per candidate; 0 turns the sample limit off."""
        self._set(max_tuning_samples=parse_budget_samples(str(samples)))

    def get_max_tuning_samples(self) -> int:
        return self.settings.max_tuning_samples

    # PyTorch TunableOp's names of the same setting
    set_max_tuning_iterations = set_max_tuning_samples
    get_max_tuning_iterations = get_max_tuning_samples

    def set_filename(self, filename: str, insert_device_ordinal: bool = True) -> None:
        self._set(filename=filename if insert_device_ordinal else filename.replace("{ordinal}", ""))
        self._results_loaded = False
        self._insert_ordinal = insert_device_ordinal
        self._filename_used = True

    def get_filename(self) -> str:
        """The results file: empty until set (set_filename, FARM_TUNABLE_FILENAME) or first used (TunableOp's API)."""
        named = "FARM_TUNABLE_FILENAME" in os.environ or "TP_TUNABLEOP_FILENAME" in os.environ
        return self._results_path() if self._filename_used or named else ""

    def _results_path(self) -> str:
        if self._insert_ordinal:
            return with_ordinal(self.settings.filename, self.device.index)
        return self.settings.filename

    def untuned_filename(self) -> str:
        """Beside the results file, never the same file whatever it is named."""
        p = Path(self._results_path())
        stem = p.stem.replace("results", "untuned")
        if stem == p.stem:
            stem = f"{p.stem}.untuned"
        return str(p.with_name(stem + ".yaml"))
