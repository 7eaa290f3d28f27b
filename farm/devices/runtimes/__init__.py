"""Device runtimes behind one interface (base.Runtime): CPU, CUDA (cuda-python), HIP (hip-python).

``runtime_for("cuda")`` and friends accept a name or return the instance given.
"""

from __future__ import annotations

from typing import Any

from farm.devices.runtimes.base import NoDeviceError, Runtime, RuntimeCallError, RuntimeUnavailable

RUNTIME_NAMES = ("cpu", "cuda", "hip")


def runtime_for(kind: str | Any) -> Any:
    """A runtime by name ("cpu", "cuda", "hip"), or the runtime object passed in."""
    if not isinstance(kind, str):
        return kind
    if kind == "cpu":
        from farm.devices.runtimes.cpu import CpuRuntime

        return CpuRuntime()
    if kind == "cuda":
        from farm.devices.runtimes.cuda import cuda_runtime

        return cuda_runtime()
    if kind == "hip":
        from farm.devices.runtimes.hip import hip_runtime

        return hip_runtime()
    from farm.errors import InputError

    raise InputError(f"unknown runtime; choose one of {', '.join(RUNTIME_NAMES)}", field="runtime", value=kind)


__all__ = ["NoDeviceError", "RUNTIME_NAMES", "Runtime", "RuntimeCallError", "RuntimeUnavailable", "runtime_for"]
