"""Heuristic plugins as shared libraries: the hipDNN heuristics RFC's C ABI (§8, §10, §11), loaded with ctypes.

A vendor ships a selection policy as a ``.so`` exporting ``hipdnnHeuristic*`` symbols. Each one found is
checked before it is registered (every rejection is one log line, and loading goes on without it):

* the required symbols resolve (``GetApiVersion``, ``GetPolicyId``, ``GetPluginVersion``,
  ``SetLoggingCallback``, ``GetLastErrorString``, the handle and policy-descriptor lifecycle, ``SetEngineIds``,
  ``SetSerializedGraph``, ``Finalize``, ``GetSortedEngineIds``); ``GetPolicyName`` and ``SetLogLevel`` are
  optional;
* its C ABI major equals this host's (``HEURISTIC_API_VERSION``);
* when it exports a name, its id equals ``policyNameToId(name)``;
* its id is not one a loaded policy has (the registry's check).

Where they are looked for: every path in ``FARM_HEUR_PLUGIN_PATH`` and ``HIPDNN_HEURISTIC_PLUGIN_DIR``
(``os.pathsep``-separated folders or files), then ``<prefix>/lib/hipdnn_plugins/heuristics``, as the RFC's
heuristic plugin manager searches its own folder and variable.

Per device session the host creates a plugin handle and gives it the device properties (our FlatBuffer, in a
``{ptr, size}`` const-data struct); per selection it creates a policy descriptor, sets the candidate ids and the
serialized problem, finalizes (``out_applied``) and reads the sorted ids (a prefix of at most the capacity).
A status other than success is logged with the plugin's last error string and the policy declines.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, Iterable, Sequence

from farm.plugin import policy_name_to_id

log = logging.getLogger("farm.policies.native")

HEURISTIC_API_VERSION = (1, 0)  # the C ABI this host speaks: a plugin of another major is rejected
PATH_ENVS = ("FARM_HEUR_PLUGIN_PATH", "HIPDNN_HEURISTIC_PLUGIN_DIR")
SUFFIXES = (".so", ".dylib", ".dll")

# hipdnnPluginStatus_t, in PluginApiDataTypes.h's order (NOT_APPLICABLE appended after the generic codes)
STATUS = {0: "SUCCESS", 1: "BAD_PARAM", 2: "INVALID_VALUE", 3: "INTERNAL_ERROR", 4: "ALLOC_FAILED",
          5: "NOT_APPLICABLE", 6: "NOT_INITIALIZED"}
SUCCESS, NOT_APPLICABLE = 0, 5
_SEVERITY = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}


class ConstData(ctypes.Structure):
    """hipdnnPluginConstData_t: a read-only view of bytes."""

    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)
_i64p, _size = ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t
_str_out = ctypes.POINTER(ctypes.c_char_p)
# symbol suffix -> (argument types, required)
_SYMBOLS: dict[str, tuple[list[Any], bool]] = {
    "GetApiVersion": ([_str_out], True),
    "GetPolicyId": ([_i64p], True),
    "GetPolicyName": ([_str_out], False),
    "GetPluginVersion": ([_str_out], True),
    "SetLoggingCallback": ([_LOG_CALLBACK], True),
    "SetLogLevel": ([ctypes.c_int], False),
    "GetLastErrorString": ([_str_out], True),
    "HandleCreate": ([ctypes.POINTER(ctypes.c_void_p)], True),
    "HandleDestroy": ([ctypes.c_void_p], True),
    "HandleSetDeviceProperties": ([ctypes.c_void_p, ctypes.POINTER(ConstData)], True),
    "PolicyDescriptorCreate": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)], True),
    "PolicyDescriptorDestroy": ([ctypes.c_void_p], True),
    "PolicySetEngineIds": ([ctypes.c_void_p, _i64p, _size], True),
    "PolicySetSerializedGraph": ([ctypes.c_void_p, ctypes.POINTER(ConstData)], True),
    "PolicyFinalize": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)], True),
    "PolicyGetSortedEngineIds": ([ctypes.c_void_p, _i64p, _size, ctypes.POINTER(_size)], True),
}


class PluginRejected(Exception):
    """A library that is not a usable heuristic plugin (the reason is the message)."""


def _forward_log(severity: int, prefix: bytes | None, message: bytes | None) -> None:
    text = (prefix or b"").decode(errors="replace") + (message or b"").decode(errors="replace")
    log.log(_SEVERITY.get(int(severity), logging.INFO), "heuristic plugin: %s", text)


_CALLBACK = _LOG_CALLBACK(_forward_log)  # held for the life of the process: plugins keep the pointer


class NativeLibrary:
    """One loaded ``.so`` with its hipdnnHeuristic* functions typed."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._dll = ctypes.CDLL(path)
        except OSError as exc:
            raise PluginRejected(f"cannot be loaded: {exc}") from None
        self.fn: dict[str, Any] = {}
        for suffix, (argtypes, required) in _SYMBOLS.items():
            try:
                f = getattr(self._dll, f"hipdnnHeuristic{suffix}")
            except AttributeError:
                if required:
                    raise PluginRejected(f"missing required symbol hipdnnHeuristic{suffix}") from None
                continue
            f.argtypes = argtypes
            f.restype = None if suffix == "GetLastErrorString" else ctypes.c_int
            self.fn[suffix] = f
        self.lock = threading.Lock()  # a plugin handle is single-thread only (RFC §8.3): calls are serialised

    def call(self, name: str, *args: Any) -> int:
        return int(self.fn[name](*args))

    def string(self, name: str) -> str:
        out = ctypes.c_char_p()
        status = self.call(name, ctypes.byref(out))
        if status != SUCCESS or out.value is None:
            raise PluginRejected(f"hipdnnHeuristic{name} returned {self.status_text(status)}")
        return out.value.decode(errors="replace")

    def last_error(self) -> str:
        out = ctypes.c_char_p()
        self.fn["GetLastErrorString"](ctypes.byref(out))
        return out.value.decode(errors="replace") if out.value else ""

    def status_text(self, status: int) -> str:
        name = STATUS.get(status, f"status {status}")
        detail = self.last_error() if status != SUCCESS else ""
        return f"HIPDNN_PLUGIN_STATUS_{name}" + (f" ({detail})" if detail else "")


