"""The GPU runtime adapter shared by CUDA and HIP.

cuda-python's ``cuda.bindings.runtime`` and hip-python's ``hip.hip`` mirror each
other: ``cudaMalloc``/``hipMalloc``, each returning a tuple whose first element is
the error code. One adapter therefore serves both; a small binding table
(``CudaBindings``, ``HipBindings``) holds the real differences: how the module
loads, how device properties are fetched, the arch string, versions, and which
libraries matter. Every call's error code is checked and turned into a
RuntimeCallError naming the call.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
import threading
from typing import Any, Protocol

from farm.devices.properties import DeviceProperties
from farm.devices.runtimes.base import RuntimeCallError, RuntimeUnavailable

log = logging.getLogger("farm.runtime")

NO_DEVICE = 100  # cudaErrorNoDevice == hipErrorNoDevice
STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking == hipStreamNonBlocking


class Bindings(Protocol):
    """What differs between CUDA and HIP."""

    name: str  # "cuda" / "hip"
    vendor: str  # "nvidia" / "amd"
    prefix: str  # "cuda" / "hip"

    def load(self) -> Any: ...

    def device_properties(self, module: Any, index: int, call: Any) -> Any: ...

    def arch(self, prop: Any) -> str: ...

    def clock_attribute(self, module: Any) -> Any: ...

    def memcpy_device_to_device(self, module: Any) -> Any: ...

    def version_text(self, number: int) -> str: ...

    def driver_version(self, module: Any, call: Any) -> str: ...

    def libraries(self) -> dict[str, str]: ...

    def unavailable(self, exc: BaseException) -> RuntimeUnavailable: ...

    def no_device(self, code: int, name: str) -> RuntimeUnavailable: ...


def text(value: Any) -> str:
    """A C string field from the bindings (bytes, str or char array) as str."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace").strip()
    return str(value).split("\0", 1)[0].strip() if value is not None else ""


