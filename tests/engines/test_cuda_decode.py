"""cuda.decode_gemm (CUDA C++ tensor-core decode GEMM through NVRTC) without a GPU: what it takes, what it lists,
that it compiles.

Its results on a GPU are checked in tests/gpu/test_library_engines.py.
"""

import itertools
import math
import sys

import pytest

from fakes import fake_device, fake_props
from farm.devices.device import Device
from farm.model.problem import Problem


def gpu_like_device(arch="sm_90"):
    cpu = fake_device()
    return Device(cpu.runtime, 0, fake_props(arch=arch), cpu.arrays, cpu.timer)


@pytest.fixture
def engine(monkeypatch):
    import engines.gpu._common as common
    import engines.gpu.cuda_decode as decode

    monkeypatch.setattr(common, "torch_or_reason", lambda: (object(), ""))
    monkeypatch.setattr(decode, "bindings", lambda: ((object(), object()), ""))
    from farm.model.engine import default_engine_registry

    return default_engine_registry().get("cuda.decode_gemm")


def reason(engine, problem, device=None):
    from farm.model.engine import default_engine_registry

    return default_engine_registry().config_for(engine, problem, device or gpu_like_device()).reason


def test_it_takes_few_rows_of_row_major_half_precision_operands(engine):
    ok = Problem.create("matmul", {"A": [1, 4096], "B": [4096, 1024], "bias": [1024]}, dtype="bf16")
    assert reason(engine, ok) == ""
    assert reason(engine, Problem.create("matmul", {"A": [16, 4096], "B": [4096, 4104]}, dtype="fp16")) == ""
    assert "M <= 16" in reason(engine, Problem.create("matmul", {"A": [17, 4096], "B": [4096, 1024]}, dtype="bf16"))
    col_major = Problem.create("matmul", {"A": [1, 64], "B": {"dims": [64, 128], "strides": [1, 64]}}, dtype="bf16")
    assert "row-major" in reason(engine, col_major)
    assert "multiples of 8" in reason(engine, Problem.create("matmul", {"A": [1, 64], "B": [64, 100]}, dtype="bf16"))
    assert "fp32" in reason(engine, Problem.create("matmul", {"A": [1, 64], "B": [64, 128]}))  # fp32 data
    batched = Problem.create("matmul", {"A": [2, 1, 64], "B": [64, 128]}, dtype="bf16")
    assert "2-D" in reason(engine, batched)
    assert "sm_80" in reason(engine, ok, gpu_like_device("sm_75"))
    assert "NVIDIA or AMD" in reason(engine, ok, fake_device())


def test_clusters_need_sm_90_and_big_blocks_are_refused_with_the_reason(engine):
    problem = Problem.create("matmul", {"A": [16, 4096], "B": [4096, 4096]}, dtype="bf16")
    ampere = gpu_like_device("sm_80")
    assert engine.knob_support(problem, ampere, {"KS": 2, "WARPS": 8, "CL": 1})
    assert "sm_90" in engine.knob_support(problem, ampere, {"KS": 2, "WARPS": 8, "CL": 2}).reason
    assert engine.knob_support(problem, gpu_like_device(), {"KS": 4, "WARPS": 8, "CL": 8})
    # every listing is on the device: nothing with clusters on sm_80
    assert all(p["CL"] == 1 for p in engine.list_plans(problem, ampere))


