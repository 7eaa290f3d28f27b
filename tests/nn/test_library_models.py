"""farm.apply on library models as they are (transformers and timm, built from their configs, random weights), on
the CPU: every call site the farm captures routed to a decision that is not the default, and the model computes
what it computes without the farm: eagerly, under torch.compile with no graph break, after its weights are
replaced or converted, in copies and pickles of it, under autocast, beside another model; unapply exact.
(tests/end_to_end/test_library_models_e2e.py: capture, a short tune and the model check from the command line;
tests/gpu/test_library_models_gpu.py: the same on a GPU, graphs included.)"""

from __future__ import annotations

import copy
import io
import pickle
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the model tests need torch (pip install torch==2.14.1)")
pytest.importorskip("transformers", reason="the library model tests need transformers (pip install '.[models]')")
pytest.importorskip("timm", reason="the library model tests need timm (pip install '.[models]')")

import farm  # noqa: E402
from farm.devices.device import cpu_device  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402
from farm.nn.routing import applied_to  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import library_models  # noqa: E402

CPU = cpu_device()
MODELS = {  # name: (factory, its keyword arguments)
    "llama": ("llama", {}),  # a decoder over a static KV cache: masked, grouped attention; hand-written RMSNorm
    "qwen2": ("qwen2", {"batch": 2}),  # qkv projections with a bias; an expanded mask
    "gpt2": ("gpt2", {}),  # Conv1D layers (addmm) and nn.LayerNorm
    "bert": ("bert", {}),  # an encoder with a padding mask
    "vit": ("vit", {}),  # timm's attention without a mask, patch convolution
    "resnet": ("resnet", {}),  # NCHW
    "resnet-channels-last": ("resnet", {"channels_last": 1}),
    "convnext": ("convnext", {}),  # channels-last, depthwise 7x7 and 1x1 convolutions, LayerNorm2d
}


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("FARM_HEUR_CONFIG_PATH", raising=False)


class Built:
    """A library model, its step and its output of the step (the cache's slot reset before each step)."""

    def __init__(self, name: str, **extra) -> None:
        factory, kwargs = MODELS[name]
        self.model, self.args, self.kwargs = getattr(library_models, factory)(**{**kwargs, **extra})
        cache = self.kwargs.get("past_key_values")
        self.reset = library_models.SameSlot(cache, self.kwargs["cache_position"].item()) if cache is not None else None

    def run(self, fn=None):
        if self.reset is not None:
            self.reset(None, None)
        with torch.no_grad():
            out = (fn if fn is not None else self.model)(*self.args, **self.kwargs)
        for field in ("logits", "last_hidden_state"):
            if hasattr(out, field):
                return getattr(out, field)
        return out


def _captured(b: Built):
    with torch.no_grad(), farm.capture(b.model) as c:
        b.run()
    return c.workload()


def _not_default_file(path: Path, workload) -> tuple[str, int]:
    """An override file deciding every captured problem for its second engine here (never the default)."""
    registry = default_engine_registry()
    entries = []
    for p in workload.problems:
        found = registry.discover(p.problem, CPU)
        assert len(found) > 1, f"{p.problem.label()}: no engine but the default"
        entries.append(OverrideEntry.for_problem(p.problem, found[1].engine_name))
    write_overrides(str(path), entries, device={"signature": CPU.signature, "properties": CPU.properties.to_dict()},
                    mode="replace")
    return str(path), len(entries)


def _routed_classes(model) -> list[str]:
    return [n for n, m in model.named_modules() if "_farm_base" in type(m).__dict__]


def _same(a, b, tol=1e-4):
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=tol, atol=tol)


def _applied(name: str, tmp_path: Path, **extra) -> tuple[Built, object]:
    b = Built(name, **extra)
    ref = b.run()
    path, _ = _not_default_file(tmp_path / f"{name}.json", _captured(b))
    farm.apply(b.model, path)
    return b, ref


@pytest.mark.parametrize("name", list(MODELS))
def test_every_call_site_of_a_library_model_is_routed_and_the_model_computes_as_it_does(name, tmp_path):
    b, ref = _applied(name, tmp_path)
    out = b.run()
    assert _same(out, ref)
    applied = applied_to(b.model)
    routed = [r for r in applied.routed.values() if r.route.routed]
    captured = _captured(Built(name))
    assert len(routed) == len(captured.problems)  # every problem the capture found is routed where it is called
    assert _same(b.run(), ref)  # and again, bound
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(b.model, backend="aot_eager", fullgraph=True)  # fullgraph: a graph break fails
    assert _same(b.run(compiled), ref)
    assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
    torch._dynamo.reset()
    farm.unapply(b.model)
    assert not _routed_classes(b.model) and applied_to(b.model) is None
    assert torch.equal(b.run(), ref)  # unapplied: exactly the model's own calls


