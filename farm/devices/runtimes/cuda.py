"""CUDA through cuda-python (``cuda.bindings.runtime``)."""

from __future__ import annotations

import functools
import re
from typing import Any

from farm.devices.runtimes.base import NoDeviceError, RuntimeUnavailable
from farm.devices.runtimes.gpu import NO_DEVICE, GpuRuntime, dist_version

INSUFFICIENT_DRIVER = 35


class CudaBindings:
    name = "cuda"
    vendor = "nvidia"
    prefix = "cuda"

    def load(self) -> Any:
        try:
            from cuda.bindings import runtime
        except ImportError:
            try:
                from cuda import cudart as runtime  # cuda-python < 12.6 layout
            except ImportError:
                raise RuntimeUnavailable("cuda-python is not installed: pip install 'tunefarm[cuda]'") from None
        return runtime

    def device_properties(self, module: Any, index: int, call: Any) -> Any:
        return call("GetDeviceProperties", index)

    def arch(self, prop: Any) -> str:
        return f"sm_{int(prop.major)}{int(prop.minor)}"

    def clock_attribute(self, module: Any) -> Any:
        # clockRate left cudaDeviceProp in CUDA 13; the attribute remains
        return module.cudaDeviceAttr.cudaDevAttrClockRate

    def memcpy_device_to_device(self, module: Any) -> Any:
        return module.cudaMemcpyKind.cudaMemcpyDeviceToDevice

    def version_text(self, number: int) -> str:
        return f"{number // 1000}.{(number % 1000) // 10}"

    def driver_version(self, module: Any, call: Any) -> str:
        """The kernel driver's version (e.g. 580.159.04), else the CUDA version the driver supports."""
        try:
            with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
                m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", fh.read())
                if m:
                    return m.group(1)
        except OSError:
            pass
        try:
            import pynvml  # nvidia-ml-py, when installed

            pynvml.nvmlInit()
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:
            pass
        return self.version_text(int(call("DriverGetVersion")))

    def libraries(self) -> dict[str, str]:
        found = {
            "torch": dist_version("torch"),
            "triton": dist_version("triton"),
            "cublas": dist_version("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"),
            "cudnn": dist_version("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn"),
        }
        return {k: v for k, v in found.items() if v}

    def unavailable(self, exc: BaseException) -> RuntimeUnavailable:
        return RuntimeUnavailable(f"the CUDA runtime could not be loaded: {exc}")

    def no_device(self, code: int, name: str) -> RuntimeUnavailable:
        if code == NO_DEVICE:
            return NoDeviceError(f"no NVIDIA GPU visible ({name})")
        if code == INSUFFICIENT_DRIVER:
            return RuntimeUnavailable(f"no usable NVIDIA driver ({name}): no GPU here, or a driver older than the CUDA runtime")
        return RuntimeUnavailable(f"CUDA cannot list devices: {name} ({code})")


def loaded_cublaslt_version() -> str:
    """``cublasLtGetVersion()`` of the cuBLASLt this process has loaded (torch's, once it ran a GEMM), else of the
    one the loader finds; "" without one. The number the runtime tuner's CUBLASLT_VERSION validator holds: the
    library that runs, not the version of a pip wheel that may not be the one loaded (or may be absent)."""
    import ctypes.util

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            loaded = sorted({line.split()[-1] for line in fh if "libcublasLt" in line and "/" in line})
    except OSError:
        loaded = []
    if loaded:
        return _cublaslt_version_of(loaded[0])  # the process's own: asked once
    found = ctypes.util.find_library("cublasLt")
    return _cublaslt_version_of.__wrapped__(found) if found else ""  # not cached: torch may load another later


@functools.lru_cache(maxsize=4)
def _cublaslt_version_of(path: str) -> str:
    import ctypes

    try:
        get = ctypes.CDLL(path).cublasLtGetVersion
    except (OSError, AttributeError):
        return ""
    get.restype = ctypes.c_size_t
    return str(int(get()))


def cuda_runtime() -> GpuRuntime:
    return GpuRuntime(CudaBindings())
