"""CUDA C++ kernels compiled at run time with NVRTC and launched with the driver API (cuda-python).

For hand-written CUDA engines (cuda.decode_gemm): finding the bindings, compiling a source with its
compile-time constants for one device, launching on the caller's stream.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Mapping, Sequence


@functools.lru_cache(maxsize=1)
def bindings() -> tuple[Any, str]:
    """((nvrtc, driver), "") from cuda-python with NVRTC's library found, or (None, why)."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError as exc:
        return None, f"cuda-python is not installed (pip install 'tunefarm[cuda]'): {exc}"
    try:
        nvrtc.nvrtcVersion()  # loads libnvrtc: a CUDA build of torch brings it (nvidia-cuda-nvrtc), as does a toolkit
    except Exception as exc:
        return None, f"NVRTC is not found (pip install nvidia-cuda-nvrtc, or a CUDA toolkit): {exc}"
    return (nvrtc, driver), ""


def check(result: Any, what: str) -> Any:
    """The values a cuda-python call returns after its status, or an error naming the call."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(getattr(status, "value", status)) != 0:
        raise RuntimeError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


def compile_cubin(source: str, name: str, arch: str, defines: Mapping[str, int]) -> bytes:
    """NVRTC-compile ``source`` for ``arch`` (e.g. sm_90) with ``-D`` constants; the cubin, or an error with
    NVRTC's log."""
    (nvrtc, _), _ = bindings()
    options = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device"]
    options += [f"-D{key}={value}".encode() for key, value in defines.items()]
    program = check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
                    "nvrtcCreateProgram")
    try:
        status = nvrtc.nvrtcCompileProgram(program, len(options), options)[0]
        if int(getattr(status, "value", status)) != 0:
            size = check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = b" " * size
            check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
            raise RuntimeError(f"{name}: NVRTC could not compile {dict(defines)}: "
                               f"{log.decode(errors='replace').strip()}")
        size = check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return cubin


def load_function(cubin: bytes, function: str, device_index: int) -> Any:
    """Load a cubin into the device's primary context (torch's) and return one of its kernels."""
    (_, driver), _ = bindings()
    check(driver.cuInit(0), "cuInit")
    if int(check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")) == 0:
        # a compile thread that has not used CUDA yet: torch's (the runtime's) primary context
        dev = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        check(driver.cuCtxSetCurrent(check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")),
              "cuCtxSetCurrent")
    image = ctypes.create_string_buffer(cubin, len(cubin))
    module = check(driver.cuModuleLoadData(ctypes.addressof(image)), "cuModuleLoadData")
    return check(driver.cuModuleGetFunction(module, function.encode()), "cuModuleGetFunction")


def compile_function(source: str, function: str, arch: str, device_index: int, defines: Mapping[str, int]) -> Any:
    """``source`` compiled for the device and loaded: the CUfunction named ``function``."""
    return load_function(compile_cubin(source, function, arch, defines), function, device_index)


class Launcher:
    """Launches one kernel, whose arguments are all pointers, on the caller's current stream.

    The argument array (``void*[n]`` and the ``void**`` that points into it) is made once per thread and
    its values set in place each call: cuda-python then passes an address, where a tuple of values and
    types would be packed into fresh memory at every launch. cuLaunchKernel copies the values at launch,
    and a thread's array is its own, so concurrent launches from other threads cannot change them.
    """

    def __init__(self, function: Any, stream_of: Any, device_index: int, what: str) -> None:
        self._function = function
        self._stream_of = stream_of
        self._index = device_index
        self._driver = bindings()[0][1]
        self._what = what
        self._local = threading.local()

    def _arguments(self, n: int) -> tuple[Any, int]:
        found = getattr(self._local, "args", None)
        if found is None or len(found[0]) != n:
            values = (ctypes.c_void_p * n)()
            size = ctypes.sizeof(ctypes.c_void_p)
            slots = (ctypes.c_void_p * n)(*(ctypes.addressof(values) + i * size for i in range(n)))
            found = self._local.args = (values, slots, ctypes.addressof(slots))
        return found[0], found[2]

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], pointers: Sequence[int]) -> None:
        values, address = self._arguments(len(pointers))
        values[:] = pointers
        check(self._driver.cuLaunchKernel(self._function, *grid, *block, 0, self._stream_of(self._index), address, 0),
              f"{self._what}: cuLaunchKernel")
