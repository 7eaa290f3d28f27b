"""farm.ops on torch GPU tensors: right results on the caller's stream, tune once, replay from the file."""

import pytest

from .conftest import cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
torch = pytest.importorskip("torch", reason="farm.ops on the GPU needs torch")

import farm.ops as ops  # noqa: E402


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    for name in ("FARM_TUNABLE_ENABLED", "FARM_TUNABLE_TUNING", "FARM_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER"):
        monkeypatch.delenv(name, raising=False)
    ops.reset()
    yield
    ops.reset()


def test_ops_compute_on_the_gpu_and_on_the_current_stream():
    a = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    b = torch.randn(128, 64, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        c = ops.matmul(a, b)
    side.synchronize()
    assert c.device.type == "cuda" and c.dtype == torch.float16 and c.shape == (256, 64)
    assert torch.allclose(c.float(), (a @ b).float(), rtol=1e-2, atol=1e-2)
    q = torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
    o = ops.sdpa(q, kv, kv, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv.repeat_interleave(4, 1), kv.repeat_interleave(4, 1),
                                                           is_causal=True)
    assert (o.float() - ref.float()).norm() / ref.float().norm() < 3e-2
    x = torch.randn(4, 8, 16, 16, device="cuda", dtype=torch.float16)
    w = torch.randn(16, 8, 3, 3, device="cuda", dtype=torch.float16)
    y = ops.conv2d(x, w, padding=1, stride=2)
    ref = torch.nn.functional.conv2d(x, w, padding=1, stride=2)
    assert y.shape == ref.shape and (y.float() - ref.float()).norm() / ref.float().norm() < 1e-2
    assert {c["source"] for c in ops.choices()} == {"SelectionHeuristic::StaticOrdering"}


def test_tune_records_then_a_new_runtime_replays_without_measuring(tmp_path):
    a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
    ops.enable()
    ops.set_filename(str(tmp_path / "results.json"))
    ops.set_max_tuning_duration(5)
    ops.matmul(a, a)
    tuned = ops.choices()[0]
    assert tuned["source"] == "tuned" and ops.runtime("cuda", 0).measurements == 1
    assert (tmp_path / "results0.json").exists()

    ops.reset()  # as a fresh process would start
    ops.enable()
    ops.tuning_enable(False)
    ops.set_filename(str(tmp_path / "results.json"))
    c = ops.matmul(a, a)
    replayed = ops.choices()[0]
    assert ops.runtime("cuda", 0).measurements == 0
    assert (replayed["engine"], replayed["knobs"], replayed["source"]) == (tuned["engine"], tuned["knobs"], "recorded")
    assert torch.allclose(c.float(), (a @ a).float(), rtol=3e-2, atol=3e-1)
