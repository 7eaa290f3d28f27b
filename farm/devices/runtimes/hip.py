"""HIP (AMD ROCm) through hip-python.

hip-python loads ``libamdhip64.so`` at the first call, not at import, and raises
RuntimeError when it cannot (dlopen) or when the library lacks a symbol the
bindings were built for (dlsym: e.g. Debian's ROCm 5.2 runtime has no
``hipGetDevicePropertiesR0600``). Between hip-python 7.x and 10.x,
``hipGetDeviceProperties`` changed from ``(prop, device)`` to ``(device)``
returning the struct; both are handled. Nobody on this project has an AMD GPU:
the load, no-device and error paths are tested on a CPU machine with Debian's
HIP runtime; the rest mirrors the CUDA path that runs on the H200.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from farm.devices.runtimes.base import NoDeviceError, RuntimeUnavailable
from farm.devices.runtimes.gpu import NO_DEVICE, GpuRuntime, dist_version, env_paths, text

HIP_LIBRARY = "libamdhip64.so"


class HipBindings:
    name = "hip"
    vendor = "amd"
    prefix = "hip"

    def load(self) -> Any:
        try:
            from hip import hip
        except ImportError:
            raise RuntimeUnavailable("hip-python is not installed: pip install 'tunefarm[rocm]'") from None
        return hip

    def device_properties(self, module: Any, index: int, call: Any) -> Any:
        fn = module.hipGetDeviceProperties
        try:
            takes_struct = len(inspect.signature(fn).parameters) == 2
        except (TypeError, ValueError):
            takes_struct = "prop" in (fn.__doc__ or "").split("\n", 1)[0].split("(", 1)[-1]
        if takes_struct:  # hip-python 7.x: fills a caller-made struct
            prop = module.hipDeviceProp_t()
            call("GetDeviceProperties", prop, index)
            return prop
        return call("GetDeviceProperties", index)  # 10.x: returns it

    def arch(self, prop: Any) -> str:
        return text(prop.gcnArchName) or f"gfx{int(prop.major)}{int(prop.minor)}"

    def clock_attribute(self, module: Any) -> Any:
        return module.hipDeviceAttribute_t.hipDeviceAttributeClockRate

    def memcpy_device_to_device(self, module: Any) -> Any:
        return module.hipMemcpyKind.hipMemcpyDeviceToDevice

    def version_text(self, number: int) -> str:
        return f"{number // 10_000_000}.{(number // 100_000) % 100}.{number % 100_000}"

    def driver_version(self, module: Any, call: Any) -> str:
        try:
            return Path("/sys/module/amdgpu/version").read_text(encoding="utf-8").strip()
        except OSError:
            return self.version_text(int(call("DriverGetVersion")))

    def libraries(self) -> dict[str, str]:
        found = {
            "torch": dist_version("torch"),
            "triton": dist_version("pytorch-triton-rocm", "triton"),
            "hipblaslt": dist_version("hipblaslt", "rocm-hipblaslt"),
        }
        rocm = Path(os.environ.get("ROCM_PATH", "/opt/rocm")) / ".info" / "version"
        try:
            found["rocm"] = rocm.read_text(encoding="utf-8").strip()
        except OSError:
            pass
        return {k: v for k, v in found.items() if v}

    def unavailable(self, exc: BaseException) -> RuntimeUnavailable:
        message = str(exc)
        if "dlopen" in message:
            rocm = os.environ.get("ROCM_PATH") or os.environ.get("ROCM_HOME") or "/opt/rocm"
            searched = ["the hip-python package", "rocm_sdk (ROCm wheels)", str(Path(rocm) / "lib")]
            searched += [f"LD_LIBRARY_PATH {p}" for p in env_paths("LD_LIBRARY_PATH")]
            searched.append("the system loader's cache (ldconfig)")
            reason = message.split(": ", 1)[-1].strip() if ": " in message else message
            return RuntimeUnavailable(f"no HIP runtime found: {HIP_LIBRARY} could not be loaded ({reason}); "
                                      f"searched {', '.join(searched)}. Install ROCm, or Debian's "
                                      f"libamdhip64-5 and libamdhip64-dev")
        if "dlsym" in message:
            return RuntimeUnavailable(f"the HIP runtime found is older than this hip-python expects: {message}")
        return RuntimeUnavailable(f"the HIP runtime failed: {message}")

    def no_device(self, code: int, name: str) -> RuntimeUnavailable:
        if code == NO_DEVICE:
            return NoDeviceError(f"no AMD GPU visible ({name})")
        return RuntimeUnavailable(f"HIP cannot list devices: {name} ({code})")


def hip_runtime() -> GpuRuntime:
    return GpuRuntime(HipBindings())
