"""triton.gemv (one row of A times nn.Linear's B = W.T) without a GPU: what it takes, what it lists, what its
kernel is told. Its results on a GPU are checked in tests/gpu/test_gpu_engines.py."""

import pytest

from fakes import gpu_engine_without_a_gpu, gpu_like_device
from farm.model.problem import Problem


@pytest.fixture
def engine(monkeypatch):
    return gpu_engine_without_a_gpu(monkeypatch, "triton.gemv")


def linear(m=1, k=3584, n=4608, bias=False, dtype="bf16", ldw=None, **kw):
    tensors = {"A": [m, k], "B": {"dims": [k, n], "strides": [1, ldw or k]}}
    if bias:
        tensors["bias"] = [n]
    return Problem.create("matmul", tensors, dtype=dtype, **kw)


def reason(engine, problem):
    from farm.model.engine import default_engine_registry

    return default_engine_registry().config_for(engine, problem, gpu_like_device()).reason


def test_it_takes_one_row_of_a_and_nn_linears_weight_layout(engine):
    assert reason(engine, linear()) == ""  # Qwen2.5-7B's o projection at M = 1
    assert reason(engine, linear(bias=True, dtype="fp16")) == ""
    assert "M=8" in reason(engine, linear(m=8))
    assert "contiguous along K" in reason(engine, Problem.create("matmul", {"A": [1, 512], "B": [512, 256]},
                                                                    dtype="bf16"))
    assert "multiple of 8" in reason(engine, linear(k=500, ldw=500))
    assert "fp32" in reason(engine, linear(dtype="fp32"))
    assert "one dtype" in reason(engine, Problem.create(
        "matmul", {"A": {"dims": [1, 64], "dtype": "fp16"}, "B": {"dims": [64, 32], "strides": [1, 64]}},
        dtype="bf16"))


def test_listed_plans_fit_the_registers_and_k(engine):
    plans = engine.list_plans(linear(), gpu_like_device())
    assert plans and all(engine.knob_support(linear(), None, p) for p in plans)
    assert all(p["BLOCK_N"] * p["BLOCK_K"] <= 8192 for p in plans)
    short = engine.list_plans(linear(k=256, n=1024), gpu_like_device())
    assert short and max(p["BLOCK_K"] for p in short) <= 512  # no step far longer than K
    assert not engine.knob_support(linear(), None, {"BLOCK_N": 16, "BLOCK_K": 2048})


def test_kernel_arguments_follow_the_problem(engine):
    scalars, meta, grid = engine._launch(linear(bias=True, ldw=3592), {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4})
    assert scalars == (4608, 3584, 1, 3592, 1)  # N, K, A's K stride, W's row stride, C's N stride
    assert grid == (4608 // 4, 1, 1)
    assert meta["HAS_BIAS"] and not meta["EVEN_K"]  # 3584 is not a multiple of 1024: K masked
    _, meta, grid = engine._launch(linear(k=4096, n=1001), {"BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4})
    assert meta["EVEN_K"] and not meta["HAS_BIAS"] and grid == (126, 1, 1)  # the last program's rows masked
