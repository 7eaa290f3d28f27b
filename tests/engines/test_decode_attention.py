"""triton.decode_attention (split-KV attention for decode) without a GPU: what it takes, what it lists, what it
needs of scratch memory. Its results on a GPU are checked in tests/gpu/test_gpu_engines.py."""

import sys

import pytest

from fakes import gpu_engine_without_a_gpu, gpu_like_device
from farm.model.problem import Problem


@pytest.fixture
def engine(monkeypatch):
    return gpu_engine_without_a_gpu(monkeypatch, "triton.decode_attention")


def attention(batch=1, heads=28, kv_heads=4, queries=1, context=4096, dim=128, dtype="bf16", **kw):
    return Problem.create("sdpa_fwd", {"Q": [batch, heads, queries, dim], "K": [batch, kv_heads, context, dim],
                                       "V": [batch, kv_heads, context, dim]}, dtype=dtype, **kw)


def reason(engine, problem):
    from farm.model.engine import default_engine_registry

    return default_engine_registry().config_for(engine, problem, gpu_like_device()).reason


def test_it_takes_few_query_tokens_of_grouped_heads_without_a_causal_mask(engine):
    assert reason(engine, attention()) == ""  # Qwen2.5-7B's decode step
    assert reason(engine, attention(batch=32, heads=32, kv_heads=32, queries=4, dtype="fp16")) == ""
    assert "at most 16" in reason(engine, attention(queries=17))
    assert "causal" in reason(engine, attention(criteria={"causal": 1}))
    assert "rows a program" in reason(engine, attention(heads=64, kv_heads=1, queries=4))
    assert "head dim" in reason(engine, attention(dim=512))
    assert "fp32" in reason(engine, attention(dtype="fp32"))
    strided = Problem.create("sdpa_fwd", {"Q": {"dims": [1, 4, 1, 64], "strides": [256, 1, 256, 4]},
                                          "K": [1, 4, 256, 64], "V": [1, 4, 256, 64]}, dtype="bf16")
    assert "unit stride" in reason(engine, strided)


def test_without_triton_discovery_names_the_extra(engine, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    assert "tunefarm[triton]" in reason(engine, attention())


def test_listed_plans_fill_the_device_and_never_split_below_half_a_loop_step(engine):
    device = gpu_like_device(units=132)
    one = engine.list_plans(attention(), device)
    assert one and all(engine.knob_support(attention(), device, k) for k in one)
    # 4 key/value heads on 132 SMs: 32 or 64 chunks a head come first (128 or 256 programs), never 1
    assert one[0]["SPLITS"] in (32, 64) and all(k["SPLITS"] >= 16 for k in one)
    many = engine.list_plans(attention(batch=32), device)  # 128 heads already fill it: few chunks
    assert many[0]["SPLITS"] in (1, 2)
    short = attention(context=64)
    assert all(-(-64 // k["SPLITS"]) >= k["BLOCK_N"] // 2 for k in engine.list_plans(short, device))
    assert "half a loop step" in engine.knob_support(short, device, {"SPLITS": 64, "BLOCK_N": 64}).reason


def test_scratch_is_a_partial_output_and_a_log_sum_exp_per_chunk_and_query_row(engine):
    # 4 kv heads x 32 chunks x 16 rows (7 query heads padded to 16) x (128 dims + 1)
    assert engine.estimate_workspace(attention(), {"SPLITS": 32}) == 4 * 32 * 16 * 129 * 4
    # 8 query heads a group x 4 tokens = 32 rows
    assert engine.estimate_workspace(attention(heads=32, queries=4), {"SPLITS": 2}) == 4 * 2 * 32 * 129 * 4
