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
from typing import Any, Callable


from farm.devices.device import Device
from farm.dispatch.binding import Bound
from farm.errors import AutotuneError, FarmError, InputError
from farm.model.engine import EngineRegistry, default_engine_registry, known_file_knobs, settings_to_resolved
from farm.model.knobs import KnobSettings, format_settings
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig
from farm.replay.results_files import DeviceResultsFiles, append_untuned
from farm.replay.selection import Selector
from farm.replay.tunable_api import TunableOpSettings
from farm.store.autotune_storage import winner_entry
from farm.store.overrides.parsing import call_choice
from farm.store.overrides.files import merge_entries
from farm.store.overrides.entries import OverrideFile
from farm.store.overrides.tunableop_csv import (DEFAULT_KERNEL, result_line)
from farm.tuner.autotuner import Autotuner

log = logging.getLogger("farm.replay.tunable_runtime")
from farm.replay.tunable_settings import DEFAULT_FILENAME, TunableSettings


class TunableRuntime(TunableOpSettings):
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
        self.files = DeviceResultsFiles(device, self._say)  # where this device's results are read and written
        self._warned: set[Any] = set()
        self.measurements = 0  # autotune() calls made (0 when everything replays)
        self._insert_ordinal = True  # the device ordinal goes into the results file name
        # get_filename() is empty until the file is set (here, by set_filename or the environment) or used
        self._filename_used = settings is not None and settings.filename != DEFAULT_FILENAME

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
            f = self.files.read(path)
            if f is None:
                return False
            mismatch = self.files.mismatch(f)
            if mismatch:
                # a results file shared by a mixed fleet must survive every process that reads it: skipped, never
                # moved, never written into
                self.files.foreign[os.path.abspath(path)] = mismatch
                own = self.own_file(path)
                self._say("results file %s is for %s; not used here (this device's results: %s)", path, mismatch, own)
                return False if _own or not os.path.exists(own) else self.read_file(own, _own=True)
            if self._results is not None:  # merged into what this process has recorded
                f = dataclasses.replace(self._results, entries=merge_entries(self._results.entries, f.entries)[0])
            self._results = f
            self._bound.clear()
            return True

    def write_file(self, filename: str | None = None) -> None:
        with self._lock:
            entries = self._results.entries if self._results else []
            self._filename_used = True
            self.files.write(filename or self._results_path(), entries, "replace", self._extra())

    def own_file(self, path: str) -> str:
        """Where this device's results go when ``path`` holds another device's (farm.replay.results_files)."""
        return self.files.own_file(path)

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

    def _extra(self) -> dict[str, Any] | None:
        """What the results file held beyond its entries (a CSV's validators), kept when it is written again."""
        return self._results.extra if self._results is not None else None

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
            self._results = OverrideFile(2, entries, self.files.device_obj(), {}, self._results_path())
            try:
                self.files.write(self._results_path(), [entry], "append", self._extra())
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
        if append_untuned(path, problem):
            self._say("untuned %s recorded in %s", problem.label(), path)
