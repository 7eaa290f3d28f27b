"""farm.capture and farm.apply on a CUDA GPU: the same workload as on meta, routed calls right in eager mode,
inside a CUDA graph and under torch.compile (no graph break), default decisions left alone, and the model check."""

import sys
from pathlib import Path

import pytest

from .conftest import cuda_or_skip

pytestmark = pytest.mark.gpu
RT, COUNT = cuda_or_skip()
torch = pytest.importorskip("torch", reason="the model tests need torch")

import farm  # noqa: E402
from farm.devices.open import open_device  # noqa: E402
from farm.nn.routing import applied_to  # noqa: E402
from farm.nn.captured import workload_dict  # noqa: E402
from farm.nn.step_check import CheckSettings, check_step  # noqa: E402
from farm.nn.torch_calls import read_call  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import models  # noqa: E402

F = torch.nn.functional


def _problems(w):
    return [{k: v for k, v in p.items() if k != "steps"} for p in workload_dict(w)["problems"]]


def test_capture_on_the_gpu_and_on_meta_give_the_same_workload():
    got, built = {}, {}
    for device in ("cuda", "meta"):
        model, inputs = built[device] = models.decoder(batch=4, size="small", device=device, dtype="bfloat16")
        with torch.no_grad(), farm.capture(model, label="b4") as c:
            model(*inputs)
        got[device] = c
    assert _problems(got["cuda"].workload()) == _problems(got["meta"].workload())
    model, inputs = built["cuda"]
    with torch.no_grad():
        step = got["cuda"].time_step(lambda: model(*inputs))
    assert step.device == "cuda:0" and 0 < step.host_ms and step.bound in ("host", "device")
    assert all(u.ms and u.ms > 0 and 0 < u.share for p in got["cuda"].workload().problems for u in p.uses)
    linear = [p for p in got["cuda"].workload().problems if p.kind == "linear"]
    assert {p.problem.tensor("B").strides for p in linear} == {(1, p.problem.tensor("B").dims[0]) for p in linear}


def _override(path, model, inputs, eager, graph):
    """A file whose qkv projection's decision is ``eager`` in eager calls and ``graph`` inside a graph."""
    x = model.embed_tokens(inputs[0])
    qkv = model.layers[0].self_attn.qkv_proj
    p = read_call(F.linear, (x.view(-1, x.shape[-1]), qkv.weight, qkv.bias), {}).problem
    meta = {"call": "eager", "calls": {"graph": {"engine_name": graph[0],
                                                 "knobs": [{"knob_id": k, "type": "int" if isinstance(v, int) else "string",
                                                            "value": v} for k, v in graph[1]]}}}
    entry = OverrideEntry.for_problem(p, eager[0], eager[1], metadata=meta)
    d = open_device("cuda", 0)  # the file names the device it is for
    write_overrides(str(path), [entry], device={"signature": d.signature, "properties": d.properties.to_dict()},
                    mode="replace")
    return p


def test_apply_routes_eager_graph_and_compiled_calls_and_unapply_restores(tmp_path):
    model, inputs = models.decoder(batch=1, size="small", device="cuda", dtype="bfloat16")
    with torch.no_grad():
        ref = model(*inputs).float()
        _override(tmp_path / "o.json", model, inputs, ("torch.blas", (("backend", "cublas"),)),
                  ("triton.gemm_splitk", (("SPLIT_K", 8),)))
        farm.apply(model, str(tmp_path / "o.json"))
        applied = applied_to(model)
        patched = [n for n, m in model.named_modules() if "_farm_site" in m.__dict__]
        assert patched == [f"layers.{i}.self_attn.qkv_proj" for i in range(len(model.layers))]
        out = model(*inputs).float()
        assert (out - ref).norm() / ref.norm() < 2e-2
        route = next(iter(applied.routed.values())).route
        assert route.labels == {"eager": "torch.blas[backend=cublas]", "graph": "triton.gemm_splitk[SPLIT_K=8]"}
        # one CUDA graph of the step: the graph decision is what the capture records
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static = model(*inputs)
        g.replay()
        torch.cuda.synchronize()
        assert (static.float() - ref).norm() / ref.norm() < 2e-2
        # torch.compile: the farm's op in the graph, no break
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(*inputs).float()
        assert sum(torch._dynamo.utils.counters["graph_break"].values()) == 0
        assert (out - ref).norm() / ref.norm() < 2e-2
        farm.unapply(model)
        assert not [n for n, m in model.named_modules() if "_farm_site" in m.__dict__]
        assert not any("_farm_base" in type(m).__dict__ for m in model.modules())  # every module its own class


def test_a_default_decision_is_not_intercepted(tmp_path):
    model, inputs = models.decoder(batch=1, size="small", device="cuda", dtype="bfloat16")
    _override(tmp_path / "o.json", model, inputs, ("torch.matmul", ()), ("torch.matmul", ()))
    farm.apply(model, str(tmp_path / "o.json"))
    assert not [n for n, m in model.named_modules() if "_farm_site" in m.__dict__]
    farm.unapply(model)


@pytest.mark.parametrize("call", ["eager", "graph"])
def test_the_model_check_judges_each_routed_decision_on_the_step(tmp_path, call):
    model, inputs = models.decoder(batch=1, size="small", device="cuda", dtype="bfloat16")
    with torch.no_grad():
        _override(tmp_path / "o.json", model, inputs, ("triton.gemm_splitk", (("SPLIT_K", 2),)),
                  ("triton.gemm_splitk", (("SPLIT_K", 2),)))
        farm.apply(model, str(tmp_path / "o.json"))
        check = check_step(lambda: model(*inputs), applied_to(model), call=call, model="small",
                           settings=CheckSettings(rounds=8, sample_ms=10))
    assert len(check.judged) == 1 and check.judged[0].alone is not None and check.judged[0].alone.rounds == 8
    j = check.judged[0]
    # one routed decision: no group of small gains; kept only where the step is faster with it beyond noise
    # (and the kept set's own check against the untouched step, run again, agrees)
    assert j.kept == j.verdict.startswith("holds")
    assert j.kept <= (j.alone.speedup_low > 1.0)
    assert j.kept or j.alone.speedup_low <= 1.0 or j.verdict.startswith("withdrawn: together")
    assert check.untouched_ms > 0
    farm.unapply(model)