def _const(data: bytes) -> tuple[ConstData, Any]:
    buf = ctypes.create_string_buffer(data, len(data)) if data else None
    return ConstData(ctypes.cast(buf, ctypes.c_void_p) if buf is not None else None, len(data)), buf


class _Session:
    """A plugin handle for one device (its properties set once), asked per selection."""

    def __init__(self, policy: "NativePolicy", device_properties: bytes) -> None:
        self.policy, lib = policy, policy.lib
        self._said: set[str] = set()
        handle = ctypes.c_void_p()
        with lib.lock:
            status = lib.call("HandleCreate", ctypes.byref(handle))
            if status != SUCCESS or not handle.value:
                raise RuntimeError(f"{policy.name}: hipdnnHeuristicHandleCreate returned {lib.status_text(status)}")
            props, keep = _const(device_properties)
            status = lib.call("HandleSetDeviceProperties", handle, ctypes.byref(props))
            del keep
        if status != SUCCESS:
            lib.call("HandleDestroy", handle)
            raise RuntimeError(f"{policy.name}: hipdnnHeuristicHandleSetDeviceProperties returned "
                               f"{lib.status_text(status)}")
        self.handle = handle.value
        self._close = weakref.finalize(self, lib.call, "HandleDestroy", ctypes.c_void_p(self.handle))

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.info("autotune: %s %s", self.policy.name, message)

    def order(self, candidates: Sequence[int], problem: bytes) -> tuple[int, ...] | None:
        lib = self.policy.lib
        desc = ctypes.c_void_p()
        with lib.lock:
            status = lib.call("PolicyDescriptorCreate", ctypes.c_void_p(self.handle), ctypes.byref(desc))
            if status != SUCCESS or not desc.value:
                self._say(f"declines: hipdnnHeuristicPolicyDescriptorCreate returned {lib.status_text(status)}")
                return None
            try:
                return self._ask(lib, desc, candidates, problem)
            finally:
                lib.call("PolicyDescriptorDestroy", desc)

    def _ask(self, lib: NativeLibrary, desc: Any, candidates: Sequence[int], problem: bytes) -> tuple[int, ...] | None:
        ids = (ctypes.c_int64 * max(len(candidates), 1))(*candidates)
        graph, keep = _const(problem)
        steps = (("PolicySetEngineIds", (desc, ids, len(candidates))),
                 ("PolicySetSerializedGraph", (desc, ctypes.byref(graph))))
        for name, args in steps:
            status = lib.call(name, *args)
            if status != SUCCESS:
                self._say(f"declines: hipdnnHeuristic{name} returned {lib.status_text(status)}")
                return None
        applied = ctypes.c_int32(0)
        status = lib.call("PolicyFinalize", desc, ctypes.byref(applied))
        del keep
        if status == NOT_APPLICABLE or (status == SUCCESS and applied.value == 0):
            return None  # the policy does not apply to this problem: the next one answers
        if status != SUCCESS:
            self._say(f"declines: hipdnnHeuristicPolicyFinalize returned {lib.status_text(status)}")
            return None
        out = (ctypes.c_int64 * max(len(candidates), 1))()
        count = _size(0)
        status = lib.call("PolicyGetSortedEngineIds", desc, out, len(candidates), ctypes.byref(count))
        if status != SUCCESS:
            self._say(f"declines: hipdnnHeuristicPolicyGetSortedEngineIds returned {lib.status_text(status)}")
            return None
        return tuple(out[i] for i in range(min(count.value, len(candidates))))  # the host validates the ids


