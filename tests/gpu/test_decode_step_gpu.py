"""The whole decode step's pieces on a CUDA GPU (issue 70): masked decode attention as transformers masks it (a
static cache's unfilled slots, padding, a sliding window; bool and additive; grouped-query heads), RMSNorm of a
hand-written module, each tuned and checked; and an applied Llama-3-8B-shaped decoder (2 layers) with them decided,
in eager, in one CUDA graph and under torch.compile, against the model's own logits."""

import sys
from pathlib import Path

import pytest

from .conftest import captured, cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
torch = pytest.importorskip("torch", reason="the model tests need torch")

from farm import AutotuneConfig, Autotuner, Problem  # noqa: E402
from farm.devices.arrays import make_tensors  # noqa: E402
from farm.model.engine import default_engine_registry, settings_to_resolved  # noqa: E402

F = torch.nn.functional
FAST = dict(strategy="run_until_stable", max_iterations=20, max_tuning_duration_ms=30, warmup_iterations=2)


@pytest.fixture(scope="module")
def dev():
    from farm.devices.device import gpu_device

    return gpu_device("cuda", 0)


def _masked(batch, hq, sq, hkv, kv, d, mask_dims, mask_dtype):
    mask_strides = [0 if n == 1 else None for n in mask_dims]
    rest, strides = 1, []
    for n, s in reversed(list(zip(mask_dims, mask_strides))):
        strides.insert(0, 0 if s == 0 else rest)
        rest *= n if s != 0 else 1
    return Problem.create("sdpa_fwd", {"Q": [batch, hq, sq, d], "K": [batch, hkv, kv, d], "V": [batch, hkv, kv, d],
                                       "mask": {"dims": mask_dims, "strides": strides, "dtype": mask_dtype}},
                          dtype="bf16")


def _mask(problem, kind):
    """A mask of the problem's layout as transformers builds it: True (or 0) where a key is attended."""
    m = problem.tensor("mask")
    b, _, sq, kv = problem.tensor("Q").dims[0], 0, problem.tensor("Q").dims[2], problem.tensor("K").dims[2]
    keep = torch.ones(m.dims[0], m.dims[1], m.dims[2], kv, dtype=torch.bool, device="cuda")
    keep[..., kv - 7:] = False  # the static cache's unfilled slots
    if kind == "window":
        keep[..., : kv // 3] = False  # a sliding window over the last tokens
    if kind == "padding" and m.dims[0] > 1:
        keep[1, ..., : kv // 2] = False  # a left-padded row
        keep[-1] = False  # a row masked whole: 0 out, as torch's math backend gives
    del b, sq
    full = keep if m.dtype == "bool" else torch.zeros(keep.shape, dtype=torch.bfloat16, device="cuda").masked_fill(
        ~keep, float("-inf"))
    return full.as_strided(m.dims, [0 if s == 0 else full.stride(i) for i, s in enumerate(m.strides)])


CASES = [  # (batch, query heads, query rows, kv heads, kv, head dim, mask dims, mask dtype, kind)
    (1, 32, 1, 8, 1032, 128, [1, 1, 1, 1032], "bool", "cache"),     # Llama-3-8B, M = 1, grouped-query heads
    (1, 8, 4, 8, 1032, 128, [1, 1, 1, 1032], "bool", "cache"),      # the same as transformers packs it (pack_gqa)
    (8, 32, 1, 8, 4096, 128, [8, 1, 1, 4096], "bool", "padding"),   # M = 8, left padding, a row masked whole
    (1, 28, 1, 4, 8192, 128, [1, 1, 1, 8192], "bf16", "cache"),     # Qwen2.5-7B, an additive mask
    (4, 32, 1, 32, 2048, 128, [4, 1, 1, 2048], "bool", "window"),   # repeat_kv's heads, a sliding window
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"M{c[0]}-q{c[1]}x{c[2]}-kv{c[4]}-{c[7]}-{c[8]}")
def test_masked_decode_attention_tuned_is_torchs_in_eager_and_in_a_graph(dev, case):
    batch, hq, sq, hkv, kv, d, mdims, mdtype, kind = case
    problem = _masked(batch, hq, sq, hkv, kv, d, mdims, mdtype)
    engine = default_engine_registry().get("triton.decode_attention")
    assert engine.applicable(problem, dev), engine.supports(problem, dev)
    t = Autotuner(problem, dev)
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(check="reference", **FAST))
    mine = [r for r in results if r.engine_name == "triton.decode_attention"]
    assert mine and all(r.succeeded for r in mine), [(r.label, r.error) for r in mine if not r.succeeded]
    tensors = make_tensors(problem, dev.arrays, seed=3)
    tensors["mask"] = _mask(problem, kind)
    q, k, v, m = tensors["Q"], tensors["K"], tensors["V"], tensors["mask"]
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m if m.dtype == torch.bool
                                          else m.float(), enable_gqa=True)
    want = torch.nan_to_num(want, nan=0.0)  # math gives NaN for a row masked whole in fp32 with -inf; the farm 0
    if kind == "padding":
        want[-1] = 0
    fastest = min(mine, key=lambda r: r.median_ms)
    plan = engine.compile(problem, settings_to_resolved(engine, fastest.knobs), dev)
    plan.fn(tensors)
    torch.testing.assert_close(tensors["O"].float(), want, rtol=2e-2, atol=2e-2)
    tensors["O"].zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.fn(tensors)
    k.copy_(torch.randn_like(k))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.nan_to_num(F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=m if m.dtype == torch.bool else m.float(), enable_gqa=True), nan=0.0)
    if kind == "padding":
        want[-1] = 0
    torch.testing.assert_close(tensors["O"].float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("offset", [0, 1], ids=["llama", "gemma"])
@pytest.mark.parametrize("rows", [1, 8])
def test_hand_written_rmsnorm_candidates_tuned_give_the_modules_output(dev, offset, rows):
    from farm.plugin import module_rmsnorm

    problem = Problem.create("rmsnorm", {"X": [rows, 1, 4096], "scale": [4096]}, dtype="bf16",
                             criteria={"eps_e12": 10**6, "scale_offset": offset}, library="module")
    t = Autotuner(problem, dev)
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(check="reference", **FAST))
    names = {r.engine_name for r in results if r.succeeded}
    want_engines = {"torch.rmsnorm_module", "triton.rmsnorm"}
    if default_engine_registry().get("liger.rmsnorm").applicable(problem, dev):
        want_engines.add("liger.rmsnorm")  # where liger-kernel is installed
    assert want_engines <= names, [(r.label, r.error) for r in results]
    tensors = make_tensors(problem, dev.arrays, seed=9)
    want = module_rmsnorm(torch, tensors["X"], tensors["scale"], 1e-6, offset)
    for r in results:  # every candidate's output, not only the winner's
        if r.succeeded:
            tensors["Y"].zero_()
            engine = default_engine_registry().get(r.engine_name)
            engine.compile(problem, settings_to_resolved(engine, r.knobs), dev).fn(tensors)
            torch.cuda.synchronize()
            torch.testing.assert_close(tensors["Y"], want, rtol=1.6e-2, atol=1.6e-2, msg=r.label)


