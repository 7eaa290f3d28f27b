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


def test_replay_hands_back_the_librarys_own_output(monkeypatch):
    """No copy into a buffer of ours: the tensor the library call returned is the tensor the caller gets."""
    F = torch.nn.functional
    seen = []

    def spying(fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            seen.append(out)
            return out
        return call

    monkeypatch.setattr(F, "conv2d", spying(F.conv2d))
    monkeypatch.setattr(F, "scaled_dot_product_attention", spying(F.scaled_dot_product_attention))
    monkeypatch.setattr(torch, "matmul", spying(torch.matmul))
    ops.reset()
    x = torch.randn(2, 8, 16, 16, device="cuda", dtype=torch.float16)
    w = torch.randn(16, 8, 3, 3, device="cuda", dtype=torch.float16)
    for _ in range(2):
        y = ops.conv2d(x, w, padding=1)
    assert y is seen[-1]
    q = torch.randn(1, 4, 64, 64, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        o = ops.sdpa(q, q, q, causal=True)
    assert o is seen[-1]
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        c = ops.matmul(a, a.t())
    assert c is seen[-1]


def test_default_knob_plans_enter_no_flag_context():
    from engines.gpu.conv import TorchConv
    from engines.gpu.matmul import TorchMatmul
    from farm.devices.device import gpu_device
    from farm.model.problem import Problem

    dev = gpu_device("cuda", 0)
    conv = Problem.create("conv_fprop", {"X": [2, 8, 16, 16], "W": [16, 8, 3, 3]}, dtype="fp16",
                          criteria={"pad_h": 1, "pad_w": 1})
    plan = TorchConv().compile(conv, {"layout": "nchw", "deterministic": 0}, dev)
    assert not plan.context.needed()  # torch's defaults already hold: no per-call context
    mm = Problem.create("matmul", {"A": [64, 32], "B": [32, 16]}, dtype="bf16")
    assert TorchMatmul().compile(mm, {}, dev).context is None  # bf16: no matmul flag decides its result
    tf32 = Problem.create("matmul", {"A": [64, 32], "B": [32, 16]}, dtype="fp32", compute_dtype="tf32")
    assert TorchMatmul().compile(tf32, {}, dev).context.needed()  # TF32 is off by default: it must be switched on
    from engines.gpu.matmul import TorchBlas

    in_force = str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1].lower()
    other = "cublaslt" if in_force == "cublas" else "cublas"
    assert not TorchBlas().compile(mm, {"backend": in_force, "reduced_precision": 1}, dev).context.needed()
    assert TorchBlas().compile(mm, {"backend": other, "reduced_precision": 1}, dev).context.needed()


def test_replaying_a_triton_winner_on_a_cold_cache_starts_no_process(tmp_path, repo_root):
    import json
    import os
    import subprocess
    import sys

    from farm.devices.device import gpu_device
    from farm.store.overrides.entries import OverrideEntry
    from farm.store.overrides.files import write_overrides
    from farm.model.problem import Problem

    pytest.importorskip("triton")
    dev = gpu_device("cuda", 0)
    p = Problem.create("matmul", {"A": [512, 256], "B": [256, 384]}, dtype="fp16")
    knobs = (("BLOCK_K", 32), ("BLOCK_M", 64), ("BLOCK_N", 64), ("num_stages", 3), ("num_warps", 4))
    path = tmp_path / "ovr.json"
    write_overrides(path, [OverrideEntry.for_problem(p, "triton.gemm", knobs, {"rank": 0})],
                    device={"signature": dev.signature, "properties": dev.properties.to_dict()}, mode="replace")
    script = (
        "import os, torch, farm.ops as ops\n"
        "a = torch.randn(512, 256, device='cuda', dtype=torch.float16); b = torch.randn(256, 384, device='cuda', dtype=torch.float16)\n"
        "c = ops.matmul(a, b); torch.cuda.synchronize()\n"
        "me = str(os.getpid())\n"
        "kids = [d for d in os.listdir('/proc') if d.isdigit() and open(f'/proc/{d}/stat').read().rsplit(')', 1)[1].split()[1] == me]\n"
        "ch = ops.choices()[0]\n"
        "print(ch['engine'], len(kids))\n"
        "assert ch['engine'] == 'triton.gemm' and not kids, (ch, kids)\n"
        "assert (c.float() - (a.float() @ b.float())).abs().max() < 0.5\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(PYTHONPATH=repo_root, FARM_HEUR_CONFIG_PATH=str(path), TRITON_CACHE_DIR=str(tmp_path / "cold"))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(path.read_text())["engine_overrides"][0]["engine_name"] == "triton.gemm"


def test_no_measurement_during_cuda_graph_capture(tmp_path):
    """Tuning on, a new shape met inside torch.cuda.graph: the heuristic's choice is captured (no timing runs
    launched into the graph), pinned afterwards; the graph's replay computes the right answer."""
    ops.enable()
    ops.set_filename(str(tmp_path / "results.json"))
    ops.set_max_tuning_duration(2)
    warm = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    ops.matmul(warm, warm)  # outside capture: opens the runtime and tunes this shape
    rt = ops.runtime("cuda", 0)
    assert rt.measurements == 1
    a = torch.randn(384, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = ops.matmul(a, b)
    assert rt.measurements == 1  # nothing measured during the capture
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(c.float(), (a @ b).float(), rtol=2e-2, atol=2e-2)
    during = [x for x in ops.choices() if x["problem"].startswith("matmul A[384,256]")]
    assert len(during) == 1 and during[0]["source"] not in ("tuned", "recorded")
    ops.matmul(a, b)  # after the capture: still the pinned choice, still not measured
    assert rt.measurements == 1
