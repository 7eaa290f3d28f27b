"""The device handle a tuner holds (runtime, arrays, timer, stream), and the one way to open a device.

Properties and the device signature: farm.devices.properties.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from farm.devices.properties import DeviceProperties

if TYPE_CHECKING:
    from farm.devices.arrays import ArrayBackend
    from farm.devices.runtimes.base import Runtime
    from farm.devices.timing import Timer


@dataclass(frozen=True)
class Device:
    """The handle a tuner (or a Ray actor) holds: a runtime, a device index, and its properties (never changed
    after it is made: ``dataclasses.replace`` makes a variant)."""

    runtime: "Runtime"
    index: int
    properties: DeviceProperties
    arrays: "ArrayBackend"
    timer: "Timer"
    stream: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    checks_numerics: bool = True  # False for simulated devices, whose engines compute nothing

    @property
    def signature(self) -> str:
        return self.properties.signature

    @property
    def vendor(self) -> str:
        return self.properties.vendor

    def synchronize(self) -> None:
        self.runtime.synchronize()

    def __repr__(self) -> str:
        return f"Device({self.runtime.name}:{self.index} {self.properties.name!r} {self.signature})"


def cpu_device(index: int = 0) -> Device:
    """The host CPU as a tuning device (numpy arrays, host-clock timer)."""
    from farm.devices.arrays import NumpyArrays
    from farm.devices.runtimes.cpu import CpuRuntime
    from farm.devices.timing import HostTimer

    runtime = CpuRuntime()
    return Device(runtime, index, runtime.properties(index), NumpyArrays(), HostTimer())


def gpu_device(kind: str | Any, index: int = 0) -> Device:
    """A CUDA or HIP device: its own stream, event timing on that stream, torch tensors (when torch is installed)."""
    from farm.devices.arrays import TorchArrays
    from farm.devices.runtimes import runtime_for
    from farm.devices.timing import EventTimer

    runtime = runtime_for(kind)
    props = runtime.properties(index)
    runtime.set_device(index)
    stream = runtime.create_stream()
    timer = EventTimer(runtime, stream, torch_lead(stream, index, props.clock_mhz))
    # capture_graph(device, fn, repeats): how the tuner replays a call with CUDA graphs on this device;
    # is_capturing(device): whether the caller's stream is capturing a graph now (replay must not measure then)
    # follow_caller(device): a context in which work on the device stream comes after the caller's torch stream's
    # and the caller's after it (the device stream is non-blocking: nothing orders the two by itself)
    # eager_timer(device): events on the caller's current stream with no lead, for back-to-back calls as replay
    # makes them (their launch cost included)
    return Device(runtime, index, props, TorchArrays(index), timer, stream,
                  extras={"capture_graph": torch_graph, "is_capturing": torch_is_capturing,
                          "capture_probe": torch_capture_probe,
                          "follow_caller": torch_follow_caller, "eager_timer": torch_eager_timer})


def eager_device(device: Device) -> tuple[Device, "Timer"]:
    """The device replay runs plans on (a GPU's caller's current stream, not the tuner's own) and a timer of
    back-to-back calls there, launch cost included. CPU and simulated devices: themselves and their timer."""
    make = device.extras.get("eager_timer")
    if make is None:
        return device, device.timer
    return dataclasses.replace(device, stream=None), make(device)


def torch_eager_timer(device: Device) -> "Timer":
    """Device events on the current torch stream with no lead before the start: a replay caller's launches
    (host cost) land in the time when they cannot keep ahead of the device."""
    import torch

    from farm.devices.timing import EventTimer

    return EventTimer(device.runtime, int(torch.cuda.current_stream(device.index).cuda_stream), None)


LEAD_US_ENV = "FARM_TIMER_LEAD_US"


def torch_lead(stream: Any, index: int, clock_mhz: int) -> Any:
    """A device-side spin of FARM_TIMER_LEAD_US (default 200 us) on ``stream``, or None without torch.

    It covers the host's launch latency (tens of microseconds from Python), so
    event timing measures the kernels, not the gap before them.
    """
    import os

    us = float(os.environ.get(LEAD_US_ENV, "200") or 0)
    if us <= 0:
        return None
    try:
        import torch
    except ImportError:
        return None
    ext = torch.cuda.ExternalStream(int(stream), device=torch.device("cuda", index))
    cycles = int(us * max(clock_mhz, 1000))

    def lead() -> None:
        with torch.cuda.stream(ext):
            torch.cuda._sleep(cycles)

    return lead


def graph_pool_active(device_index: int) -> bool:
    """Whether memory torch allocates now on this thread lands in a CUDA graph's private pool: the current stream
    is being captured, or torch.compile's CUDA graphs (cudagraph trees) warm up or record on their own stream.
    Nothing made then may outlive the call that made it: the trees refuse a pool holding memory their outputs do
    not account for ("tensor(s) in the cudagraph pool not tracked as outputs"), as torch clears cuBLAS's workspace
    around them. False without torch."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    if torch.cuda.is_current_stream_capturing():
        return True
    trees = sys.modules.get("torch._inductor.cudagraph_trees")  # only where torch.compile's graphs are in use
    if trees is None:
        return False
    try:
        manager = trees.get_manager(device_index, create_if_none_exists=False)
    except Exception:  # another torch's internals: no tree known
        return False
    stream = getattr(manager, "stream", None)
    return stream is not None and torch.cuda.current_stream(device_index) == stream


def torch_is_capturing(device: Device) -> bool:
    """True while the current torch stream of this device is capturing a CUDA/HIP graph (False without torch)."""
    import sys

    torch = sys.modules.get("torch")  # a process that never imported torch captures no torch graph
    if torch is None:
        return False
    if torch.cuda.current_device() == device.index:  # the usual case: no device switch (replay asks every call)
        return bool(torch.cuda.is_current_stream_capturing())
    with torch.cuda.device(device.index):
        return bool(torch.cuda.is_current_stream_capturing())


def torch_capture_probe(device: Device) -> Any:
    """``probe()`` -> whether the caller's current stream on this device is capturing a graph, asked of torch's
    own C functions (replay asks at every call of a problem with a separate graph decision)."""
    import torch

    get_device, capturing, index = torch._C._cuda_getDevice, torch._C._cuda_isCurrentStreamCapturing, device.index

    def probe() -> bool:
        return bool(capturing()) if get_device() == index else torch_is_capturing(device)

    return probe


@contextlib.contextmanager
def torch_follow_caller(device: Device) -> Iterator[None]:
    """Order the device stream after the caller's current torch stream, and the caller's after what ran inside
    (torch's own cross-stream rule; a capturing caller's graph takes the device stream's work in)."""
    import sys

    torch = sys.modules.get("torch")  # tensors the caller made without torch need no ordering here
    if torch is None:
        yield
        return
    caller = torch.cuda.current_stream(device.index)
    own = torch.cuda.ExternalStream(int(device.stream), device=torch.device("cuda", device.index))
    own.wait_stream(caller)
    yield
    caller.wait_stream(own)


def torch_graph(device: Device, fn: Any, repeats: int) -> Any:
    """Capture ``repeats`` calls of ``fn`` into a CUDA/HIP graph on the device stream; returns its replay."""
    import torch

    stream = torch.cuda.ExternalStream(int(device.stream), device=torch.device("cuda", device.index))
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize(device.index)
    # thread_local: other threads (the compile pool) may keep using CUDA during the capture
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        for _ in range(repeats):
            fn()

    def replay() -> None:
        with torch.cuda.stream(stream):
            graph.replay()

    return replay


@dataclass(frozen=True)
class RuntimeProbe:
    """What one runtime sees here: its devices, or why none."""

    runtime: str
    devices: tuple[DeviceProperties, ...]
    note: str = ""


def probe(kinds: tuple[str, ...] = ("cuda", "hip")) -> list[RuntimeProbe]:
    """Every GPU runtime's devices (properties only; nothing is allocated), then the CPU."""
    from farm.devices.runtimes.base import RuntimeUnavailable
    from farm.devices.runtimes import runtime_for

    out = []
    for kind in kinds:
        try:
            rt = runtime_for(kind)
            out.append(RuntimeProbe(kind, tuple(rt.properties(i) for i in range(rt.device_count()))))
        except RuntimeUnavailable as exc:
            out.append(RuntimeProbe(kind, (), str(exc)))
    out.append(RuntimeProbe("cpu", (cpu_device().properties,)))
    return out
