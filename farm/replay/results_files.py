"""Where one device's results (TunableOp's results file, JSON or its CSV) are read from and written to, for the
runtime tuner (farm.replay.tunable_runtime): a file of another device or other library versions, which a mixed fleet
may share, is never moved or written into; this device's results go to ``own_file(path)`` beside it."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

from farm.devices.device import Device
import yaml

from farm.errors import FarmError, InputError
from farm.fsutil import atomic_write_text, move_aside, read_text_file
from farm.model.problem import Problem
from farm.store.overrides.entries import OverrideEntry, OverrideFile
from farm.store.overrides.files import write_overrides
from farm.store.overrides.parsing import load_overrides
from farm.store.overrides.tunableop_csv import (VALIDATORS, is_tunableop_csv, load_tunableop_csv, validator_mismatch,
                                                write_tunableop_csv)

log = logging.getLogger("farm.replay.tunable_runtime")


class DeviceResultsFiles:
    """``say(message, *args)``: how the runtime tells of a file it passes over (a warning when verbose)."""

    def __init__(self, device: Device, say: Callable[..., None]) -> None:
        self.device, self.say = device, say
        self.foreign: dict[str, str] = {}  # results files found to be another device's (path: why)

    def read(self, path: str) -> OverrideFile | None:
        """The file at ``path`` (TunableOp's CSV by its suffix; in JSON an unusable rule is skipped, not the file);
        None where there is none, or it is unreadable (then moved aside, kept for a person to look at)."""
        if not os.path.exists(path):
            return None
        try:
            return self._load(path)
        except FarmError as exc:
            if os.path.isfile(path):  # a later write would replace it
                moved = move_aside(Path(path))
                log.warning("autotune: results file %s unreadable (%s); moved aside to %s", path, exc, moved)
            else:
                log.warning("autotune: results file %s unreadable (%s); ignored", path, exc)
            return None

    def _load(self, path: str) -> OverrideFile:
        if is_tunableop_csv(path):
            return load_tunableop_csv(path, ordinal=self.device.properties.index)
        return load_overrides(path, strict=False)

    def mismatch(self, f: OverrideFile) -> str:
        """Why ``f`` is not this device's results ('' when it is)."""
        if VALIDATORS in f.extra:  # read from CSV: its validators decide, as the runtime tuner's document has it
            return validator_mismatch(f, self.csv_device())
        sig = f.device_signature
        if sig and sig != self.device.signature:
            props = (f.device or {}).get("properties") or {}
            ours = self.device.properties.library_versions
            theirs = props.get("libraries") or {}
            libs = [f"{k} {theirs.get(k)} vs {v}" for k, v in ours.items() if theirs.get(k) != v]
            return f"device {sig} ({'libraries differ: ' + ', '.join(libs) if libs else 'another device'})"
        return ""

    def own_file(self, path: str) -> str:
        """Where this device's results go when ``path`` holds another device's: ``<stem>.<signature><suffix>``
        beside it (read in its place by read_file)."""
        p = Path(path)
        return str(p.with_name(f"{p.stem}.{self.device.signature}{p.suffix}"))

    def writable(self, path: str) -> str:
        """``path``, or this device's own file beside it where ``path`` is another device's (read now if it was
        not): an append must never put this device's validators over another device's lines."""
        key = os.path.abspath(path)
        if key not in self.foreign and os.path.isfile(path):
            try:
                f = self._load(path)
            except FarmError:
                return path  # unreadable: the writer moves it aside
            if mismatch := self.mismatch(f):
                self.foreign[key] = mismatch
        if key in self.foreign:
            own = self.own_file(path)
            self.say("results file %s is for %s: this device's results go to %s", path, self.foreign[key], own)
            return own
        return path

    def write(self, path: str, entries: list[OverrideEntry], mode: str, extra: dict[str, Any] | None = None) -> None:
        """Write in the file's format: TunableOp's CSV for a ``.csv`` name (what it held otherwise kept), else JSON."""
        path = self.writable(path)
        if is_tunableop_csv(path):
            write_tunableop_csv(path, entries, device=self.csv_device(), mode=mode,
                                extra=extra)
        else:
            write_overrides(path, entries, device=self.device_obj(), mode=mode)

    def device_obj(self) -> dict[str, Any]:
        return {"signature": self.device.signature, "properties": self.device.properties.to_dict()}

    def csv_device(self) -> dict[str, Any]:
        """The device as its CSV validators name it: on NVIDIA, with the loaded cuBLASLt's own version number."""
        if self.device.vendor != "nvidia":
            return self.device_obj()
        from farm.devices.runtimes.cuda import loaded_cublaslt_version

        return {**self.device_obj(), "cublaslt_version": loaded_cublaslt_version()}


def append_untuned(path: str, problem: Problem) -> bool:
    """``problem`` added to the untuned workload file at ``path`` (one a later farm tune takes); False where it is
    there already or the path is not a regular file. An unreadable file is moved aside, never overwritten."""
    doc: dict[str, Any] = {"name": "untuned", "problems": []}
    if os.path.lexists(path):
        if not os.path.isfile(path):
            log.warning("autotune: untuned file %s is not a regular file; %s not recorded", path, problem.label())
            return False
        try:
            loaded = yaml.safe_load(read_text_file(path, "untuned file"))
            if not (isinstance(loaded, dict) and isinstance(loaded.get("problems"), list)
                    and all(isinstance(p, dict) for p in loaded["problems"])):
                raise ValueError("not a workload with a problems list")
            doc = loaded
        except (InputError, yaml.YAMLError, ValueError, RecursionError) as exc:
            moved = move_aside(Path(path))  # never overwritten: someone may want what was there
            log.warning("autotune: untuned file %s unreadable (%s); moved aside to %s",
                        path, str(exc).splitlines()[0], moved)
    names = {p.get("name") for p in doc["problems"] if isinstance(p, dict)}
    name = f"{problem.op}-{problem.key}"
    if name in names:
        return False
    c = problem.canonical()
    doc["problems"].append({"name": name, "op": c["op"], "compute_dtype": c["compute_dtype"],
                            "criteria": c["criteria"],
                            "tensors": {t["id"]: {"dims": t["dims"], "strides": t["strides"], "dtype": t["dtype"]}
                                        for t in c["tensors"]}})
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))
    return True
