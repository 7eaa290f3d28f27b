"""The layers models write by hand, on the CPU: transformers' Llama, Qwen2, Mistral and Gemma2 (built from their
configs) capture their hand-written RMSNorm modules as problems of library "module" (eps and Gemma's 1 + weight as
criteria), the decisions for them are routed per module and the model computes what it computes without the farm,
eagerly and under torch.compile; a module shaped like an RMSNorm that computes something else is never routed."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the model tests need torch (pip install torch==2.14.1, as .ci/run does)")
transformers = pytest.importorskip("transformers", reason="needs transformers (pip install '.[models]')")

import farm  # noqa: E402
from farm.devices.device import cpu_device  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402
from farm.nn.routing import applied_to  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402

CPU = cpu_device()
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa")
MODELS = {  # name: (config class, model class, extra config, the norms' eps, scale_offset, hand-written norms a step)
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rms_norm_eps": 1e-5}, 10**7, 0, 5),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rms_norm_eps": 1e-6}, 10**6, 0, 5),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}, 10**6, 0, 5),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "attn_implementation": "eager"}, 10**6, 1, 9),
}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("FARM_HEUR_CONFIG_PATH", raising=False)


def _model(name: str):
    config_cls, model_cls, extra, *_ = MODELS[name]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra})
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


def _run(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _hand_norms(model, ids):
    with torch.no_grad(), farm.capture(model) as c:
        model(ids, use_cache=False)
    return c.workload(), [p for p in c.workload().problems if p.kind == "rmsnorm_module"]


def _not_default_file(path: Path, problems, engine: str) -> str:
    registry = default_engine_registry()
    for p in problems:
        found = [f.engine_name for f in registry.discover(p, CPU)]
        assert found[0] == "torch.cpu.rmsnorm_module" and engine in found, found  # the module's own is the default
    write_overrides(str(path), [OverrideEntry.for_problem(p, engine) for p in problems],
                    device={"signature": CPU.signature, "properties": CPU.properties.to_dict()}, mode="replace")
    return str(path)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_hand_written_rmsnorm_is_captured_routed_and_computes_as_the_model_does(name, tmp_path):
    *_, e12, offset, per_step = MODELS[name]
    model = _model(name)
    ids = torch.randint(0, 256, (2, 6))
    ref = _run(model, ids)
    workload, hand = _hand_norms(model, ids)
    assert len(hand) == 1 and sum(u.calls for u in hand[0].uses) == per_step
    problem = hand[0].problem
    assert problem.library == "module" and problem.criteria_dict == {"eps_e12": e12, "scale_offset": offset}
    assert any("norm" in s for s in hand[0].sites)
    path = _not_default_file(tmp_path / "o.json", [problem], "cpu.rmsnorm.einsum")
    farm.apply(model, path)
    try:
        out = _run(model, ids)
        routed = [r for r in applied_to(model).routed.values() if r.route.routed]
        assert len(routed) == 1 and routed[0].route.labels["eager"] == "cpu.rmsnorm.einsum[default]"
        assert len(routed[0].sites) == per_step  # every hand-written norm of the step
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        with torch.no_grad():
            assert torch.allclose(compiled(ids, use_cache=False).logits, ref, rtol=1e-4, atol=1e-4)
    finally:
        torch._dynamo.reset()
        farm.unapply(model)
    assert torch.equal(_run(model, ids), ref)


def test_a_hand_written_norm_workload_loads_and_its_default_is_the_module(tmp_path):
    from farm.model.workload import load_workload

    model = _model("qwen2")
    workload, hand = _hand_norms(model, torch.randint(0, 256, (1, 4)))
    path = workload.write(tmp_path / "w.yaml")
    assert "library: module" in path.read_text()
    loaded = {p.problem.key: p.problem for p in load_workload(path).problems}
    assert loaded[hand[0].problem.key].library == "module"
    assert sum(p.library == "torch" for p in loaded.values()) == len(loaded) - 1  # the rest: torch's calls


class _LooksLikeANorm(torch.nn.Module):
    """Shaped like an RMSNorm (one weight, an eps) but computing something else."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(16))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return x * self.weight + self.variance_epsilon


def test_a_module_shaped_like_a_norm_that_computes_something_else_is_listed_and_never_routed(tmp_path):
    from farm.model.problem import Problem

    module = _LooksLikeANorm()
    x = torch.randn(3, 16)
    with torch.no_grad(), farm.capture(module) as c:
        module(x)
    w = c.workload()
    assert not [p for p in w.problems if p.kind == "rmsnorm_module"]
    assert any("computing something else" in s.reason for s in w.skipped)
    # a decision for its shape anyway (written by hand): its first call is checked, and its own forward kept
    problem = Problem.create("rmsnorm", {"X": [3, 16], "scale": [16]}, criteria={"eps_e12": 10**6},
                             library="module")
    path = _not_default_file(tmp_path / "o.json", [problem], "cpu.rmsnorm.numpy")
    farm.apply(module, path)
    try:
        with torch.no_grad():
            assert torch.equal(module(x), x * module.weight + 1e-6)
        assert not [r for r in applied_to(module).routed.values() if r.route.routed]
    finally:
        farm.unapply(module)


def test_farm_verify_names_what_a_hand_written_norms_decision_runs(tmp_path):
    """farm.ops never makes a problem of library "module": verify times the file's own binding, as farm.apply runs
    it, and names the candidate (tests/gpu/test_decode_step_gpu.py: the same on a GPU)."""
    from farm.model.problem import Problem
    from farm.replay.verified import VerifySettings
    from farm.replay.verify import verify_file
    from farm.store.overrides.parsing import load_overrides

    problem = Problem.create("rmsnorm", {"X": [4, 64], "scale": [64]}, criteria={"eps_e12": 10**6},
                             library="module")
    path = _not_default_file(tmp_path / "o.json", [problem], "cpu.rmsnorm.numpy")
    verified, skipped = verify_file(path, load_overrides(path), CPU, settings=VerifySettings(calls=16, rounds=4))
    assert not skipped and [v.replayed for v in verified] == ["cpu.rmsnorm.numpy[default]"]