def test_the_kinds_of_call_sites_real_models_make_are_routed(tmp_path):
    gpt2, _ = _applied("gpt2", tmp_path)
    assert applied_to(gpt2.model).scope.sites == []  # found on the first eager call
    gpt2.run()
    scope = applied_to(gpt2.model).scope
    kinds = {s.name.rsplit(".", 1)[-1]: sorted(s.kinds) for s in scope.sites}
    # transformers' Conv1D calls torch.addmm with its own weight: routed like a Linear; attention by its module
    assert kinds == {"c_attn": ["addmm"], "c_proj": ["addmm"], "c_fc": ["addmm"], "attn": ["sdpa"]}
    llama, _ = _applied("llama", tmp_path)
    llama.run()
    sdpa = [r for r in applied_to(llama.model).routed.values() if r.problem.op == "sdpa_fwd"]
    # transformers passes scale= (1/sqrt(head dim)) and a mask over the static cache: both the farm's problem
    assert len(sdpa) == 1 and sdpa[0].problem.has_tensor("mask") and sdpa[0].route.routed
    assert sdpa[0].sites == [f"model.layers.{i}.self_attn (function)" for i in range(len(llama.model.model.layers))]
    convnext, _ = _applied("convnext", tmp_path)
    conv = convnext.model.stem[0]
    x = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        y = conv(x)
    assert "_farm_site" in conv.__dict__ and y.is_contiguous(memory_format=torch.channels_last)  # torch's layout


def test_a_routed_call_follows_the_weights_it_is_given(tmp_path):
    b, ref = _applied("llama", tmp_path)
    lin = b.model.model.layers[0].mlp.gate_proj
    assert "_farm_site" in lin.__dict__

    def plain_output():
        farm.unapply(b.model)
        out = b.run()
        farm.apply(b.model, str(tmp_path / "llama.json"))
        return out

    lin.weight.data = torch.randn_like(lin.weight)  # param.data = ...: new memory, the same Parameter
    assert _same(b.run(), plain_output())
    with torch.no_grad():
        lin.weight.copy_(torch.randn_like(lin.weight))  # in place (load_state_dict): the same memory, new values
    assert _same(b.run(), plain_output())
    state = {k: v.clone() * 0.5 for k, v in b.model.state_dict().items()}
    b.model.load_state_dict(state, assign=True)  # new Parameters
    assert _same(b.run(), plain_output())
    expected = plain_output()
    b.model.double()
    b.model.float()  # a dtype round trip: every weight new memory
    assert _same(b.run(), expected)
    b.model.half()
    b.model.float()
    assert _same(b.run(), plain_output())
    farm.unapply(b.model)


def test_copies_and_pickles_of_an_applied_model_are_plain_models_that_compute_right(tmp_path):
    b, ref = _applied("gpt2", tmp_path)
    copied = copy.deepcopy(b.model)
    assert not _routed_classes(copied) and applied_to(copied) is None
    assert _same(b.run(copied), ref)
    buf = io.BytesIO()
    torch.save(b.model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded).__name__ == "GPT2LMHeadModel" and not _routed_classes(loaded)
    assert _same(b.run(loaded), ref)
    pickled = pickle.loads(pickle.dumps(b.model))
    assert _same(b.run(pickled), ref)
    # the copy's weights are its own: changing the original's leaves the copy as it was, and the other way round
    with torch.no_grad():
        for p in b.model.parameters():
            p.mul_(0.5)
    assert _same(b.run(copied), ref) and not _same(b.run(), ref)
    farm.unapply(b.model)
    assert _same(b.run(copied), ref)
    farm.apply(copied, str(tmp_path / "gpt2.json"))  # a copy applied on its own, to its own weights
    assert _same(b.run(copied), ref)
    farm.unapply(copied)


