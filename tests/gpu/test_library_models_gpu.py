"""Library models on a CUDA GPU, as they are: transformers' Llama decoding over a static KV cache (its masked,
grouped attention routed by the function scope) and timm's channels-last ResNet (its convolutions routed in
torch's own layout), eagerly, in one CUDA graph and under torch.compile with no graph break."""

import sys
from pathlib import Path

import pytest

from .conftest import captured, cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
torch = pytest.importorskip("torch", reason="the model tests need torch")
pytest.importorskip("transformers", reason="the library model tests need transformers (pip install 'tunefarm[models]')")

import farm  # noqa: E402
from farm.devices.open import open_device  # noqa: E402
from farm.nn.routing import applied_to  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import library_models  # noqa: E402


def _file(path, problems, engine, knobs):
    d = open_device("cuda", 0)
    write_overrides(str(path), [OverrideEntry.for_problem(p, engine, knobs) for p in problems],
                    device={"signature": d.signature, "properties": d.properties.to_dict()}, mode="replace")
    return str(path)


def _close(a, b, tol=2e-2):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm()) < tol


def _llama_captured(batch: int):
    """transformers' Llama (bf16, a decode step over a static cache of 128), its step, torch's logits of it and the
    problems farm.capture records of it: (model, args, kwargs, step, reference logits, problems)."""
    model, args, kwargs = library_models.llama(batch=batch, context=128, dtype="bfloat16")
    step = lambda: model(*args, **kwargs).logits  # noqa: E731
    with torch.no_grad():
        ref = step().clone()
        with farm.capture(model) as c:
            step()
    return model, args, kwargs, step, ref, [p.problem for p in c.workload().problems]


def test_a_library_decoders_masked_attention_is_routed_eagerly_in_a_graph_and_compiled(tmp_path):
    model, args, kwargs, step, ref, captured_problems = _llama_captured(batch=2)
    with torch.no_grad():
        sdpa = [p for p in captured_problems if p.op == "sdpa_fwd"]
        assert sdpa and all(p.has_tensor("mask") for p in sdpa)  # a decode step over a static cache is masked
        path = _file(tmp_path / "o.json", sdpa, "torch.sdpa", (("backend", "math"),))
        farm.apply(model, path)
        assert _close(step(), ref)
        scope = applied_to(model).scope
        assert scope is not None and [s.name for s in scope.sites] == [
            f"model.layers.{i}.self_attn" for i in range(len(model.model.layers))]
        routed = [r for r in applied_to(model).routed.values() if r.route.routed]
        assert [r.route.labels["eager"] for r in routed] == ["torch.sdpa[backend=math]"]
        g, static = captured(step)
        g.replay()
        torch.cuda.synchronize()
        assert _close(static, ref)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(model, fullgraph=True)
        assert _close(compiled(*args, **kwargs).logits, ref, 3e-2)
        assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
        farm.unapply(model)
        assert not any("_farm_site" in m.__dict__ for m in model.modules())


def test_a_graph_only_attention_decision_finds_its_modules_on_an_eager_call(tmp_path):
    """The eager calls run the library's; the modules making the calls are found on the first eager call all the
    same (a graph capture cannot look for them), and the capture runs the graph decision."""
    model, args, kwargs, step, ref, captured_problems = _llama_captured(batch=1)
    with torch.no_grad():
        sdpa = next(p for p in captured_problems if p.op == "sdpa_fwd")
        meta = {"call": "eager", "calls": {"graph": {"engine_name": "torch.sdpa",
                                                     "knobs": [{"knob_id": "backend", "type": "string",
                                                                "value": "math"}]}}}
        d = open_device("cuda", 0)
        write_overrides(str(tmp_path / "o.json"), [OverrideEntry.for_problem(sdpa, "torch.sdpa", metadata=meta)],
                        device={"signature": d.signature, "properties": d.properties.to_dict()}, mode="replace")
        farm.apply(model, str(tmp_path / "o.json"))
        assert torch.equal(step(), ref)  # eagerly: the library's call, exactly
        scope = applied_to(model).scope
        assert [s.name for s in scope.sites] == [f"model.layers.{i}.self_attn" for i in range(len(model.model.layers))]
        route = next(r.route for r in applied_to(model).routed.values() if r.problem.op == "sdpa_fwd")
        assert route.eager is None and route.labels["graph"] == "torch.sdpa[backend=math]"
        g, static = captured(step)
        g.replay()
        torch.cuda.synchronize()
        assert _close(static, ref)
        farm.unapply(model)


def test_a_channels_last_conv_net_keeps_its_layout_routed_and_compiles(tmp_path):
    pytest.importorskip("timm", reason="the conv net test needs timm (pip install 'tunefarm[models]')")
    model, (x,), _ = library_models.resnet(batch=4, image=64, channels_last=1, dtype="float16")
    with torch.no_grad():
        ref = model(x).clone()
        with farm.capture(model) as c:
            model(x)
        convs = [p.problem for p in c.workload().problems if p.problem.op == "conv_fprop"]
        assert convs and all(p.tensor("Y").strides[1] == 1 for p in convs)  # channels-last out, as torch's
        path = _file(tmp_path / "o.json", convs, "torch.conv", (("deterministic", 1),))
        farm.apply(model, path)
        first = model.conv1
        y = first(x)
        assert y.is_contiguous(memory_format=torch.channels_last)  # the layout torch's own call returns
        assert _close(model(x), ref)
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(model, fullgraph=True)
        assert _close(compiled(x), ref)  # the fake's layout is the kernel's: no crash, the same result
        assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
        farm.unapply(model)
