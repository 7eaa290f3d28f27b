"""The replay runtime: recorded winners first, tuning only what is missing (TunableOp-style).

Settings (environment variables are read once, at first use; bad values are
warned about and ignored; the API overrides them):

    FARM_TUNABLE_ENABLED=1                master switch: read/record a results file
    FARM_TUNABLE_TUNING=1                 measure a problem with no recorded winner (on first use)
    FARM_TUNABLE_RECORD_UNTUNED=1         append problems with no winner to an untuned workload file
    FARM_TUNABLE_VERBOSE=1                log every decision
    FARM_TUNABLE_MAX_TUNING_DURATION_MS   per-candidate time budget (default 30)
    FARM_TUNABLE_MAX_TUNING_SAMPLES       per-candidate sample budget (default 100)
    FARM_TUNABLE_FILENAME                 results file (default farm_tunable_results.json; the device
                                          ordinal goes before the extension, or where {ordinal} is)

Each is also read under the runtime tuner's own name (TP_TUNABLEOP_ENABLED, ..._TUNING, ..._RECORD_UNTUNED,
..._VERBOSE, ..._MAX_TUNING_DURATION_MS, ..._MAX_TUNING_SAMPLES, ..._FILENAME) where ours is not set: ours
win when both are. The defaults are the document's (off, tuning on, 30 ms, 100 samples; with its variables in use
and no file named, its tunableop_results<device>.csv).

With the feature on, a recorded winner runs at once. A missing one is measured
once (tuning on) and appended to the file; with tuning off the selection
policies choose (FARM_HEUR_CONFIG_PATH's file, then StaticOrdering). A recorded
winner that no longer compiles is not trusted: it is re-tuned and replaced
(tuning on) or skipped (off). A file for another device or other library
versions is set aside with a warning. The results file is an override file (the
format the farm publishes), and the untuned file is a workload (the format
``farm tune`` reads), so the loop closes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

import yaml

from farm.devices.device import Device
from farm.dispatch.binding import Bound
from farm.errors import AutotuneError, FarmError, InputError
from farm.fsutil import atomic_write_text, move_aside, read_text_file
from farm.model.engine import EngineRegistry, default_engine_registry, known_file_knobs, settings_to_resolved
from farm.model.knobs import KnobSettings, format_settings
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig
from farm.replay.selection import Selector
from farm.store.autotune_storage import winner_entry
from farm.store.overrides.parsing import call_choice, load_overrides
from farm.store.overrides.files import merge_entries, write_overrides
from farm.store.overrides.entries import OverrideEntry, OverrideFile
from farm.store.overrides.tunableop_csv import (DEFAULT_KERNEL, VALIDATORS, is_tunableop_csv, load_tunableop_csv,
                                     result_line, validator_mismatch, write_tunableop_csv)
from farm.tuner.autotuner import Autotuner

log = logging.getLogger("farm.replay.tunable_runtime")
from farm.replay.tunable_settings import DEFAULT_FILENAME, TunableSettings, parse_budget_ms, parse_budget_samples, with_ordinal


class TunableRuntime:
    """Chooses and runs the engine for each problem on one device."""

    def __init__(self, device: Device, exec_device: Device | None = None, *, settings: TunableSettings | None = None,
                 registry: EngineRegistry | None = None) -> None:
        self.device = device  # tuning measures here
        self.exec_device = exec_device or device  # chosen plans are compiled for this one (e.g. no private stream)
        self.registry = registry or default_engine_registry()
        self._settings = settings
        self._lock = threading.RLock()
        self._bound: dict[Any, Bound] = {}
        self._results: OverrideFile | None = None
        self._results_loaded = False
        self._selector: Selector | None = None
        self._untuned: set[str] = set()
        self._foreign: dict[str, str] = {}  # results files found to be another device's (path: why)
        self._warned: set[Any] = set()
        self.measurements = 0  # autotune() calls made (0 when everything replays)
        self._insert_ordinal = True  # the device ordinal goes into the results file name
        # get_filename() is empty until the file is set (here, by set_filename or the environment) or used
        self._filename_used = settings is not None and settings.filename != DEFAULT_FILENAME

    # -- settings (TunableOp's API) --------------------------------------------------------
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

    def _warn_once(self, key: Any, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def _say(self, message: str, *args: Any) -> None:
        (log.warning if self.settings.verbose else log.info)("autotune: " + message, *args)

    # -- the results file -------------------------------------------------------------------
    def read_file(self, filename: str | None = None, *, _own: bool = False) -> bool:
        """Load recorded winners. A file for another device or other library versions is left as it is (a mixed
        fleet may share its name); this device's results are then read from, and written to, ``own_file(path)``
        beside it."""
        path = filename or self._results_path()
        with self._lock:
            self._results_loaded = True
            self._filename_used = True
            if not os.path.exists(path):
                return False
            try:
                # TunableOp's CSV by its suffix; in JSON an unusable rule is skipped, not the file
                f = load_tunableop_csv(path, ordinal=self.device.properties.index) if is_tunableop_csv(path) \
                    else load_overrides(path, strict=False)
            except FarmError as exc:
                if os.path.isfile(path):  # kept for a person to look at; a later write_file would replace it
                    moved = move_aside(Path(path))
                    log.warning("autotune: results file %s unreadable (%s); moved aside to %s", path, exc, moved)
                else:
                    log.warning("autotune: results file %s unreadable (%s); ignored", path, exc)
                return False
            mismatch = self._mismatch(f)
            if mismatch:
                # a results file shared by a mixed fleet must survive every process that reads it: skipped, never
                # moved, never written into
                self._foreign[os.path.abspath(path)] = mismatch
                own = self.own_file(path)
                self._say("results file %s is for %s; not used here (this device's results: %s)", path, mismatch, own)
                return False if _own or not os.path.exists(own) else self.read_file(own, _own=True)
            if self._results is not None:  # merged into what this process has recorded
                f = dataclasses.replace(self._results, entries=merge_entries(self._results.entries, f.entries)[0])
            self._results = f
            self._bound.clear()
            return True

    def _mismatch(self, f: OverrideFile) -> str:
        if VALIDATORS in f.extra:  # read from CSV: its validators decide, as the runtime tuner's document has it
            return validator_mismatch(f, self._csv_device())
        sig = f.device_signature
        if sig and sig != self.device.signature:
            props = (f.device or {}).get("properties") or {}
            ours = self.device.properties.library_versions
            theirs = props.get("libraries") or {}
            libs = [f"{k} {theirs.get(k)} vs {v}" for k, v in ours.items() if theirs.get(k) != v]
            return f"device {sig} ({'libraries differ: ' + ', '.join(libs) if libs else 'another device'})"
        return ""

    def write_file(self, filename: str | None = None) -> None:
        with self._lock:
            entries = self._results.entries if self._results else []
            self._filename_used = True
            self._write(filename or self._results_path(), entries, "replace")

    def own_file(self, path: str) -> str:
        """Where this device's results go when ``path`` holds another device's: ``<stem>.<signature><suffix>``
        beside it (read in its place by read_file)."""
        p = Path(path)
        return str(p.with_name(f"{p.stem}.{self.device.signature}{p.suffix}"))

    def _writable(self, path: str) -> str:
        """``path``, or this device's own file beside it where ``path`` is another device's (read now if it was
        not): an append must never put this device's validators over another device's lines."""
        key = os.path.abspath(path)
        if key not in self._foreign and os.path.isfile(path):
            try:
                f = load_tunableop_csv(path, ordinal=self.device.properties.index) if is_tunableop_csv(path) \
                    else load_overrides(path, strict=False)
            except FarmError:
                return path  # unreadable: the writer moves it aside
            if mismatch := self._mismatch(f):
                self._foreign[key] = mismatch
        if key in self._foreign:
            own = self.own_file(path)
            self._say("results file %s is for %s: this device's results go to %s", path, self._foreign[key], own)
            return own
        return path

    def _write(self, path: str, entries: list[OverrideEntry], mode: str) -> None:
        """Write in the file's format: TunableOp's CSV for a ``.csv`` name (what it held otherwise kept), else JSON."""
        path = self._writable(path)
        if is_tunableop_csv(path):
            write_tunableop_csv(path, entries, device=self._csv_device(), mode=mode,
                                extra=self._results.extra if self._results is not None else None)
        else:
            write_overrides(path, entries, device=self._device_obj(), mode=mode)

    def get_results(self) -> list[tuple[str, str, str, float]]:
        """The recorded winners as the runtime tuner's API gives them: ``(op, params, kernel, time_ms)``, the fields
        of its results file's lines (``kernel``: the engine, with its knobs in brackets)."""
        self._ensure_results()
        out = []
        for e in (self._results.entries if self._results else []):
            op, params, kernel, time_ms = result_line(e, ordinal=self.device.properties.index)
            out.append((op, params, kernel, float(time_ms)))
        return out

    def results(self) -> list[dict[str, Any]]:
        """The recorded winners with our fields: op, problem key, engine, knobs, time."""
        self._ensure_results()
        return [{"op": e.op, "problem_key": (e.metadata or {}).get("problem_key"), "engine": e.engine_name,
                 "knobs": dict(e.knobs), "min_time_ms": (e.metadata or {}).get("min_time_ms")}
                for e in (self._results.entries if self._results else [])]

    def _device_obj(self) -> dict[str, Any]:
        return {"signature": self.device.signature, "properties": self.device.properties.to_dict()}

    def _csv_device(self) -> dict[str, Any]:
        """The device as its CSV validators name it: on NVIDIA, with the loaded cuBLASLt's own version number."""
        if self.device.vendor != "nvidia":
            return self._device_obj()
        from farm.devices.runtimes.cuda import loaded_cublaslt_version

        return {**self._device_obj(), "cublaslt_version": loaded_cublaslt_version()}

    def _ensure_results(self) -> None:
        if not self._results_loaded:
            self.read_file()

    # -- choosing -----------------------------------------------------------------------------
    def lookup(self, key: Any) -> Bound | None:
        return self._bound.get(key)

    def bound(self) -> list[Bound]:
        return [b for b in self._bound.values() if b is not None]

    def bind(self, key: Any, problem: Problem) -> Bound:
        """Choose the engine for ``problem`` (once per key) and compile it."""
        with self._lock:
            bound = self._bound.get(key)
            if bound is None:
                bound = self._choose(problem)
                self._bound[key] = bound
            return bound

    def bind_call(self, key: Any, problem: Problem, call: str) -> Bound | None:
        """The engine recorded for production calls of kind ``call`` ("graph": inside a captured graph), compiled;
        None when nothing records a separate decision for it (the caller runs what :meth:`bind` chose)."""
        with self._lock:
            slot = (key, call)
            if slot not in self._bound:
                self._bound[slot] = self._choose_call(problem, call)
            return self._bound[slot]

    def bind_for_ops(self, problem: Problem) -> tuple[Bound, Bound | None, Callable[[], bool] | None]:
        """What farm.ops binds a problem to (farm.dispatch's binder contract): the eager decision, the separate
        graph decision where a file records one and the device captures graphs, and the check that a graph is
        being captured (None without a separate graph decision)."""
        bound = self.bind(problem.key, problem)
        check = self.exec_device.extras.get("is_capturing")
        graph = self.bind_call(problem.key, problem, "graph") if check is not None else None
        if graph is None or (graph.engine_name, graph.knobs) == (bound.engine_name, bound.knobs):
            return bound, None, None
        probe = self.exec_device.extras.get("capture_probe")
        return bound, graph, probe(self.exec_device) if probe is not None else functools.partial(check, self.exec_device)

    def _choose_call(self, problem: Problem, call: str) -> Bound | None:
        if self.settings.enabled:
            self._ensure_results()
            entry = self._results.match(problem) if self._results else None
            if entry is not None:
                try:
                    picked = call_choice(entry, call)
                except FarmError as exc:
                    self._warn_once(("calls", id(entry), call), "autotune: %s decision for %s not used: %s", call,
                                    problem.label(), exc)
                    picked = None
                if picked is not None:
                    return self._compile(problem, picked[0], picked[1], f"recorded ({call})",
                                         origin=self._results.source if self._results else "")
        candidates = [c.engine_id for c in self.registry.discover(problem, self.device)]
        if self._selector is None:
            self._selector = Selector(self.device.properties)
        sel = self._selector.select_for_call(problem, candidates, call)
        if sel is None:
            return None
        return self._compile(problem, self.registry.get(sel.engine_id).name, sel.knobs.get(sel.engine_id, ()),
                             f"{sel.policy} ({call})")

    def _choose(self, problem: Problem) -> Bound:
        s = self.settings
        candidates = [c.engine_id for c in self.registry.discover(problem, self.device)]
        if not candidates:
            raise FarmError(f"no engine runs {problem.label()} on {self.device.properties.name}")
        if s.enabled:
            self._ensure_results()
            entry = self._results.match(problem) if self._results else None
            if entry is not None and entry.engine_name == DEFAULT_KERNEL:
                # TunableOp's "Default": the library's own choice, tuning on or off
                self._say("recorded Default for %s: the heuristic's choice", problem.label())
                return self._select(problem, candidates)
            if entry is not None:
                bound = self._compile(problem, entry.engine_name, entry.knobs, "recorded",
                                      origin=self._results.source if self._results else "")
                if bound is not None:
                    self._say("replay %s: %s[%s]", problem.label(), entry.engine_name, format_settings(entry.knobs))
                    return bound
                self._say("recorded winner %s for %s no longer compiles here; not used", entry.engine_name, problem.label())
            if s.tuning and self._capturing():
                # measuring would launch work into the graph being captured: the heuristic's choice, kept
                # for this shape for the life of the process (the graph holds it)
                self._say("%s met during graph capture: no measurement; the heuristic's choice is pinned", problem.label())
                return self._select(problem, candidates)
            if s.tuning:
                return self._tune(problem)
            if s.record_untuned:
                self._record_untuned(problem)
        return self._select(problem, candidates)

    def _capturing(self) -> bool:
        check = self.exec_device.extras.get("is_capturing")
        return bool(check is not None and check(self.exec_device))

    def _select(self, problem: Problem, candidates: list[int]) -> Bound:
        if self._selector is None:
            self._selector = Selector(self.device.properties)
        sel = self._selector.select(problem, candidates)
        for eid in sel.order:
            engine = self.registry.get(eid)
            bound = self._compile(problem, engine.name, sel.knobs.get(eid, ()), sel.policy)
            if bound is not None:
                self._say("%s chose %s for %s", sel.policy, engine.name, problem.label())
                return bound
        raise FarmError(f"no engine chosen for {problem.label()} compiles here")

    def _compile(self, problem: Problem, engine_name: str, knobs: KnobSettings, source: str,
                 origin: str = "") -> Bound | None:
        """Compile the chosen engine; ``origin`` names where its knobs were read (a file), for errors."""
        try:
            engine = self.registry.get(engine_name)
        except FarmError as exc:
            log.info("autotune: %s for %s: %s", engine_name, problem.label(), exc)
            return None
        try:
            # knobs come from files (recorded winners, override files): validated like a workload's, never run raw
            knobs, ignored = known_file_knobs(engine, tuple(knobs), source=origin or source)
        except InputError as exc:
            self._warn_once(("knobs", origin or source, engine_name, str(exc)), "autotune: %s: not used", exc)
            return None
        if ignored:
            self._warn_once(("ignored knobs", origin or source), "autotune: %s: knobs %s are not knobs of %s here: "
                            "ignored, the engine runs with its other knobs (warned once per file)",
                            origin or source, ", ".join(ignored), engine_name)
        try:
            if not engine.applicable(problem, self.exec_device):
                return None
            plan = engine.compile(problem, settings_to_resolved(engine, tuple(knobs)), self.exec_device)
        except Exception as exc:
            log.info("autotune: %s[%s] does not compile for %s: %s", engine_name, format_settings(knobs),
                     problem.label(), exc)
            return None
        size = int(getattr(plan, "workspace_size", 0) or 0)
        ws = self.device.runtime.malloc(size) if size else None
        # a production process may call one plan from several threads: each gets a workspace of its own
        return Bound(problem, engine_name, tuple(knobs), plan, ws, source,
                     alloc=functools.partial(self.device.runtime.malloc, size) if size else None)

    def _tune(self, problem: Problem) -> Bound:
        s = self.settings
        self.measurements += 1
        tuner = Autotuner(problem, self.device, registry=self.registry)
        tuner.add_all_engines()
        # a budget of 0 turns that limit off (run_until_stable's own iteration cap still stops it)
        cfg = AutotuneConfig(strategy="run_until_stable",
                             max_iterations=max(3, s.max_tuning_samples) if s.max_tuning_samples else 100,
                             max_tuning_samples=s.max_tuning_samples or None,
                             max_tuning_duration_ms=s.max_tuning_duration_ms or None)
        try:
            results = tuner.autotune(config=cfg, prepare=False)  # a library process starts no compile pool
        except AutotuneError as exc:
            tuner.close()
            raise FarmError(f"tuning {problem.label()} failed: {exc}") from None
        tuner.close()
        entry = winner_entry(problem, results[0], device_arch=self.device.properties.arch,
                             source="farm.replay.tunable_runtime")
        w = results[0]
        with self._lock:
            entries = merge_entries(self._results.entries if self._results else [], [entry])[0]
            self._results = OverrideFile(2, entries, self._device_obj(), {}, self._results_path())
            try:
                self._write(self._results_path(), [entry], "append")
            except FarmError as exc:
                log.warning("autotune: could not record %s in %s: %s", w.engine_name, self._results_path(), exc)
        self._say("tuned %s: %s[%s] %.4f ms (recorded)", problem.label(), w.engine_name, format_settings(w.knobs), w.min_ms)
        bound = self._compile(problem, w.engine_name, w.knobs, "tuned")
        if bound is None:
            raise FarmError(f"the tuned winner {w.engine_name} does not compile again for {problem.label()}")
        return bound

    def _record_untuned(self, problem: Problem) -> None:
        if problem.key in self._untuned:
            return
        self._untuned.add(problem.key)
        path = self.untuned_filename()
        doc: dict[str, Any] = {"name": "untuned", "problems": []}
        if os.path.lexists(path):
            if not os.path.isfile(path):
                log.warning("autotune: untuned file %s is not a regular file; %s not recorded", path, problem.label())
                return
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
            return
        c = problem.canonical()
        doc["problems"].append({"name": name, "op": c["op"], "compute_dtype": c["compute_dtype"],
                                "criteria": c["criteria"],
                                "tensors": {t["id"]: {"dims": t["dims"], "strides": t["strides"], "dtype": t["dtype"]}
                                            for t in c["tensors"]}})
        atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))
        self._say("untuned %s recorded in %s", problem.label(), path)