def test_autocast_runs_the_models_own_calls_in_its_dtype(tmp_path):
    b, _ = _applied("vit", tmp_path)
    x = b.args[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        applied = b.model(x)
    farm.unapply(b.model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        plain = b.model(x)
    assert applied.dtype == plain.dtype == torch.bfloat16 and torch.equal(applied, plain)


def test_applied_models_route_only_their_own_calls_and_unapply_in_any_order(tmp_path):
    first, ref1 = _applied("llama", tmp_path)
    second, ref2 = _applied("gpt2", tmp_path)
    never = Built("llama")  # the same architecture, never applied
    ref3 = never.run()
    calls = []
    original = farm.nn.function_scope.FunctionScope.run_sdpa

    def spy(self, *args, **kwargs):
        calls.append(self.applied.model)
        return original(self, *args, **kwargs)

    farm.nn.function_scope.FunctionScope.run_sdpa = spy
    try:
        assert _same(never.run(), ref3) and calls == []  # a model never applied is never routed
        assert _same(first.run(), ref1) and set(map(id, calls)) == {id(first.model)}
        calls.clear()
        assert _same(second.run(), ref2) and set(map(id, calls)) == {id(second.model)}
    finally:
        farm.nn.function_scope.FunctionScope.run_sdpa = original
    farm.unapply(first.model)  # in the order applied
    assert not _routed_classes(first.model) and _routed_classes(second.model)
    assert _same(second.run(), ref2) and torch.equal(first.run(), ref1)
    farm.unapply(second.model)
    assert not _routed_classes(second.model) and torch.equal(second.run(), ref2)
    third, ref = _applied("gpt2", tmp_path)
    fourth, _ = _applied("llama", tmp_path)
    farm.unapply(fourth.model)  # the other order
    farm.unapply(third.model)
    assert not _routed_classes(third.model) and not _routed_classes(fourth.model) and torch.equal(third.run(), ref)


def test_a_routed_module_called_with_keywords_runs_its_own_call(tmp_path):
    b, _ = _applied("vit", tmp_path)
    lin = b.model.head
    assert "_farm_site" in lin.__dict__
    x = torch.randn(2, lin.in_features)
    with torch.no_grad():
        assert torch.equal(lin(input=x), torch.nn.functional.linear(x, lin.weight, lin.bias))
    farm.unapply(b.model)


def test_capture_reports_what_the_farm_covers_and_the_rest_by_kind():
    b = Built("llama")
    with torch.no_grad(), farm.capture(b.model) as c:
        b.run()
    c.time_step(b.run, repeats=3)
    cov = c.workload().coverage[0]
    kinds = {k.kind for k in cov.kinds}
    assert {"tuned: matmul", "tuned: attention", "tuned: norm (hand-written)", "rotary", "masks"} <= kinds
    assert 0 < cov.covered < 1 and abs(sum(k.share for k in cov.kinds) - 1) < 1e-6


def test_bf16_on_a_cpu_is_refused_at_capture_saying_why():
    b = Built("vit", dtype="bfloat16")
    with torch.no_grad(), farm.capture(b.model) as c:
        b.run()
    w = c.workload()
    reasons = {s.kind: s.reason.split(" (")[0] for s in w.skipped}
    assert not w.problems and reasons == {"linear": "bf16 on a CPU", "sdpa": "bf16 on a CPU", "conv2d": "bf16 on a CPU",
                                          "layer_norm": "bf16 on a CPU"}
    with pytest.raises(farm.InputError, match="bf16 on a CPU"):
        w.write("unused.yaml")  # farm capture: one line saying why, nothing written


def test_every_custom_ops_fake_gives_the_layout_its_run_returns(tmp_path):
    """torch.library.opcheck's fake-tensor test: the fake's shape, dtype and strides are the real output's."""
    check = ("test_faketensor",)
    resnet, _ = _applied("resnet-channels-last", tmp_path)
    conv, x = resnet.model.conv1, resnet.args[0]
    site = conv.__dict__["_farm_site"]
    torch.library.opcheck(torch.ops.farm.conv2d.default, (x, conv.weight.detach(), None, site.number), test_utils=check)
    fc = resnet.model.fc
    feats = torch.randn(3, fc.in_features).t().contiguous().t()  # a strided input: the module's own call runs
    torch.library.opcheck(torch.ops.farm.linear.default, (feats, fc.weight.detach(), fc.bias.detach(),
                                                           fc.__dict__["_farm_site"].number), test_utils=check)
    llama, _ = _applied("llama", tmp_path)
    llama.run()  # finds the attention modules
    scope = applied_to(llama.model).scope
    q, k = torch.randn(1, 2, 2, 16), torch.randn(1, 2, 64, 16)
    mask = torch.ones(1, 1, 1, 64, dtype=torch.bool)
    torch.library.opcheck(torch.ops.farm.sdpa.default, (q, k, k.clone(), mask, False, False, scope.number),
                          test_utils=check)
    gpt2, _ = _applied("gpt2", tmp_path)
    gpt2.run()
    scope = applied_to(gpt2.model).scope
    a, b, bias = torch.randn(1, 64), torch.randn(64, 192), torch.randn(192)
    torch.library.opcheck(torch.ops.farm.matmul.default, (a, b, bias, scope.number), test_utils=check)
    ln = next(m for m in gpt2.model.modules() if "_farm_site" in m.__dict__ and isinstance(m, torch.nn.LayerNorm))
    h = torch.randn(1, 1, 64)
    torch.library.opcheck(torch.ops.farm.norm.default, (h, ln.weight.detach(), ln.bias.detach(),
                                                         ln.__dict__["_farm_site"].number), test_utils=check)

