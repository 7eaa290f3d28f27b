"""Runtimes on a CPU machine: the CPU runtime, the GPU adapter against fake bindings, and the real
no-GPU paths of cuda-python and hip-python where they are installed."""

import enum
import os
import subprocess
import sys
import textwrap
import time

import pytest

from farm.devices.runtimes.base import NoDeviceError, RuntimeCallError, RuntimeUnavailable
from farm.devices.runtimes import runtime_for
from farm.devices.runtimes.cpu import CpuRuntime
from farm.devices.runtimes.cuda import CudaBindings
from farm.devices.runtimes.gpu import GpuRuntime
from farm.devices.runtimes.hip import HipBindings
from farm.devices.timing import EventTimer


def test_cpu_runtime_contract():
    rt = CpuRuntime()
    assert rt.device_count() == 1
    s = rt.create_stream()
    a, b = rt.create_event(), rt.create_event()
    rt.record_event(a, s)
    time.sleep(0.005)
    rt.record_event(b, s)
    rt.synchronize_event(b)
    assert 4.0 <= rt.elapsed_ms(a, b) < 500
    buf = rt.malloc(64)
    rt.memset(buf, 7, 64)
    assert buf.nbytes == 64 and set(buf.tolist()) == {7}
    rt.flush_l2(s)
    rt.free(buf)
    rt.synchronize()
    assert EventTimer(rt, s).measure(lambda: time.sleep(0.003)) >= 2.5