def test_an_applied_8b_shaped_llama_with_the_decode_step_decided_gives_its_logits(tmp_path):
    """triton.decode_attention for every masked attention call and triton.rmsnorm for every hand-written norm, in
    eager, one CUDA graph and compile reduce-overhead: the logits of the model's own call (bf16 tolerance)."""
    import farm
    from farm.devices.open import open_device
    from farm.nn.routing import applied_to
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefarm[models]')")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import library_models

    model, args, kwargs = library_models.llama(batch=8, context=1032, size="llama3.1-8b", layers=2,
                                               dtype="bfloat16")
    step = lambda: model(*args, **kwargs).logits  # noqa: E731
    with torch.no_grad():
        ref = step().float().clone()
        with farm.capture(model) as c:
            step()
    problems = [p.problem for p in c.workload().problems]
    chosen = {"sdpa_fwd": "triton.decode_attention", "rmsnorm": "triton.rmsnorm"}
    entries = [OverrideEntry.for_problem(p, chosen[p.op], ()) for p in problems if p.op in chosen]
    assert {e.engine_name for e in entries} == set(chosen.values()), [p.label() for p in problems]
    d = open_device("cuda", 0)
    path = tmp_path / "decided.json"
    write_overrides(str(path), entries, device={"signature": d.signature, "properties": d.properties.to_dict()},
                    mode="replace")

    def close(got):
        err = float((got.float() - ref).norm() / ref.norm())
        assert err < 3e-2, err

    for call in ("eager", "graph"):
        farm.apply(model, str(path), call=call)
        with torch.no_grad():
            if call == "eager":
                close(step())
            else:
                step()
                g, out = captured(step)
                g.replay()
                torch.cuda.synchronize()
                close(out)
        applied = applied_to(model)
        routed = {r.route.labels.get(call) for r in applied.routed.values()} if applied else set()
        farm.unapply(model)
        assert any("triton.decode_attention" in str(x) for x in routed), routed
    farm.apply(model, str(path))
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    try:
        with torch.no_grad():
            for _ in range(3):
                got = compiled(*args, **kwargs).logits
            close(got)
    finally:
        torch._dynamo.reset()
        farm.unapply(model)


def test_farm_verify_replays_a_hand_written_norms_decision_as_farm_apply_runs_it(dev, tmp_path):
    """A hand-written RMSNorm's problem (library "module") is one farm.ops never makes of its tensors: farm verify
    times the file's own binding of it, as farm.apply runs it, and names the candidate it ran (not "?")."""
    from farm.devices.open import open_device
    from farm.replay.verified import VerifySettings
    from farm.replay.verify import verify_file
    from farm.store.overrides.parsing import load_overrides
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    problem = Problem.create("rmsnorm", {"X": [8, 1, 4096], "scale": [4096]}, dtype="bf16",
                             criteria={"eps_e12": 10**6, "scale_offset": 0}, library="module")
    d = open_device("cuda", 0)
    path = tmp_path / "norm.json"
    write_overrides(str(path), [OverrideEntry.for_problem(problem, "triton.rmsnorm", ())],
                    device={"signature": d.signature, "properties": d.properties.to_dict()}, mode="replace")
    verified, skipped = verify_file(str(path), load_overrides(path), dev, settings=VerifySettings(calls=32, rounds=4))
    assert not skipped and verified
    for v in verified:
        assert v.replayed.startswith("triton.rmsnorm"), (v.decision.call, v.replayed, v.flagged)