class NativePolicy:
    """A policy from a shared library (the Policy protocol of farm.replay.selection)."""

    def __init__(self, lib: NativeLibrary, policy_id: int, name: str | None, api_version: tuple[int, int],
                 plugin_version: str) -> None:
        self.lib = lib
        self.id = policy_id
        self.named = name is not None  # without a name the id is the only identity (nothing to check it against)
        self.name = name if name is not None else f"{Path(lib.path).stem}:{policy_id}"
        self.api_version = api_version
        self.plugin_version = plugin_version

    def session(self, device_properties: bytes) -> _Session:
        return _Session(self, device_properties)


def load_library(path: str) -> NativePolicy:
    """Load and check one library; raises PluginRejected with the reason."""
    lib = NativeLibrary(path)
    version = lib.string("GetApiVersion")
    try:
        major, minor = (int(x) for x in (version.split(".") + ["0"])[:2])
    except ValueError:
        raise PluginRejected(f"API version {version!r} is not MAJOR.MINOR[.PATCH]") from None
    if major != HEURISTIC_API_VERSION[0]:
        raise PluginRejected(f"heuristic C ABI {version} has major {major}; this host speaks "
                             f"{HEURISTIC_API_VERSION[0]}.x")
    pid = ctypes.c_int64()
    status = lib.call("GetPolicyId", ctypes.byref(pid))
    if status != SUCCESS:
        raise PluginRejected(f"hipdnnHeuristicGetPolicyId returned {lib.status_text(status)}")
    name = lib.string("GetPolicyName") if "GetPolicyName" in lib.fn else None
    if name is not None and pid.value != policy_name_to_id(name):
        raise PluginRejected(f"policy id {pid.value} is not policyNameToId({name!r}) = {policy_name_to_id(name)}")
    lib.call("SetLoggingCallback", _CALLBACK)
    if "SetLogLevel" in lib.fn:
        level = logging.getLogger("farm").getEffectiveLevel()
        lib.call("SetLogLevel", next((s for s, lv in sorted(_SEVERITY.items()) if lv >= level), 1))
    return NativePolicy(lib, pid.value, name, (major, minor), lib.string("GetPluginVersion"))


def plugin_files(paths: Iterable[str] | None = None) -> list[str]:
    """The libraries to load: every file with a library suffix in each folder (sorted), or the file itself."""
    if paths is None:
        paths = [p for env in PATH_ENVS for p in (os.environ.get(env) or "").split(os.pathsep) if p.strip()]
        paths.append(str(Path(sys.prefix) / "lib" / "hipdnn_plugins" / "heuristics"))
    out: list[str] = []
    for raw in paths:
        p = Path(raw.strip()).expanduser()
        if p.is_dir():
            out += [str(f) for f in sorted(p.iterdir()) if f.suffix in SUFFIXES and f.is_file()]
        elif p.is_file():
            out.append(str(p))
    return list(dict.fromkeys(out))


def load_plugins(registry: Any, paths: Iterable[str] | None = None) -> None:
    """Register every usable library found; each rejection is one log line and a ``registry.rejected`` entry."""
    for path in plugin_files(paths):
        origin = f"library {path}"
        try:
            policy = load_library(path)
        except PluginRejected as exc:
            log.warning("heuristic plugin %s rejected: %s", path, exc)
            registry.rejected.append((origin, str(exc)))
            continue
        registry.register(policy, origin=origin)