# -- the adapter against fake bindings --------------------------------------------------------
class Err(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101


class FakeProp:
    def __init__(self, name=b"NVIDIA H200\x00\x00", major=9, minor=0):
        self.name = name
        self.major, self.minor = major, minor
        self.multiProcessorCount = 132
        self.totalGlobalMem = 150_000_000_000
        self.l2CacheSize = 60 << 20
        self.warpSize = 32
        self.pciDomainID, self.pciBusID, self.pciDeviceID = 0, 0x1B, 0
        self.uuid = type("U", (), {"bytes": bytes(range(16))})()


class FakeCuda:
    """Stands in for cuda.bindings.runtime: same call shapes, scripted results."""

    class cudaDeviceAttr:
        cudaDevAttrClockRate = "clock"

    class cudaMemcpyKind:
        cudaMemcpyDeviceToDevice = 3

    def __init__(self, devices=2, count_error=Err.cudaSuccess):
        self.devices = devices
        self.count_error = count_error
        self.calls = []

    def cudaGetDeviceCount(self):
        return (self.count_error, self.devices if self.count_error == 0 else None)

    def cudaGetDeviceProperties(self, i):
        return (Err.cudaSuccess, FakeProp()) if i < self.devices else (Err.cudaErrorInvalidDevice, None)

    def cudaDeviceGetAttribute(self, attr, i):
        return (Err.cudaSuccess, 1_980_000)

    def cudaRuntimeGetVersion(self):
        return (Err.cudaSuccess, 13030)

    def cudaDriverGetVersion(self):
        return (Err.cudaSuccess, 13000)

    def cudaMalloc(self, n):
        self.calls.append(("malloc", n))
        return (Err.cudaErrorMemoryAllocation, None) if n > 1 << 40 else (Err.cudaSuccess, 0xDEAD0000)

    def cudaFree(self, p):
        return (Err.cudaSuccess,)

    def cudaGetErrorString(self, e):
        return (Err.cudaSuccess, b"out of memory")


def fake_runtime(module):
    class Bindings(CudaBindings):
        def load(self):
            return module

        def libraries(self):
            return {"torch": "2.11.0"}

    return GpuRuntime(Bindings())


def test_adapter_properties_and_versions():
    rt = fake_runtime(FakeCuda())
    p = rt.properties(1)
    assert (p.vendor, p.name, p.arch, p.compute_units, p.clock_mhz) == ("nvidia", "NVIDIA H200", "sm_90", 132, 1980)
    assert p.runtime_version == "13.3" and p.pci_bus == "0000:1b:00.0" and p.uuid == bytes(range(16)).hex()
    assert p.signature.startswith("nvidia-h200-sm90-132cu-")


def test_adapter_turns_error_codes_into_exceptions_naming_the_call():
    rt = fake_runtime(FakeCuda())
    assert rt.malloc(1024) == 0xDEAD0000
    with pytest.raises(RuntimeCallError) as info:
        rt.malloc(1 << 50)
    assert str(info.value) == "cudaMalloc(1125899906842624) failed: cudaErrorMemoryAllocation (2): out of memory"
    assert info.value.code == 2 and info.value.call.startswith("cudaMalloc")
    with pytest.raises(RuntimeCallError, match=r"cudaGetDeviceProperties\(5\).*valid indices are 0..1"):
        rt.properties(5)
    with pytest.raises(NoDeviceError, match="no NVIDIA GPU visible"):
        fake_runtime(FakeCuda(count_error=Err.cudaErrorNoDevice)).device_count()
    with pytest.raises(RuntimeUnavailable, match="no usable NVIDIA driver"):
        fake_runtime(FakeCuda(count_error=Err.cudaErrorInsufficientDriver)).device_count()
    with pytest.raises(RuntimeUnavailable, match="have no cudaStreamCreate"):
        rt.create_stream()


class FakeHip:
    """hip-python shapes: 7.x fills a struct, 10.x returns it; the library loads at the first call."""

    class hipDeviceAttribute_t:
        hipDeviceAttributeClockRate = "clock"

    def __init__(self, style, fail=None):
        self.style, self.fail = style, fail

        class Prop(FakeProp):
            def __init__(self):
                super().__init__(name=b"AMD Instinct MI300X")
                self.gcnArchName = b"gfx942:sramecc+:xnack-\x00"

        self.hipDeviceProp_t = Prop
        if style == 7:
            def hipGetDeviceProperties(prop, deviceId):
                return (Err.cudaSuccess,)
        else:
            def hipGetDeviceProperties(deviceId):
                return (Err.cudaSuccess, Prop())
        self.hipGetDeviceProperties = hipGetDeviceProperties

    def hipGetDeviceCount(self):
        if self.fail:
            raise RuntimeError(self.fail)
        return (Err.cudaSuccess, 1)

    def hipDeviceGetAttribute(self, attr, i):
        return (Err.cudaSuccess, 2_100_000)

    def hipRuntimeGetVersion(self):
        return (Err.cudaSuccess, 60241134)

    def hipDriverGetVersion(self):
        return (Err.cudaSuccess, 60241134)


def hip_with(module):
    class Bindings(HipBindings):
        def load(self):
            return module

    return GpuRuntime(Bindings())


@pytest.mark.parametrize("style", [7, 10])
def test_hip_properties_for_both_hip_python_signatures(style):
    p = hip_with(FakeHip(style)).properties(0)
    assert (p.vendor, p.arch, p.compute_units, p.clock_mhz) == ("amd", "gfx942:sramecc+:xnack-", 132, 2100)
    assert p.runtime_version == "6.2.41134"
    assert p.signature.startswith("amd-instinct-mi300x-gfx942-132cu-")


def test_hip_load_failures_are_explained():
    missing = hip_with(FakeHip(10, fail="failed to dlopen 'b'libamdhip64.so'': b'libamdhip64.so: cannot open shared object file'"))
    with pytest.raises(RuntimeUnavailable, match=r"no HIP runtime found: libamdhip64.so could not be loaded .*searched"):
        missing.device_count()
    old = hip_with(FakeHip(10, fail="failed to dlsym 'b'hipGetDevicePropertiesR0600''"))
    with pytest.raises(RuntimeUnavailable, match="older than this hip-python expects"):
        old.device_count()


# -- the real bindings, where installed (CI installs both) ------------------------------------
def test_real_cuda_python_without_a_gpu():
    pytest.importorskip("cuda.bindings.runtime", reason="cuda-python not installed (pip install 'tunefarm[cuda]')")
    rt = runtime_for("cuda")
    try:
        n = rt.device_count()
    except RuntimeUnavailable as exc:
        assert "NVIDIA" in str(exc)
        return
    pytest.skip(f"a CUDA GPU is visible ({n}); the GPU tests cover this machine")


def test_real_hip_python_load_and_no_device_paths(tmp_path, repo_root):
    pytest.importorskip("hip", reason="hip-python not installed (pip install 'tunefarm[rocm]')")
    rt = runtime_for("hip")
    try:
        n = rt.device_count()
    except NoDeviceError as exc:
        assert str(exc) == "no AMD GPU visible (hipErrorNoDevice)"
        with pytest.raises(RuntimeCallError, match=r"hipMalloc\(1024\) failed: hipError"):
            rt.malloc(1024)  # with no device, calls fail with an error code, not a crash
        try:  # Debian's ROCm 5.2 lacks the symbol hip-python 10 uses for properties
            rt.call("GetDeviceProperties", 0)
        except RuntimeUnavailable as exc2:
            assert "older than this hip-python expects" in str(exc2)
        except RuntimeCallError:
            pass  # a newer runtime reports the missing device instead
    except RuntimeUnavailable as exc:
        assert "no HIP runtime found" in str(exc)  # no libamdhip64 on this machine
    else:
        pytest.skip(f"an AMD GPU is visible ({n})")
    # a library that exists but cannot be loaded: hip-python picks $ROCM_PATH/lib first
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libamdhip64.so").write_text("not an ELF file")
    code = textwrap.dedent("""
        from farm.devices.runtimes import runtime_for, RuntimeUnavailable
        try:
            runtime_for("hip").device_count()
        except RuntimeUnavailable as exc:
            print(exc)
    """)
    env = dict(os.environ, ROCM_PATH=str(tmp_path), PYTHONPATH=repo_root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "no HIP runtime found" in out and str(tmp_path / "lib") in out, out


def test_event_timer_enqueues_the_lead_before_the_start_event():
    order = []

    class Rt(CpuRuntime):
        def record_event(self, event, stream):
            order.append("event")
            super().record_event(event, stream)

    rt = Rt()
    timer = EventTimer(rt, None, lead=lambda: order.append("lead"))
    timer.measure(lambda: order.append("work"))
    assert order == ["lead", "event", "work", "event"]
