"""The runtime interface: what the tuner and engines need from a device API.

One small surface shared by the CPU, CUDA (cuda-python) and HIP (hip-python)
runtimes: device count and properties, streams, events, synchronisation,
workspace memory, and an L2 flush for cold-cache timing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from farm.errors import FarmError

if TYPE_CHECKING:
    from farm.devices.properties import DeviceProperties


@runtime_checkable
class Runtime(Protocol):
    name: str  # "cpu", "cuda", "hip", "sim"

    def device_count(self) -> int: ...

    def properties(self, index: int) -> "DeviceProperties": ...

    def set_device(self, index: int) -> None: ...

    def create_stream(self) -> Any: ...

    def destroy_stream(self, stream: Any) -> None: ...

    def create_event(self) -> Any: ...

    def destroy_event(self, event: Any) -> None: ...

    def record_event(self, event: Any, stream: Any) -> None: ...

    def synchronize_event(self, event: Any) -> None: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    def synchronize(self) -> None: ...

    def malloc(self, nbytes: int) -> Any: ...

    def free(self, ptr: Any) -> None: ...

    def memset(self, ptr: Any, value: int, nbytes: int) -> None: ...

    def flush_l2(self, stream: Any) -> None: ...


class RuntimeUnavailable(FarmError, RuntimeError):
    """The runtime cannot be used here: its Python bindings or native library are missing."""


class NoDeviceError(RuntimeUnavailable):
    """The runtime loaded, but sees no device."""


class RuntimeCallError(FarmError, RuntimeError):
    """A runtime call returned an error code; the message names the call, its arguments and the error."""

    def __init__(self, call: str, code: int, name: str, description: str) -> None:
        self.call = call
        self.code = code
        self.error_name = name
        super().__init__(f"{call} failed: {name} ({code}){': ' + description if description else ''}")
