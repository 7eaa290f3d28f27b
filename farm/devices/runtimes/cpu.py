"""The CPU runtime: the host as a device, for CPU engines and for CI."""

from __future__ import annotations

import functools
import os
import platform
import socket
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.devices.properties import DeviceProperties

_SYSFS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


@dataclass
class CpuEvent:
    ns: int = 0


class HostRuntime:
    """What a runtime of the host has no need for: devices to select, streams, events to free, waits."""

    def device_count(self) -> int:
        return 1

    def set_device(self, index: int) -> None:
        pass

    def create_stream(self) -> None:
        return None

    def destroy_stream(self, stream: Any) -> None:
        pass

    def destroy_event(self, event: Any) -> None:
        pass

    def synchronize_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CpuRuntime(HostRuntime):
    """Streams are no-ops, events read the host clock, memory is numpy bytes."""

    name = "cpu"

    def properties(self, index: int = 0) -> DeviceProperties:
        return _cpu_properties(index)

    def create_event(self) -> CpuEvent:
        return CpuEvent()

    def record_event(self, event: CpuEvent, stream: Any) -> None:
        event.ns = time.perf_counter_ns()

    def elapsed_ms(self, start: CpuEvent, end: CpuEvent) -> float:
        return (end.ns - start.ns) / 1e6

    def malloc(self, nbytes: int) -> np.ndarray:
        return np.empty(max(int(nbytes), 0), dtype=np.uint8)

    def free(self, ptr: Any) -> None:
        pass

    def memset(self, ptr: np.ndarray, value: int, nbytes: int) -> None:
        ptr[:nbytes] = value

    def flush_l2(self, stream: Any = None) -> None:
        buf = _flush_buffer()
        buf += 1  # a read-modify-write over more than the last-level cache


@functools.lru_cache(maxsize=1)
def _flush_buffer() -> np.ndarray:
    llc = max(_cache_bytes(3), _cache_bytes(2), 8 << 20)
    return np.zeros(2 * llc // 8, dtype=np.float64)


def last_level_cache_bytes() -> int:
    """The largest cache of this host's CPUs (what data must outgrow to come from memory), 0 when unknown."""
    return max(_cache_bytes(3), _cache_bytes(2))


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """This host's CPU model, as /proc/cpuinfo names it: an eager call's time is as much the host's as the
    device's (a launch is host work), so results and decisions record it."""
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine() or "unknown"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _cache_bytes(level: int) -> int:
    """Size of the unified/data cache at ``level`` from sysfs (0 when unknown)."""
    for i in range(8):
        base = f"{_SYSFS_CACHE}/index{i}"
        if _read(f"{base}/level") == str(level) and _read(f"{base}/type") in ("Unified", "Data"):
            text = _read(f"{base}/size").upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            digits = text.rstrip("KMG")
            return int(digits) * mult if digits.isdigit() else 0
    return 0


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    for line in _read("/proc/cpuinfo").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info.setdefault(k.strip(), v.strip())
    return info


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def blas_threads_in_force() -> int:
    """The threads numpy's BLAS runs with in this process (the usable cores when it cannot tell)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return usable_cores()
    counts = [int(e.get("num_threads") or 0) for e in threadpool_info() if e.get("user_api") == "blas"]
    return max(counts) if counts and max(counts) > 0 else usable_cores()


def set_blas_threads(threads: int) -> None:
    """Run BLAS and OpenMP with ``threads`` threads in this process from now on (a farm CPU worker does this
    before it opens its device, so it measures with the threads production uses)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=int(threads))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(int(threads))  # libraries loaded later start with the same count


def blas_info() -> dict[str, str]:
    """The BLAS numpy uses: library, version, kernel architecture (via threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    for entry in threadpool_info():
        if entry.get("user_api") == "blas":
            return {
                "library": str(entry.get("internal_api", "blas")),
                "version": str(entry.get("version") or ""),
                "architecture": str(entry.get("architecture") or ""),
                "threads": str(entry.get("num_threads", "")),
            }
    return {}


@functools.lru_cache(maxsize=None)
def _cpu_properties(index: int) -> DeviceProperties:
    info = _cpuinfo()
    machine = platform.machine() or "unknown"
    name = info.get("model name") or info.get("Model") or platform.processor() or machine
    blas = blas_info()
    micro = blas.get("architecture", "").lower()
    arch = f"{machine}-{micro}" if micro else machine
    mhz = 0
    try:
        mhz = int(float(info.get("cpu MHz", "0")))
    except ValueError:
        pass
    libraries = {"numpy": np.__version__}
    if blas:
        libraries[blas["library"]] = blas["version"] or "unknown"
    return DeviceProperties(
        vendor="cpu",
        name=name,
        arch=arch,
        compute_units=blas_threads_in_force(),  # the cores the kernels use: threads change which one wins
        total_memory=_total_memory(),
        l2_bytes=_cache_bytes(2),
        clock_mhz=mhz,
        warp_size=1,
        driver_version="",
        runtime_version=platform.python_version(),
        libraries=tuple(sorted(libraries.items())),
        index=index,
        host=socket.gethostname(),
    )
