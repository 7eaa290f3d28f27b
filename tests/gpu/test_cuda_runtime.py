"""The CUDA runtime, device properties and event timing on a real NVIDIA GPU (the H200 here)."""

import json
import os
import subprocess
import sys
import time

import pytest

from .conftest import cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()


def test_properties_agree_with_torch():
    torch = pytest.importorskip("torch", reason="torch is needed to cross-check the properties")
    for i in range(COUNT):
        mine = RT.properties(i)
        theirs = torch.cuda.get_device_properties(i)
        assert mine.vendor == "nvidia"
        assert mine.name == theirs.name
        assert mine.compute_units == theirs.multi_processor_count
        assert mine.total_memory == theirs.total_memory
        assert mine.arch == f"sm_{theirs.major}{theirs.minor}"
        assert mine.l2_bytes == theirs.L2_cache_size
        assert mine.warp_size == theirs.warp_size == 32
        assert mine.clock_mhz > 500
        assert mine.runtime_version.count(".") == 1 and mine.driver_version
        assert "torch" in mine.library_versions
        assert mine.uuid and mine.pci_bus


def test_signature_is_stable_across_processes_and_equal_across_gpus(repo_root):
    code = ("import json; from farm.devices.runtimes import runtime_for; rt = runtime_for('cuda'); "
            "print(json.dumps([rt.properties(i).signature for i in range(rt.device_count())]))")
    env = dict(os.environ, PYTHONPATH=repo_root)
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout) for _ in range(2)]
    assert runs[0] == runs[1] == [RT.properties(i).signature for i in range(COUNT)]
    assert len(set(runs[0])) == 1, f"GPUs of one model and software must share a signature: {runs[0]}"
    assert runs[0][0].startswith("nvidia-")
    if COUNT < 2:
        pytest.skip(f"only {COUNT} GPU visible: equality across GPUs checked on one")


def test_event_timing_of_a_device_copy_agrees_with_the_host_clock():
    from farm.devices.timing import EventTimer

    RT.set_device(0)
    nbytes = 1 << 30
    src, dst = RT.malloc(nbytes), RT.malloc(nbytes)
    stream = RT.create_stream()
    try:
        RT.memset(src, 7, nbytes)
        for _ in range(3):  # warm up
            RT.memcpy_async(dst, src, nbytes, stream)
        RT.synchronize()
        copies = 40

        def work():
            for _ in range(copies):
                RT.memcpy_async(dst, src, nbytes, stream)

        event_ms = EventTimer(RT, stream).measure(work)
        RT.synchronize()
        t0 = time.perf_counter()
        work()
        RT.synchronize_stream(stream)
        host_ms = (time.perf_counter() - t0) * 1e3
        ratio = event_ms / host_ms
        tbps = 2 * nbytes * copies / (event_ms / 1e3) / 1e12
        print(f"\n{copies} x 1 GiB device copies: events {event_ms:.2f} ms, host clock {host_ms:.2f} ms, "
              f"ratio {ratio:.3f}, {tbps:.2f} TB/s read+write")
        assert 0.95 <= ratio <= 1.05
        assert 0.5 < tbps < 10
    finally:
        RT.free(src)
        RT.free(dst)
        RT.destroy_stream(stream)


def test_bad_calls_come_back_as_clear_exceptions():
    from farm.devices.runtimes.base import RuntimeCallError

    with pytest.raises(RuntimeCallError) as info:
        RT.properties(COUNT + 7)
    assert f"cudaGetDeviceProperties({COUNT + 7})" in str(info.value) and "valid indices" in str(info.value)
    with pytest.raises(RuntimeCallError) as info:
        RT.malloc(1 << 50)  # 1 PiB
    text = str(info.value)
    assert "cudaMalloc(1125899906842624) failed" in text and "cudaErrorMemoryAllocation" in text
    with pytest.raises(RuntimeCallError, match="cudaSetDevice"):
        RT.set_device(COUNT + 3)
    RT.set_device(0)
    RT.synchronize()  # the context survives the failed calls


def test_l2_flush_and_device_handle():
    from farm.devices.device import gpu_device

    dev = gpu_device("cuda", 0)
    assert dev.signature == RT.properties(0).signature and dev.stream is not None
    ms = dev.timer.measure(lambda: dev.runtime.flush_l2(dev.stream))
    flushed = 2 * dev.properties.l2_bytes
    print(f"\nL2 flush of {flushed >> 20} MiB: {ms:.3f} ms")
    assert 0 < ms < 50


def test_flatbuffers_round_trip_of_real_properties():
    from farm.devices.fb import decode_device_properties, encode_device_properties

    props = RT.properties(0)
    assert decode_device_properties(encode_device_properties(props)) == props


def test_farm_devices_lists_the_gpus(repo_root):
    env = dict(os.environ, PYTHONPATH=repo_root)
    out = subprocess.run([sys.executable, "-m", "farm", "devices", "--json"], env=env, capture_output=True,
                         text=True, check=True, cwd=repo_root).stdout
    data = json.loads(out)
    gpus = [d for d in data["devices"] if d["vendor"] == "nvidia"]
    assert len(gpus) == COUNT and {d["index"] for d in gpus} == set(range(COUNT))
    assert any(d["vendor"] == "cpu" for d in data["devices"])
