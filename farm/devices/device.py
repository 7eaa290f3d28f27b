"""Devices: their properties, their signature, and the handle a tuner holds.

The device signature is a short deterministic key made of the properties that
change which kernel wins, and only those:

    vendor, model name, arch, compute units, memory size (GiB), L2 size (MiB),
    warp/wavefront size, driver major version, runtime major.minor version, and
    major.minor of every library in ``libraries`` (torch, triton, cuBLAS, numpy,
    the BLAS...).

Left out on purpose: device index, UUID, PCI bus, host name, current clocks,
free memory, and patch versions. Two GPUs of one model with the same software
therefore share a signature; a different driver major or library minor does not.
The signature reads ``<vendor>-<model>-<arch>-<N>cu-<hash>``, for example
``nvidia-h200-sm90-132cu-3f9a2c1d7e``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from farm.devices.arrays import ArrayBackend
    from farm.devices.runtimes.base import Runtime
    from farm.devices.timing import Timer

SIGNATURE_VERSION = 1


@dataclass(frozen=True)
class DeviceProperties:
    """Facts about one device. ``libraries`` holds (name, version) pairs sorted by name."""

    vendor: str  # "nvidia", "amd", "cpu", "sim"
    name: str
    arch: str  # "sm_90", "gfx942", "x86_64-haswell"
    compute_units: int
    total_memory: int  # bytes
    l2_bytes: int
    clock_mhz: int  # max/boost clock where known (not part of the signature)
    warp_size: int
    driver_version: str
    runtime_version: str
    libraries: tuple[tuple[str, str], ...] = ()
    index: int = 0
    uuid: str = ""
    host: str = ""
    pci_bus: str = ""

    @property
    def library_versions(self) -> dict[str, str]:
        return dict(self.libraries)

    @property
    def signature(self) -> str:
        return device_signature(self)

    def signature_fields(self) -> dict[str, Any]:
        """Exactly what goes into the signature hash."""
        return {
            "v": SIGNATURE_VERSION,
            "vendor": self.vendor.lower(),
            "name": _model_slug(self.vendor, self.name),
            "arch": self.arch,
            "compute_units": self.compute_units,
            "memory_gib": round(self.total_memory / 2**30),
            "l2_mib": round(self.l2_bytes / 2**20),
            "warp_size": self.warp_size,
            "driver": _major(self.driver_version),
            "runtime": _major_minor(self.runtime_version),
            "libraries": {name: _major_minor(ver) for name, ver in sorted(self.libraries)},
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["libraries"] = dict(self.libraries)
        d["signature"] = self.signature
        return d

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "DeviceProperties":
        fields = {k: data[k] for k in DeviceProperties.__dataclass_fields__ if k in data}
        libs = fields.get("libraries", ())
        fields["libraries"] = tuple(sorted((dict(libs) if isinstance(libs, Mapping) else dict(libs)).items()))
        return DeviceProperties(**fields)


def _major(version: str) -> str:
    m = re.match(r"\s*v?(\d+)", version or "")
    return m.group(1) if m else (version or "")


def _major_minor(version: str) -> str:
    m = re.match(r"\s*v?(\d+)(?:\.(\d+))?", version or "")
    if not m:
        return version or ""
    return m.group(1) + (f".{m.group(2)}" if m.group(2) is not None else "")


_NOISE_WORDS = {"nvidia", "amd", "intel", "corporation", "inc", "r", "tm", "cpu", "processor", "with",
                "radeon", "graphics", "core"}


def _model_slug(vendor: str, name: str) -> str:
    """``NVIDIA H200`` -> ``h200``; ``AMD Instinct MI300X`` -> ``instinct-mi300x``."""
    words = [w for w in re.split(r"[^a-z0-9.]+", name.lower()) if w and w not in _NOISE_WORDS]
    words = [w for w in words if not re.fullmatch(r"\d+(\.\d+)?ghz", w)]
    slug = "-".join(words[:3]) or vendor.lower() or "unknown"
    return re.sub(r"[^a-z0-9-]", "", slug.replace(".", ""))


def _arch_slug(arch: str) -> str:
    """``sm_90`` -> ``sm90``; ``gfx942:sramecc+:xnack-`` -> ``gfx942``; ``x86_64-skylakex`` -> ``x86-skylakex``."""
    a = arch.lower().split(":")[0].replace("x86_64", "x86").replace("aarch64", "arm64")
    a = re.sub(r"^sm_", "sm", a)
    return re.sub(r"[^a-z0-9-]", "", a.replace("_", "-")) or "unknown"


def device_signature(props: DeviceProperties) -> str:
    fields = props.signature_fields()
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:10]
    return f"{fields['vendor']}-{fields['name']}-{_arch_slug(props.arch)}-{props.compute_units}cu-{digest}"


@dataclass
class Device:
    """The handle a tuner (or a Ray actor) holds: a runtime, a device index, and its properties."""

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
    device = Device(runtime, index, props, TorchArrays(index), timer, stream)
    device.extras["capture_graph"] = lambda fn, repeats: torch_graph(device, fn, repeats)
    return device


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


def open_device(kind: str = "auto", index: int = 0) -> Device:
    """A device by runtime name ("cpu", "cuda", "hip"), or "auto": the first GPU runtime with a device, else the CPU."""
    if kind == "cpu":
        return cpu_device(index)
    if kind != "auto":
        return gpu_device(kind, index)
    from farm.devices.runtimes import RuntimeUnavailable

    for name in ("cuda", "hip"):
        try:
            return gpu_device(name, index)
        except RuntimeUnavailable:
            continue
    return cpu_device(index)


@dataclass(frozen=True)
class RuntimeProbe:
    """What one runtime sees here: its devices, or why none."""

    runtime: str
    devices: tuple[DeviceProperties, ...]
    note: str = ""


def probe(kinds: tuple[str, ...] = ("cuda", "hip")) -> list[RuntimeProbe]:
    """Every GPU runtime's devices (properties only; nothing is allocated), then the CPU."""
    from farm.devices.runtimes import RuntimeUnavailable, runtime_for

    out = []
    for kind in kinds:
        try:
            rt = runtime_for(kind)
            out.append(RuntimeProbe(kind, tuple(rt.properties(i) for i in range(rt.device_count()))))
        except RuntimeUnavailable as exc:
            out.append(RuntimeProbe(kind, (), str(exc)))
    out.append(RuntimeProbe("cpu", (cpu_device().properties,)))
    return out