def dist_version(*names: str) -> str | None:
    """Version of the first installed distribution among ``names`` (no import of the package)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class GpuRuntime:
    """The Runtime interface over a CUDA or HIP binding table."""

    def __init__(self, bindings: Bindings) -> None:
        self.b = bindings
        self.name = bindings.name
        self._module: Any = None
        self._lock = threading.Lock()
        self._flush: dict[int, tuple[Any, int]] = {}
        self._flush_value = 0

    # -- calls ---------------------------------------------------------------------------
    @property
    def module(self) -> Any:
        if self._module is None:
            with self._lock:
                if self._module is None:
                    self._module = self.b.load()
        return self._module

    def call(self, short: str, *args: Any) -> Any:
        """``<prefix><short>(*args)`` with its error code checked; returns the remaining values."""
        name = self.b.prefix + short
        fn = getattr(self.module, name, None)
        if fn is None:
            raise RuntimeUnavailable(f"{self.b.name} bindings have no {name}")
        try:
            res = fn(*args)
        except RuntimeError as exc:  # hip-python: library or symbol missing at first call
            raise self.b.unavailable(exc) from None
        if not isinstance(res, tuple):
            res = (res,)
        err = res[0]
        code = int(err)
        if code != 0:
            err_name = getattr(err, "name", str(code))
            if short == "GetDeviceCount":
                raise self.b.no_device(code, err_name)
            raise RuntimeCallError(f"{name}({', '.join(_arg(a) for a in args)})", code, err_name, self._describe(err))
        rest = res[1:]
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else rest

    def _describe(self, err: Any) -> str:
        try:
            res = getattr(self.module, self.b.prefix + "GetErrorString")(err)
            return text(res[1] if isinstance(res, tuple) else res)
        except Exception:
            return ""

    # -- devices ---------------------------------------------------------------------------
    def device_count(self) -> int:
        return int(self.call("GetDeviceCount"))

    def set_device(self, index: int) -> None:
        self.call("SetDevice", index)

    def properties(self, index: int) -> DeviceProperties:
        count = self.device_count()
        if not 0 <= index < count:
            raise RuntimeCallError(f"{self.b.prefix}GetDeviceProperties({index})", 101, "invalid device index",
                                   f"{count} {self.b.vendor} device(s) visible: valid indices are 0..{count - 1}")
        mod = self.module
        prop = self.b.device_properties(mod, index, self.call)
        clock_khz = 0
        try:
            clock_khz = int(self.call("DeviceGetAttribute", self.b.clock_attribute(mod), index))
        except (RuntimeCallError, AttributeError) as exc:
            log.debug("clock rate of %s device %d unknown: %s", self.name, index, exc)
        uuid = getattr(prop, "uuid", None)
        uuid_bytes = getattr(uuid, "bytes", uuid)
        return DeviceProperties(
            vendor=self.b.vendor,
            name=text(prop.name),
            arch=self.b.arch(prop),
            compute_units=int(prop.multiProcessorCount),
            total_memory=int(prop.totalGlobalMem),
            l2_bytes=int(prop.l2CacheSize),
            clock_mhz=clock_khz // 1000,
            warp_size=int(prop.warpSize),
            driver_version=self.b.driver_version(mod, self.call),
            runtime_version=self.b.version_text(int(self.call("RuntimeGetVersion"))),
            libraries=tuple(sorted(self.b.libraries().items())),
            index=index,
            uuid=bytes(uuid_bytes).hex() if isinstance(uuid_bytes, (bytes, bytearray)) else "",
            host=socket.gethostname(),
            pci_bus=_pci(prop),
        )

    # -- streams and events ----------------------------------------------------------------
    def create_stream(self) -> Any:
        # Non-blocking: work other threads put on the legacy default stream (a plan built while another is
        # captured into a graph on this stream) neither waits for it nor breaks the capture. The tuner
        # synchronizes where it hands data between the two.
        return self.call("StreamCreateWithFlags", STREAM_NON_BLOCKING)

    def destroy_stream(self, stream: Any) -> None:
        self.call("StreamDestroy", stream)

    def create_event(self) -> Any:
        return self.call("EventCreate")

    def destroy_event(self, event: Any) -> None:
        self.call("EventDestroy", event)

    def record_event(self, event: Any, stream: Any) -> None:
        self.call("EventRecord", event, stream)

    def synchronize_event(self, event: Any) -> None:
        self.call("EventSynchronize", event)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.call("EventElapsedTime", start, end))

    def synchronize(self) -> None:
        self.call("DeviceSynchronize")

    def synchronize_stream(self, stream: Any) -> None:
        self.call("StreamSynchronize", stream)

    # -- memory ----------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Any:
        return self.call("Malloc", int(nbytes))

    def free(self, ptr: Any) -> None:
        self.call("Free", ptr)

    def memset(self, ptr: Any, value: int, nbytes: int) -> None:
        self.call("Memset", ptr, int(value), int(nbytes))

    def memset_async(self, ptr: Any, value: int, nbytes: int, stream: Any) -> None:
        self.call("MemsetAsync", ptr, int(value), int(nbytes), stream)

    def memcpy_async(self, dst: Any, src: Any, nbytes: int, stream: Any) -> None:
        """Device-to-device copy on ``stream``."""
        self.call("MemcpyAsync", dst, src, int(nbytes), self.b.memcpy_device_to_device(self.module), stream)

    def flush_l2(self, stream: Any) -> None:
        """Overwrite a buffer twice the L2 size so the next kernel starts cold."""
        index = int(self.call("GetDevice"))
        buf = self._flush.get(index)
        if buf is None:
            size = max(2 * self.properties(index).l2_bytes, 32 << 20)
            buf = (self.malloc(size), size)
            self._flush[index] = buf
        self._flush_value = (self._flush_value + 1) & 0xFF
        self.memset_async(buf[0], self._flush_value, buf[1], stream)


def _arg(a: Any) -> str:
    if isinstance(a, int) and not isinstance(a, bool):
        return str(a)
    return type(a).__name__


def _pci(prop: Any) -> str:
    try:
        return f"{int(prop.pciDomainID):04x}:{int(prop.pciBusID):02x}:{int(prop.pciDeviceID):02x}.0"
    except (AttributeError, TypeError, ValueError):
        return ""


def env_paths(*names: str) -> list[str]:
    out = []
    for n in names:
        out += [p for p in os.environ.get(n, "").split(os.pathsep) if p]
    return out
