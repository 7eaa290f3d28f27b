"""SelectionHeuristic::Config: the engine an override file names for the problem goes first.

The file is FARM_HEUR_CONFIG_PATH (HIPDNN_HEUR_CONFIG_PATH is accepted too): an
override file, or the root of a published tree (farm publish), where the file
for this device is looked up. It is read again only when it changes (size,
mtime, inode), and matches are memoised per problem, so a steady-state
selection is a few dictionary lookups. The policy declines, and says why in the
log once, when: the variable is unset, the file is missing or unparsable, the
problem bytes are malformed, nothing matches, the matched engine is not a
candidate, or the file is for another device signature. A path that gives no
file this device can use (missing, unreadable, another device's) costs every
tuned winner: that is one WARNING per process and path, whatever the number of
devices or sessions; ``farm policies`` shows the path in force and whether it loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import stat
import threading
import time
from typing import Any, Sequence

from farm.plugin import (
    CONFIG,
    POLICY_API_VERSION,
    Choice,
    FarmError,
    call_choice,
    FlatBufferError,
    OverrideFile,
    decode_device_properties,
    decode_problem,
    engine_name_to_id,
    load_overrides,
    policy_name_to_id,
)

log = logging.getLogger("farm.policies.config")
PATH_ENVS = ("FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH")
REMOTE_REFRESH_S = 60.0


class _SaidOnce:
    """The registry of warnings this process has given (one per message and path, over every session)."""

    def __init__(self) -> None:
        self._said: set[tuple[str, Any]] = set()
        self._lock = threading.Lock()

    def first(self, message: str, key: Any) -> bool:
        with self._lock:
            if (message, key) in self._said:
                return False
            self._said.add((message, key))
            return True


WARNINGS = _SaidOnce()


def config_path() -> str | None:
    """The first of PATH_ENVS that holds a path; surrounding whitespace (a stray newline from a shell) is trimmed."""
    for name in PATH_ENVS:
        value = (os.environ.get(name) or "").strip()
        if value:
            return value
    return None


@functools.lru_cache(maxsize=8192)
def _problem(buf: bytes) -> Any:
    return decode_problem(buf)


_engine_id = functools.lru_cache(maxsize=4096)(engine_name_to_id)


class _Session:
    def __init__(self, device_properties: bytes) -> None:
        self.props = decode_device_properties(device_properties)
        self.signature = self.props.signature  # computed once: it hashes the properties
        self._file: OverrideFile | None = None
        self._stamp: tuple[Any, ...] | None = None
        self._root: tuple[Any, str | None] | None = None  # (index.json stamp, file) of a published root
        self._from_root = False  # the file came from a published root (same-arch fallbacks allowed)
        self._said: set[tuple[str, Any]] = set()
        self.why = ""  # the last reason the file could not be used here ("" when it could)
        self.note = ""  # what the file found for this device differs in (another thread count, another signature)
        # id(entry) -> (entry, its knobs checked, or None: declined): an entry is checked once, not every call
        self._knobs: dict[int, tuple[Any, Any]] = {}

    def _once(self, key: Any, message: str, *args: Any, level: int = logging.INFO) -> None:
        if (message, key) not in self._said:
            self._said.add((message, key))
            log.log(level, "autotune: Config " + message, *args)

    def _unusable(self, key: Any, message: str, *args: Any) -> None:
        """The configured path gives nothing this device can use: a WARNING once per process and path."""
        self.why = message % args
        if WARNINGS.first(message, key):
            log.warning("autotune: Config %s: no tuned winner from it is used", self.why)

    def _valid_knobs(self, entry: Any, source: str) -> Any:
        """The entry's knobs validated like a workload's, or None: declined, with one warning per entry. An engine
        this process does not know (hipDNN's MIOPEN_ENGINE...) is matched by id as hipDNN does; its knobs pass
        through unchecked to whoever owns that engine (docs/policies.md)."""
        from farm.plugin import default_engine_registry, known_file_knobs

        registry = default_engine_registry()
        if entry.engine_name not in registry:
            self._once((source, entry.engine_name), "selects %s by its id: this process does not know that engine, so "
                       "its knobs go to whoever owns it unchecked", entry.engine_name)
            return tuple(entry.knobs)
        try:
            knobs, ignored = known_file_knobs(registry.get(entry.engine_name), entry.knobs, source=source)
        except FarmError as exc:
            key = ("knobs", source, str(exc))
            if key not in self._said:
                self._said.add(key)
                log.warning("autotune: Config declines %s: %s", entry.engine_name, exc)
            return None
        if ignored and ("ignored knobs", source) not in self._said:  # one warning per file
            self._said.add(("ignored knobs", source))
            log.warning("autotune: Config %s: knobs %s are not knobs of %s here (hipDNN records such knobs as "
                        "information): the engine is selected, its other knobs applied, these ignored (warned once "
                        "per file)", source, ", ".join(ignored), entry.engine_name)
        return knobs

    def _resolve(self, root: str) -> str | None:
        """The file for this device under a published root; looked up again only when index.json changes
        (on an object store, s3:// or gs://, at most every REMOTE_REFRESH_S seconds)."""
        stamp: Any
        if "://" in root:
            stamp = (root, int(time.monotonic() // REMOTE_REFRESH_S))
        else:
            try:
                st = os.stat(os.path.join(root, "index.json"))
                stamp = (root, st.st_size, st.st_mtime_ns, st.st_ino)
            except OSError:
                stamp = (root, None)
        if self._root is not None and self._root[0] == stamp:
            return self._root[1]
        from farm.plugin import find_published

        found = find_published(root, self.props)
        target = None
        if found is None:
            self._unusable((root, self.props.signature), "%s holds no file for %s", root, self.props.signature)
        else:
            target, note = found
            self.note = note
            if note:
                self._once((root, target), "uses %s: %s", target, note)
        self._root = (stamp, target)
        return target

    def _load(self, path: str) -> OverrideFile | None:
        # one stat a call for a file (what tells a changed file apart, and a folder from a file)
        st: os.stat_result | None = None
        if "://" in path:
            self._from_root = True
        else:
            try:
                st = os.stat(path)
            except OSError:
                st = None
            self._from_root = st is not None and stat.S_ISDIR(st.st_mode)
        target = self._resolve(path) if self._from_root else path
        if target is None:
            return None
        try:
            if st is None or self._from_root:
                st = os.stat(target)
        except OSError as exc:
            self._unusable(target, "%s: %s", target, exc.strerror or "cannot be read")
            self._file, self._stamp = None, None
            return None
        stamp = (target, st.st_size, st.st_mtime_ns, st.st_ino)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._file = load_overrides(target, strict=False)  # an unusable rule is skipped, not the file
                self.why = ""
            except FarmError as exc:
                self._file = None
                self._unusable(stamp, "%s", exc)  # every tuned winner is lost
        return self._file

    def status(self) -> dict[str, Any]:
        """What the configured path gives this device: for ``farm policies``."""
        env = next((n for n in PATH_ENVS if (os.environ.get(n) or "").strip()), None)
        path = config_path()
        out: dict[str, Any] = {"env": env, "path": path, "file": None, "loaded": False, "rules": 0, "detail": ""}
        if path is None:
            out["detail"] = f"{PATH_ENVS[0]} is not set: the Config policy declines, no tuned winner is used"
            return out
        f = self._load(path)
        if f is not None:
            sig = f.device_signature
            if sig and sig != self.signature and not self._from_root:
                self._unusable((f.source, sig), "%s is for device %s, this is %s", f.source, sig, self.signature)
            elif f.invalid:
                out.update(file=f.source)
                out["detail"] = f"invalid at {f.invalid}: as hipDNN reads it, no rule of the file is used"
                return out
            else:
                out.update(file=f.source, loaded=True, rules=len(f.entries))
                out["detail"] = f"{len(f.entries)} rule(s), for {sig or 'any device'}" + \
                    (f" ({self.note})" if self._from_root and self.note else "")
                return out
        out["detail"] = self.why or "not used"
        return out

    def order(self, candidates: Sequence[int], problem: bytes) -> Choice | None:
        found = self._entry(problem)
        if found is None:
            return None
        f, entry = found
        return self._choice(f, candidates, entry)

    def order_for_call(self, candidates: Sequence[int], problem: bytes, call: str) -> Choice | None:
        """The entry's decision for production calls of kind ``call`` ("graph": inside a captured graph), when
        the file records one (``autotune_metadata.call`` / ``calls``); None otherwise."""
        found = self._entry(problem)
        if found is None:
            return None
        f, entry = found
        try:
            picked = call_choice(entry, call)
        except FarmError as exc:
            self._once(("calls", f.source, str(exc)), "declines the %s decision: %s", call, exc, level=logging.WARNING)
            return None
        if picked is None:
            return None
        name, knobs = picked
        if (name, knobs) != (entry.engine_name, entry.knobs):
            entry = dataclasses.replace(entry, engine_name=name, knobs=knobs, metadata=None)
        return self._choice(f, candidates, entry)

    def _entry(self, problem: bytes) -> tuple[OverrideFile, Any] | None:
        path = config_path()
        if not path:
            return None
        f = self._load(path)
        if f is None:
            return None
        sig = f.device_signature
        if sig and sig != self.signature and not self._from_root:
            self._unusable((f.source, sig), "%s is for device %s, this is %s", f.source, sig, self.signature)
            return None
        try:
            p = _problem(problem)
        except FlatBufferError as exc:
            self._once(str(exc), "declines: %s", exc)
            return None
        entry = f.match(p)
        if entry is None and log.isEnabledFor(logging.INFO):  # -v: why, with the nearest entry (a walk: not by default)
            self._once(p.key, "declines %s: no entry of %s matches; %s", p.label(), f.source, f.nearest_miss(p))
        return (f, entry) if entry is not None else None

    def _choice(self, f: OverrideFile, candidates: Sequence[int], entry: Any) -> Choice | None:
        """The entry's engine first (its knobs validated), or None: declined, and said why once."""
        eid = _engine_id(entry.engine_name)
        if eid not in candidates:
            self._once((f.source, entry.engine_name), "declines: %s names %s, which is not a candidate here",
                       f.source, entry.engine_name)
            return None
        cached = self._knobs.get(id(entry))
        if cached is None or cached[0] is not entry:  # the entry held, so its id is not another's while cached
            if len(self._knobs) >= 1 << 16:
                self._knobs.clear()
            cached = self._knobs[id(entry)] = (entry, self._valid_knobs(entry, f.source))
        knobs = cached[1]
        if knobs is None:
            return None
        order = (eid,) + tuple(c for c in candidates if c != eid)
        return Choice(order, {eid: knobs})


class ConfigPolicy:
    name = CONFIG
    id = policy_name_to_id(CONFIG)
    api_version = POLICY_API_VERSION

    def session(self, device_properties: bytes) -> _Session:
        return _Session(device_properties)


POLICIES = (ConfigPolicy(),)
