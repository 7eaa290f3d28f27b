"""cuda.gemv (CUDA C++ split-K GEMV through NVRTC) without a GPU: what it takes, what it lists, that it compiles.

Its results on a GPU are checked in tests/gpu/test_gpu_engines.py.
"""

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
    import engines.gpu.cuda_gemv as gemv

    monkeypatch.setattr(common, "torch_or_reason", lambda: (object(), ""))
    monkeypatch.setattr(gemv, "bindings", lambda: ((object(), object()), ""))
    from farm.model.engine import default_engine_registry

    return default_engine_registry().get("cuda.gemv")


def reason(engine, problem, device=None):
    from farm.model.engine import default_engine_registry

    return default_engine_registry().config_for(engine, problem, device or gpu_like_device()).reason


def test_it_takes_few_rows_of_row_major_half_precision_operands(engine):
    ok = Problem.create("matmul", {"A": [1, 4096], "B": [4096, 1024], "bias": [1024]}, dtype="bf16")
    assert reason(engine, ok) == ""
    assert reason(engine, Problem.create("matmul", {"A": [8, 4096], "B": [4096, 4104]}, dtype="fp16")) == ""
    assert "M <= 8" in reason(engine, Problem.create("matmul", {"A": [16, 4096], "B": [4096, 1024]}, dtype="bf16"))
    col_major = Problem.create("matmul", {"A": [1, 64], "B": {"dims": [64, 128], "strides": [1, 64]}}, dtype="bf16")
    assert "row-major" in reason(engine, col_major)
    assert "multiples of 8" in reason(engine, Problem.create("matmul", {"A": [1, 64], "B": [64, 100]}, dtype="bf16"))
    assert "fp32" in reason(engine, Problem.create("matmul", {"A": [1, 64], "B": [64, 128]}))  # fp32 data
    batched = Problem.create("matmul", {"A": [2, 1, 64], "B": [64, 128]}, dtype="bf16")
    assert "2-D" in reason(engine, batched)
    assert "sm_80" in reason(engine, ok, gpu_like_device("sm_75"))
    assert "NVIDIA or AMD" in reason(engine, ok, fake_device())


@pytest.fixture
def real_bindings(monkeypatch):
    """The engine's own cuda-python probe (cached), torch faked; the cache cleared before and after."""
    import engines.gpu._common as common
    import engines.gpu.nvrtc as nvrtc
    from farm.model.engine import default_engine_registry

    monkeypatch.setattr(common, "torch_or_reason", lambda: (object(), ""))
    nvrtc.bindings.cache_clear()
    yield default_engine_registry().get("cuda.gemv")
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


def test_listed_block_shapes_split_k_into_16_to_256_slices_within_shared_memory(engine, monkeypatch):
    monkeypatch.setenv("FARM_LIBRARY_PLANS", "100")
    dev = gpu_like_device()
    for m, k in ((1, 4096), (8, 4096), (4, 14336)):
        problem = Problem.create("matmul", {"A": [m, k], "B": [k, 1024]}, dtype="bf16")
        plans = engine.list_plans(problem, dev)
        assert plans, (m, k)
        for knobs in plans:
            slices = engine._grid(problem, knobs)[1]
            assert 16 <= slices <= 256 and engine.knob_support(problem, dev, knobs)
        assert len({tuple(sorted(p.items())) for p in plans}) == len(plans)
    eight = Problem.create("matmul", {"A": [8, 4096], "B": [4096, 1024]}, dtype="bf16")
    assert not engine.knob_support(eight, dev, {"TY": 8})  # 7 x 8 rows x 256 columns of fp32: 56 KB
    assert "shared memory" in engine.knob_support(eight, dev, {"TY": 8}).reason
    monkeypatch.setenv("FARM_LIBRARY_PLANS", "3")
    assert len(engine.list_plans(eight, dev)) == 3


def test_workspace_is_the_partials_and_a_counter_per_column_strip_and_stream(engine):
    problem = Problem.create("matmul", {"A": [2, 4096], "B": [4096, 1000]}, dtype="fp16")
    knobs = {"KC": 4, "TY": 4, "STEPS": 2}  # 32 rows of K a block: 128 slices; 1000 columns: 4 strips
    assert engine._grid(problem, knobs) == (4, 128)
    assert engine.estimate_workspace(problem, knobs) == 128 * 2 * 1000 * 4 + 8 * 4 * 4
    assert engine._grid(Problem.create("matmul", {"A": [1, 100], "B": [100, 256]}, dtype="fp16"), knobs) == (1, 4)


@pytest.mark.parametrize("defines", [
    {"M_ROWS": 1, "IN_BF16": 1, "HAS_BIAS": 0, "KC": 8, "TY": 8, "STEPS": 1},
    {"M_ROWS": 8, "IN_BF16": 0, "HAS_BIAS": 1, "KC": 2, "TY": 1, "STEPS": 4},
    {"M_ROWS": 3, "IN_BF16": 1, "HAS_BIAS": 1, "KC": 4, "TY": 4, "STEPS": 2},
], ids=lambda d: "M{M_ROWS}-KC{KC}-TY{TY}-S{STEPS}".format(**d))
def test_the_kernel_compiles_with_nvrtc_where_nvrtc_is_installed(defines):
    import engines.gpu.cuda_gemv as gemv
    from engines.gpu.nvrtc import bindings, compile_cubin

    bindings.cache_clear()
    found, why = bindings()
    if found is None:  # cuda-python without libnvrtc (the nvidia-cuda-nvrtc wheel or a CUDA toolkit)
        pytest.skip(why)
    assert len(compile_cubin(gemv.SOURCE, "gemv_splitk", "sm_90", defines)) > 0