def test_listing_puts_grids_near_a_block_per_sm_first_and_keeps_the_limit(engine, monkeypatch):
    dev = gpu_like_device()
    sms = dev.properties.compute_units
    monkeypatch.setenv("FARM_LIBRARY_PLANS", "100")
    for k, n in ((4096, 1024), (4096, 14336), (1000, 392)):
        problem = Problem.create("matmul", {"A": [1, k], "B": [k, n]}, dtype="bf16")
        plans = engine.list_plans(problem, dev)
        every = [dict(zip(("KS", "WARPS", "CL"), v)) for v in itertools.product((1, 2, 4), (4, 8), (1, 2, 4, 8))]
        assert sorted(map(str, plans)) == sorted(map(str, every))  # one row group: every shape fits
        strips = -(-n // 64)
        # blocks of 8 warps over SMs, as a power of two away from one
        distance = [abs(math.log2(strips * p["CL"] * p["WARPS"] / 8 / sms)) for p in plans]
        assert distance == sorted(distance) and distance[0] < distance[-1]
    monkeypatch.setenv("FARM_LIBRARY_PLANS", "3")
    assert len(engine.list_plans(problem, dev)) == 3


def test_no_workspace_and_a_strip_of_64_columns_per_block_along_n(engine):
    problem = Problem.create("matmul", {"A": [2, 4096], "B": [4096, 1000]}, dtype="fp16")
    knobs = {"KS": 2, "WARPS": 8, "CL": 4}
    assert engine.estimate_workspace(problem, knobs) == 0
    assert engine._grid(problem, knobs) == (16, 4)


@pytest.fixture
def real_bindings(monkeypatch):
    """The engine's own cuda-python probe (cached), torch faked; the cache cleared before and after."""
    import engines.gpu._common as common
    import engines.gpu.nvrtc as nvrtc
    from farm.model.engine import default_engine_registry

    monkeypatch.setattr(common, "torch_or_reason", lambda: (object(), ""))
    nvrtc.bindings.cache_clear()
    yield default_engine_registry().get("cuda.decode_gemm")
    nvrtc.bindings.cache_clear()


def test_without_cuda_python_discovery_names_the_extra(monkeypatch, real_bindings):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # its import fails, as where it is not installed
    problem = Problem.create("matmul", {"A": [1, 4096], "B": [4096, 1024]}, dtype="bf16")
    assert "tunefarm[cuda]" in reason(real_bindings, problem)


def test_without_nvrtc_discovery_says_where_it_comes_from(monkeypatch, real_bindings):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python is not installed")

    def missing():
        raise RuntimeError('Failure finding "libnvrtc.so.13"')

    monkeypatch.setattr(nvrtc, "nvrtcVersion", missing)
    problem = Problem.create("matmul", {"A": [1, 4096], "B": [4096, 1024]}, dtype="bf16")
    assert "NVRTC is not found (pip install nvidia-cuda-nvrtc" in reason(real_bindings, problem)


def shape(m, k, n, ldc=None):
    return {"M_ROWS": m, "K_SIZE": k, "N_SIZE": n, "LDA_": k, "LDB_": n, "LDCM_": ldc or n, "LDCN_": 1}


@pytest.mark.parametrize("defines", [
    {**shape(1, 4096, 1024), "IN_BF16": 1, "HAS_BIAS": 0, "A_PAIRS": 1, "KS": 4, "WARPS": 8, "CL": 8},
    {**shape(16, 14336, 4096), "IN_BF16": 0, "HAS_BIAS": 1, "A_PAIRS": 1, "KS": 2, "WARPS": 4, "CL": 1},
    {**shape(5, 1001, 136), "IN_BF16": 1, "HAS_BIAS": 1, "A_PAIRS": 0, "KS": 1, "WARPS": 8, "CL": 2},
], ids=lambda d: "M{M_ROWS}-K{K_SIZE}-N{N_SIZE}-KS{KS}-W{WARPS}-CL{CL}".format(**d))
def test_the_kernel_compiles_with_nvrtc_where_nvrtc_is_installed(defines):
    import engines.gpu.cuda_decode as decode
    from engines.gpu.nvrtc import bindings, compile_cubin

    bindings.cache_clear()
    found, why = bindings()
    if found is None:  # cuda-python without libnvrtc (the nvidia-cuda-nvrtc wheel or a CUDA toolkit)
        pytest.skip(why)
    assert len(compile_cubin(decode.SOURCE, "decode_gemm", "sm_90", defines)) > 0
