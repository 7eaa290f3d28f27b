"""farm.apply in a serving process on a CUDA GPU: torch.compile(mode="reduce-overhead") of an applied decoder with
the layer shapes of Llama-3-8B at M = 1 and 8, with forced decisions of every kind (cuDNN graphs, split-K in both
reductions, cuBLASLt, Triton GEMM, attention backends); a left-padded batch through every attention backend that
takes a mask; threads on CUDA streams of their own calling one applied model. Each is checked against torch's own
output of the model. (tests/nn/test_serving.py: the CPU's cases.)"""

import sys
import threading
from pathlib import Path

import pytest

from .conftest import cuda_or_skip
from .forced import forced, runs

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
torch = pytest.importorskip("torch", reason="the model tests need torch")
transformers = pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefarm[models]')")

import farm  # noqa: E402
from farm.devices.open import open_device  # noqa: E402
from farm.nn.routing import applied_to  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import library_models  # noqa: E402

F = torch.nn.functional
MASKED_BACKENDS = ("math", "efficient", "cudnn")  # torch's attention backends that take a mask


def _device():
    return open_device("cuda", 0)


def _write(path, entries) -> str:
    d = _device()
    write_overrides(str(path), entries, device={"signature": d.signature, "properties": d.properties.to_dict()},
                    mode="replace")
    return str(path)


def _close(a, b, tol=3e-2):
    a, b = a.float(), b.float()
    return bool(torch.isfinite(a).all()) and float((a - b).norm() / b.norm()) < tol


@pytest.mark.parametrize("batch", [1, 8])
def test_compile_reduce_overhead_of_an_applied_8b_shaped_decoder_at_every_batch_size(batch, tmp_path):
    # Llama-3-8B's layer shapes (hidden 4096, MLP 14336, 32 heads, 8 key/value heads), two of its layers
    model, args, kwargs = library_models.llama(batch=batch, context=256, size="llama3.1-8b", layers=2,
                                               dtype="bfloat16")
    step = lambda m=model: m(*args, **kwargs).logits  # noqa: E731
    with torch.no_grad():
        ref = step().clone()
        with farm.capture(model) as c:
            step()
    entries, kinds = forced([p.problem for p in c.workload().problems])
    assert {"cudnn.graph", "triton.gemm_splitk", "cublaslt", "torch.sdpa"} <= set(kinds), kinds
    farm.apply(model, _write(tmp_path / "o.json", entries))
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            outs = [compiled(*args, **kwargs).logits.clone() for _ in range(4)]  # warm-up, recording, replays
        assert all(_close(o, ref) for o in outs)
        routed = {r.route.labels["eager"].split("[")[0] for r in applied_to(model).routed.values() if r.route.routed}
        assert {"cudnn.graph", "triton.gemm_splitk", "cublaslt"} <= routed
    finally:
        torch._dynamo.reset()
        farm.unapply(model)


def _gpt2():
    config = transformers.GPT2Config(n_positions=64, n_embd=256, n_layer=2, n_head=4, vocab_size=512,
                                     attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to("cuda", torch.bfloat16).eval()


def _llama():
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("backend", MASKED_BACKENDS)
def test_a_left_padded_batch_gives_torchs_logits_through_every_masked_attention_backend(build, backend, tmp_path):
    model = build()
    ids = torch.randint(0, 512, (3, 16), device="cuda")
    attention_mask = torch.ones(3, 16, dtype=torch.long, device="cuda")
    attention_mask[1, :5] = 0  # left padding: the padding queries see no key at all
    attention_mask[2, :15] = 0
    with torch.no_grad():
        ref = model(ids, attention_mask=attention_mask).logits
        with farm.capture(model) as c:
            model(ids, attention_mask=attention_mask)
    sdpa = [p.problem for p in c.workload().problems if p.problem.op == "sdpa_fwd"]
    assert sdpa and all(p.has_tensor("mask") for p in sdpa)
    choice = ("torch.sdpa", (("backend", backend),))
    if not all(runs(*choice, p) for p in sdpa):
        pytest.skip(f"torch's {backend} attention does not take this problem here")
    farm.apply(model, _write(tmp_path / "o.json", [OverrideEntry.for_problem(p, *choice) for p in sdpa]))
    try:
        with torch.no_grad():
            for _ in range(2):
                out = model(ids, attention_mask=attention_mask).logits
        routed = [r for r in applied_to(model).routed.values() if r.route.routed]
        assert routed and all(r.route.labels["eager"] == f"torch.sdpa[backend={backend}]" for r in routed)
        # no NaN anywhere, and every real token's logits torch's (a padding query's row is whatever the backend
        # gives a row masked whole: 0 from math, cuDNN's own for a bool mask, as torch's own call with it)
        real = attention_mask.bool()
        assert bool(torch.isfinite(out).all()) and _close(out[real], ref[real], 2e-2)
    finally:
        farm.unapply(model)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(1024, 3072)
        self.out = torch.nn.Linear(1024, 1024)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 8, 128).permute(2, 0, 3, 1, 4).unbind(0)
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, 1024))


def test_threads_on_streams_of_their_own_calling_one_applied_model_get_torchs_outputs(tmp_path):
    torch.manual_seed(0)
    model = _Block().to("cuda", torch.bfloat16).eval()
    xs = [torch.randn(8, 1, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    with torch.no_grad():
        refs = [model(x).clone() for x in xs]
        with farm.capture(model) as c:
            model(xs[0])
    entries, kinds = forced([p.problem for p in c.workload().problems], backend="math")
    assert "triton.gemm_splitk" in kinds or "cudnn.graph" in kinds, kinds
    farm.apply(model, _write(tmp_path / "o.json", entries))
    failures = []

    def work(i):
        stream = torch.cuda.Stream()
        with torch.no_grad(), torch.cuda.stream(stream):
            for j in range(40):
                n = (i + j) % len(xs)
                y = model(xs[n])
                stream.synchronize()
                if not isinstance(y, torch.Tensor) or not _close(y, refs[n], 1e-2):
                    failures.append((i, j))

    try:
        with torch.no_grad():
            model(xs[0])
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert any(r.route.routed for r in applied_to(model).routed.values())
    finally:
        farm.unapply(model)
