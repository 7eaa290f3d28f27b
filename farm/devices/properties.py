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
from dataclasses import asdict, dataclass
from typing import Any, Mapping

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
    def parse(data: Any, *, source: str = "", field: str = "properties") -> "DeviceProperties":
        """Properties read from a file: every field checked, an InputError naming the one that is wrong."""
        from farm.errors import InputError

        if not isinstance(data, Mapping):
            raise InputError("expected a mapping of device properties", field=field, value=data, source=source)
        for name, kind in _FIELD_TYPES.items():
            if name not in data:
                raise InputError("missing", field=f"{field}.{name}", source=source)
            v = data[name]
            if not isinstance(v, kind) or isinstance(v, bool):
                raise InputError(f"expected {'an integer' if kind is int else 'a string'}", field=f"{field}.{name}",
                                 value=v, source=source)
        libs = data.get("libraries", {})
        pairs = list(libs.items()) if isinstance(libs, Mapping) else libs if isinstance(libs, list) else None
        if pairs is None or not all(isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                    for p in pairs):
            raise InputError("expected a mapping of library names to version strings", field=f"{field}.libraries",
                             value=libs, source=source)
        for name in ("index",):
            if name in data and (not isinstance(data[name], int) or isinstance(data[name], bool)):
                raise InputError("expected an integer", field=f"{field}.{name}", value=data[name], source=source)
        for name in ("uuid", "host", "pci_bus"):
            if name in data and not isinstance(data[name], str):
                raise InputError("expected a string", field=f"{field}.{name}", value=data[name], source=source)
        return DeviceProperties.from_dict({**data, "libraries": dict(pairs)})

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "DeviceProperties":
        fields = {k: data[k] for k in DeviceProperties.__dataclass_fields__ if k in data}
        libs = fields.get("libraries", ())
        fields["libraries"] = tuple(sorted((dict(libs) if isinstance(libs, Mapping) else dict(libs)).items()))
        return DeviceProperties(**fields)


_FIELD_TYPES: dict[str, type] = {"vendor": str, "name": str, "arch": str, "compute_units": int, "total_memory": int,
                                 "l2_bytes": int, "clock_mhz": int, "warp_size": int, "driver_version": str,
                                 "runtime_version": str}


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
