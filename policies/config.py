"""SelectionHeuristic::Config: the engine an override file names for the problem goes first.

The file is FARM_HEUR_CONFIG_PATH (HIPDNN_HEUR_CONFIG_PATH is accepted too): an
override file, or the root of a published tree (farm publish), where the file
for this device is looked up. It is read again only when it changes (size,
mtime, inode), and matches are memoised per problem, so a steady-state
selection is a few dictionary lookups. The policy declines, and says why in the
log once, when: the variable is unset, the file is missing or unparsable, the
problem bytes are malformed, nothing matches, the matched engine is not a
candidate, or the file is for another device signature.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Sequence

from farm.plugin import (
    CONFIG,
    POLICY_API_VERSION,
    Choice,
    FarmError,
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

    def _once(self, key: Any, message: str, *args: Any, level: int = logging.INFO) -> None:
        if (message, key) not in self._said:
            self._said.add((message, key))
            log.log(level, "autotune: Config " + message, *args)

    def _valid_knobs(self, entry: Any, source: str) -> Any:
        """The entry's knobs validated like a workload's, or None: declined, with one warning per entry."""
        from farm.plugin import default_engine_registry, file_knobs

        try:
            return file_knobs(default_engine_registry().get(entry.engine_name), entry.knobs, source=source)
        except FarmError as exc:
            key = ("knobs", source, str(exc))
            if key not in self._said:
                self._said.add(key)
                log.warning("autotune: Config declines %s: %s", entry.engine_name, exc)
            return None

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
            self._once(root, "declines: %s holds no file for %s", root, self.props.signature, level=logging.WARNING)
        else:
            target, note = found
            if note:
                self._once((root, target), "uses %s: %s", target, note)
        self._root = (stamp, target)
        return target

    def _load(self, path: str) -> OverrideFile | None:
        self._from_root = "://" in path or os.path.isdir(path)
        target = self._resolve(path) if self._from_root else path
        if target is None:
            return None
        try:
            st = os.stat(target)
        except OSError:
            self._once(target, "declines: %s does not exist", target, level=logging.WARNING)
            self._file, self._stamp = None, None
            return None
        stamp = (target, st.st_size, st.st_mtime_ns, st.st_ino)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._file = load_overrides(target, strict=False)  # an unusable rule is skipped, not the file
            except FarmError as exc:
                self._file = None
                self._once(stamp, "declines: %s", exc, level=logging.WARNING)  # every tuned winner is lost
        return self._file

    def order(self, candidates: Sequence[int], problem: bytes) -> Choice | None:
        path = config_path()
        if not path:
            return None
        f = self._load(path)
        if f is None:
            return None
        sig = f.device_signature
        if sig and sig != self.signature and not self._from_root:
            self._once((f.source, sig), "declines: %s is for device %s, this is %s", f.source, sig, self.signature,
                       level=logging.WARNING)
            return None
        try:
            p = _problem(problem)
        except FlatBufferError as exc:
            self._once(str(exc), "declines: %s", exc)
            return None
        entry = f.match(p)
        if entry is None:
            return None
        eid = _engine_id(entry.engine_name)
        if eid not in candidates:
            self._once((f.source, entry.engine_name), "declines: %s names %s, which is not a candidate here",
                       f.source, entry.engine_name)
            return None
        knobs = self._valid_knobs(entry, f.source)
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
