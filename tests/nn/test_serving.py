"""farm.apply in a serving or fine-tuning process, on the CPU: fully masked rows (left padding), several threads
calling one applied model (a weight reloaded meanwhile), autograd through trainable biases and masks, helpers the
model calls that are not its own, empty batches, int64 calls and torch.jit.trace. Each case is checked against the
model's own output. (tests/gpu/test_serving_gpu.py: the same on a GPU, two CUDA streams and compile at M = 1, 8.)"""

from __future__ import annotations

import sys
import threading

import pytest

torch = pytest.importorskip("torch", reason="the model tests need torch (pip install torch==2.14.1, as .ci/run does)")

import farm  # noqa: E402
from farm.devices.device import cpu_device  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402
from farm.nn.routing import applied_to  # noqa: E402
from farm.nn.torch_calls import read_call  # noqa: E402
from farm.replay.file_replay import FileReplay  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry, TensorRule  # noqa: E402

nn, F = torch.nn, torch.nn.functional
CPU = cpu_device()
ATTENTION = ("cpu.sdpa.materialized", "cpu.sdpa.online")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("FARM_HEUR_CONFIG_PATH", raising=False)


def _write(path, entries) -> str:
    write_overrides(str(path), entries, device={"signature": CPU.signature, "properties": CPU.properties.to_dict()},
                    mode="replace")
    return str(path)


def _captured(model, *args, **kwargs):
    with torch.no_grad(), farm.capture(model) as c:
        model(*args, **kwargs)
    return [p.problem for p in c.workload().problems]


def _decide(path, problems, engines: dict[str, str] | None = None) -> str:
    """Every problem decided for a farm engine that is not its default (``engines``: op -> engine name)."""
    registry = default_engine_registry()
    entries = []
    for p in problems:
        found = [f.engine_name for f in registry.discover(p, CPU)]
        name = (engines or {}).get(p.op) or found[1]
        assert name in found and name != found[0], (p.label(), found)
        entries.append(OverrideEntry.for_problem(p, name))
    return _write(path, entries)


def _same(a, b, tol=1e-4):
    return a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol)


# -- fully masked rows ------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ATTENTION)
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_every_attention_engine_gives_torchs_zeros_on_rows_masked_whole(engine, mask_kind, tmp_path):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    keep = torch.rand(2, 1, 6, 9) > 0.3
    keep[0, 0, 2] = False  # a row masked whole (a padding query of a left-padded sequence)
    keep[1, 0, :2] = False
    mask = keep if mask_kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.all(ref[0, :, 2] == 0)  # what torch gives there
    got = read_call(F.scaled_dot_product_attention, (q, k, v), {"attn_mask": mask, "enable_gqa": True})
    replay = FileReplay(_write(tmp_path / "o.json", [OverrideEntry.for_problem(got.problem, engine)]), CPU)
    bound, _, _ = replay.bind_problem(got.problem)
    assert bound.engine_name == engine
    out = torch.empty_like(ref)
    bound.run({"Q": q.numpy(), "K": k.numpy(), "V": v.numpy(), "mask": mask.numpy(), "O": out.numpy()})
    assert not out.isnan().any() and _same(out, ref)


def _gpt2():
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install '.[models]')")
    config = transformers.GPT2Config(n_positions=64, n_embd=64, n_layer=2, n_head=4, vocab_size=256,
                                     attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _llama():
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install '.[models]')")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
@pytest.mark.parametrize("engine", ATTENTION)
def test_a_left_padded_batch_gives_torchs_logits_through_every_attention_engine(build, engine, tmp_path):
    model = build()
    ids = torch.randint(0, 256, (3, 10))
    attention_mask = torch.ones(3, 10, dtype=torch.long)
    attention_mask[1, :4] = 0  # left padding: the padding queries see no key at all
    attention_mask[2, :9] = 0
    with torch.no_grad():
        ref = model(ids, attention_mask=attention_mask).logits
    problems = _captured(model, ids, attention_mask=attention_mask)
    assert any(p.op == "sdpa_fwd" and p.has_tensor("mask") for p in problems)
    farm.apply(model, _decide(tmp_path / "o.json", problems, {"sdpa_fwd": engine}))
    try:
        with torch.no_grad():
            for _ in range(2):  # discovered, then bound
                out = model(ids, attention_mask=attention_mask).logits
        routed = [r for r in applied_to(model).routed.values() if r.route.routed and r.problem.op == "sdpa_fwd"]
        assert routed and all(r.route.labels["eager"].startswith(engine) for r in routed)
        assert not out.isnan().any() and _same(out, ref)
    finally:
        farm.unapply(model)


# -- threads --------------------------------------------------------------------------------------
class _Block(nn.Module):
    """A projection, attention, an output projection: a bound linear and a bound attention plan with a workspace."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.out = nn.Linear(64, 64)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, 64))


def _applied_block(tmp_path):
    torch.manual_seed(0)
    model = _Block().eval()
    xs = [torch.randn(4, 96, 64) for _ in range(6)]
    path = _decide(tmp_path / "o.json", _captured(model, xs[0]), {"sdpa_fwd": "cpu.sdpa.materialized"})
    return model, xs, path


def _in_threads(n: int, work) -> list:
    failures: list = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can: shared scratch would show
    try:
        threads = [threading.Thread(target=work, args=(i, failures)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return failures


def test_threads_calling_one_applied_model_get_torchs_outputs(tmp_path):
    model, xs, path = _applied_block(tmp_path)
    with torch.no_grad():
        refs = [model(x) for x in xs]
    farm.apply(model, path)
    with torch.no_grad():
        model(xs[0])  # discovered here; the threads share the bound plans

    def work(i, failures):
        with torch.no_grad():
            for j in range(60):
                n = (i + j) % len(xs)
                y = model(xs[n])
                if not isinstance(y, torch.Tensor) or not _same(y, refs[n]):
                    failures.append((i, j))

    try:
        assert _in_threads(6, work) == []
        assert any(r.route.routed and r.problem.op == "sdpa_fwd" for r in applied_to(model).routed.values())
    finally:
        farm.unapply(model)


def test_a_weight_reloaded_while_threads_call_gives_a_tensor_of_the_old_or_the_new_weight(tmp_path):
    model, xs, path = _applied_block(tmp_path)
    x = xs[0]
    weights = [model.out.weight.data.clone(), torch.randn_like(model.out.weight)]
    refs = []
    with torch.no_grad():
        for w in weights:
            model.out.weight.data = w.clone()
            refs.append(model(x))
    farm.apply(model, path)
    stop = threading.Event()

    def reload():
        n = 0
        while not stop.is_set():
            model.out.weight.data = weights[n % 2].clone()  # a hot reload: new memory, the same Parameter
            n += 1

    def work(i, failures):
        if i == 0:
            return reload()
        with torch.no_grad():
            for j in range(300):
                y = model(x)
                if not isinstance(y, torch.Tensor):
                    failures.append(type(y).__name__)
                elif not (_same(y, refs[0]) or _same(y, refs[1])):
                    failures.append("a mixed output")
        if i == 1:
            stop.set()

    try:
        assert _in_threads(4, work) == []
    finally:
        stop.set()
        farm.unapply(model)


# -- autograd -------------------------------------------------------------------------------------
class _Biased(nn.Module):
    """Linear layers and attention with a learned additive bias over the scores (an ALiBi-like mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)
        self.score_bias = nn.Parameter(torch.zeros(1, 1, 8, 8))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 16).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.score_bias)
        return self.out(y.transpose(1, 2).reshape(b, t, 32))


def _grads(model, x):
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        model(x).square().sum().backward()
    return {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("trainable", ["bitfit", "score_bias", "input_only"])
def test_a_call_reading_a_tensor_that_needs_a_gradient_runs_the_models_own_call(trainable, tmp_path):
    torch.manual_seed(0)
    model = _Biased()
    with torch.no_grad():
        model.score_bias.normal_()
    x = torch.randn(2, 8, 32)
    path = _decide(tmp_path / "o.json", _captured(model, x), {"sdpa_fwd": "cpu.sdpa.materialized"})
    for name, p in model.named_parameters():  # BitFit: the biases alone; or the score bias; or nothing at all
        p.requires_grad_(trainable == "bitfit" and name.endswith(".bias") or
                         trainable == "score_bias" and name == "score_bias")
    if trainable == "input_only":
        x.requires_grad_()
    ref = _grads(model, x)
    ref_x = x.grad.clone() if x.grad is not None else None
    x.grad = None
    farm.apply(model, path)
    try:
        with torch.no_grad():
            model(x)  # routed where nothing needs a gradient
        assert any(r.route.routed for r in applied_to(model).routed.values())
        got = _grads(model, x)
        assert got.keys() == ref.keys()
        for name in ref:
            assert (got[name] is None) == (ref[name] is None), name
            if ref[name] is not None:
                assert _same(got[name], ref[name]), name
        if ref_x is not None:
            assert _same(x.grad, ref_x)
    finally:
        farm.unapply(model)


# -- scope ----------------------------------------------------------------------------------------
class _WithHelper(nn.Module):
    """Calls attention itself and through a helper module it holds in a plain list (not one of its modules)."""

    def __init__(self, helper: nn.Module) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.helpers = [helper]

    def forward(self, q, k, v):
        own = F.scaled_dot_product_attention(q, k, v)
        return self.proj(own) + self.helpers[0](q, k, v)


class _Helper(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_a_module_that_is_not_the_models_runs_torchs_call_inside_the_applied_forward(tmp_path):
    torch.manual_seed(0)
    helper = _Helper()
    model = _WithHelper(helper).eval()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    with torch.no_grad():
        ref = model(q, k, v)
    problems = [p for p in _captured(model, q, k, v) if p.op == "sdpa_fwd"]
    farm.apply(model, _decide(tmp_path / "o.json", problems, {"sdpa_fwd": "cpu.sdpa.online"}))
    seen = []
    original = farm.nn.function_scope.FunctionScope.run_sdpa

    def spy(self, *args, label="", **kwargs):
        seen.append(label)
        return original(self, *args, label=label, **kwargs)

    farm.nn.function_scope.FunctionScope.run_sdpa = spy
    try:
        with torch.no_grad():
            out = model(q, k, v)
            out = model(q, k, v)
        assert _same(out, ref)
        assert seen and set(seen) == {"(model) (function)"}  # the model's own call; never the helper's
        assert seen.count("(model) (function)") == 2
    finally:
        farm.nn.function_scope.FunctionScope.run_sdpa = original
        farm.unapply(model)


# -- the smaller cases ----------------------------------------------------------------------------
class _Experts(nn.Module):
    """A mixture of experts: each expert gets the tokens routed to it, and may get none."""

    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

    def forward(self, x, choice):
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            picked = choice == i
            out[picked] = expert(x[picked])
        return out


def test_an_empty_batch_under_a_wildcard_rule_runs_torchs_call(tmp_path):
    torch.manual_seed(0)
    model = _Experts().eval()
    x = torch.randn(6, 16)
    wild = OverrideEntry("matmul", "cpu.matmul.blocked", (TensorRule("A", (-1, 16)), TensorRule("B", (16, 16)),
                                                        TensorRule("bias", (16,))), compute_data_type="fp32")
    choices = (torch.tensor([0, 1, 0, 1, 0, 1]), torch.zeros(6, dtype=torch.long))  # the second: expert 1 gets none
    with torch.no_grad():
        refs = [model(x, c) for c in choices]
    farm.apply(model, _write(tmp_path / "o.json", [wild]))
    try:
        with torch.no_grad():
            for choice, ref in zip(choices, refs):
                assert _same(model(x, choice), ref)
        assert any(r.route.routed for r in applied_to(model).routed.values())  # the tokens an expert got: routed
    finally:
        farm.unapply(model)


class _Mixed(nn.Module):
    """An int64 matmul (index arithmetic) beside a float one, in one forward."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("w", torch.randn(8, 8))

    def forward(self, x, ids):
        return self.proj(x @ self.w), ids @ ids.T


def test_an_int64_call_runs_torchs_call_and_the_capture_lists_it_naming_the_call(tmp_path):
    model = _Mixed().eval()
    x, ids = torch.randn(4, 8), torch.arange(12).view(4, 3)
    with torch.no_grad(), farm.capture(model) as c:
        model(x, ids)
    w = c.workload()
    assert len(w.problems) == 2  # the float matmul and the linear: the rest is captured
    skipped = [s for s in w.skipped if "int64" in s.reason]
    assert skipped and skipped[0].sites == ("_Mixed",)  # the module making the call
    path = _decide(tmp_path / "o.json", [p.problem for p in w.problems])
    with torch.no_grad():
        ref = model(x, ids)
    farm.apply(model, path)
    try:
        with torch.no_grad():
            for _ in range(2):
                got = model(x, ids)
        assert _same(got[0], ref[0]) and torch.equal(got[1], ref[1]) and got[1].dtype == torch.int64
    finally:
        farm.unapply(model)


def test_torch_jit_trace_of_an_applied_model_records_the_models_own_calls(tmp_path):
    model, xs, path = _applied_block(tmp_path)
    with torch.no_grad():
        ref = model(xs[1])
    farm.apply(model, path)
    try:
        with torch.no_grad():
            model(xs[0])
            traced = torch.jit.trace(model, (xs[0],), check_trace=False)
            assert _same(traced(xs[1]), ref)
            assert _same(model(xs[1]), ref)  # the applied model itself is still routed
    finally:
        farm.unapply(model)


def test_multihead_attention_conv1d_and_a_strided_norm_input_are_listed_not_silently_dropped():
    class Encoder(nn.Module):  # as Whisper's: a Conv1d front, a transposed view into LayerNorm; an MHA block
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(8, 16, 3, padding=1)
            self.norm = nn.LayerNorm(16)
            self.mha = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            h = self.conv(x).permute(0, 2, 1) + torch.zeros(x.shape[-1], 16)
            h = self.norm(h)
            return self.mha(h, h, h, need_weights=False)[0]

    model = Encoder().eval()
    with torch.no_grad(), farm.capture(model) as c:
        model(torch.randn(2, 8, 12))
    reasons = {s.kind: (s.reason, s.sites) for s in c.workload().skipped}
    assert "conv1d" in reasons and reasons["conv1d"][1] == ("conv",)
    assert "multi_head_attention" in reasons and reasons["multi_head_attention"][1] == ("mha",)
    assert "strided input" in reasons["layer_norm"][0] and reasons["layer_norm"][1] == ("norm",)


# -- masked attention decisions ---------------------------------------------------------------------
class _SlidingWindow(nn.Module):
    """Attention under a sliding-window causal mask (Mistral's): a bool mask [1, 1, T, T]."""

    def __init__(self, window: int = 16) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.window = window

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
        i = torch.arange(t)
        mask = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < self.window))[None, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_farm_ops_sdpa_takes_a_mask_and_an_expanded_one(tmp_path):
    import farm.ops as ops

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    keep = torch.rand(1, 1, 8, 8) > 0.4
    keep[..., 3, :] = False
    expanded = keep.expand(2, 4, 8, 8)  # stride 0 where it broadcasts, as transformers passes it
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    for mask in (keep, expanded):
        got = ops.sdpa(q, k, v, mask)
        assert _same(got, ref) and not got.isnan().any()
    assert _same(torch.from_numpy(ops.sdpa(q.numpy(), k.numpy(), v.numpy(), keep.numpy())), ref)
    with pytest.raises(farm.InputError, match="causal"):
        ops.sdpa(q, k, v, keep, causal=True)


def test_a_masked_attention_decision_survives_verify_reaches_the_file_and_is_routed(tmp_path, capsys):
    import json

    import yaml

    from farm.cli.main import main

    torch.manual_seed(0)
    model = _SlidingWindow().eval()
    x = torch.randn(1, 48, 64)
    with torch.no_grad(), farm.capture(model) as c:
        model(x)
    w = tmp_path / "w.yaml"
    c.workload().write(w)
    doc = yaml.safe_load(w.read_text())
    doc["problems"] = [p for p in doc["problems"] if p["op"] == "sdpa_fwd"]  # the attention alone: a short tune
    doc["autotune"] = {"strategy": "fixed_average", "timed_iterations": 3, "warmup_iterations": 1}
    w.write_text(yaml.safe_dump(doc))
    assert main(["tune", str(w), "--in-process", "--devices", "cpu", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "runs ? here" not in out
    [path] = (tmp_path / "run" / "overrides").glob("*.json")
    entries = json.loads(path.read_text())["engine_overrides"]
    assert [e["op"] for e in entries] == ["sdpa_fwd"]
    verified = entries[0]["autotune_metadata"]["selection"].get("verified", {})
    # replayed as farm.apply runs it, and judged (on a noisy CPU a winner may not hold and the default is published)
    assert verified.get("verdict", "").startswith(("holds", "fixed: delivers")), verified
    assert "mask" in {t["tensor_id"] for t in entries[0]["tensors"]}
    # the decision routed (the tune's own, or the file's rule set to an engine that is not the default)
    entries[0]["engine_name"] = "cpu.sdpa.online"
    path.write_text(json.dumps({**json.loads(path.read_text()), "engine_overrides": entries}))
    with torch.no_grad():
        ref = model(x)
    farm.apply(model, str(tmp_path / "run"))
    try:
        with torch.no_grad():
            for _ in range(2):
                got = model(x)
        routed = [r for r in applied_to(model).routed.values() if r.route.routed]
        assert routed and routed[0].route.labels["eager"].startswith("cpu.sdpa.online")
        assert _same(got, ref)
    finally:
        farm.unapply(model)


def test_the_model_checks_untouched_step_runs_no_scope_mode_the_attention_decision_alone_does(tmp_path):
    """Routing attention costs every torch call inside a scoped forward a trip through the scope's mode; the
    model check's untouched step must not pay it, or a decision slower than the model's own call looks free."""
    torch.manual_seed(0)
    model = _WithHelper(_Helper()).eval()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    problems = [p for p in _captured(model, q, k, v) if p.op == "sdpa_fwd"]
    farm.apply(model, _decide(tmp_path / "o.json", problems, {"sdpa_fwd": "cpu.sdpa.online"}))
    entered = []
    original = farm.nn.function_scope.FunctionScope.entered

    def spy(self, kinds, run):
        entered.append(kinds)
        return original(self, kinds, run)

    farm.nn.function_scope.FunctionScope.entered = spy
    try:
        applied = applied_to(model)
        with torch.no_grad():
            model(q, k, v)  # discovery: the model's scoped modules found
            applied.only(frozenset())  # the model check's untouched step
            entered.clear()
            model(q, k, v)
            assert entered == []
            applied.only(frozenset(r.problem.key for r in applied.routed.values() if r.problem.op == "sdpa_fwd"))
            model(q, k, v)
            assert entered, "the attention decision alone enters the scope"
    finally:
        farm.nn.function_scope.FunctionScope.entered = original
        farm.unapply(model)


def test_a_module_whose_op_has_no_eager_decision_runs_its_own_forward_without_routings_checks(tmp_path):
    """A host-bound eager step pays each routed module's checks (its layout key, the chooser, whether a graph is
    captured); where nothing of the module's op runs in eager (graph decisions only, the model check's untouched
    step) the module's own forward runs at once, with the same output."""
    from farm.nn.module_sites import LinearSite

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)).eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        ref = model(x)
    path = _decide(tmp_path / "o.json", _captured(model, x))
    runs = []
    original = LinearSite.run

    def spy(self, *args):
        runs.append(self.name)
        return original(self, *args)

    LinearSite.run = spy
    try:
        for call, routed_in_eager in (("graph", False), ("auto", True)):
            farm.apply(model, path, call=call)
            runs.clear()
            with torch.no_grad():
                assert _same(model(x), ref)
            assert bool(runs) == routed_in_eager, (call, runs)
            if routed_in_eager:
                applied_to(model).only(frozenset())  # the model check's untouched step
                runs.clear()
                with torch.no_grad():
                    assert _same(model(x), ref)
                assert runs == []
                applied_to(model).only(None)
                with torch.no_grad():
                    model(x)
                assert runs
            farm.unapply(model)
    finally:
        LinearSite.run = original
        farm.unapply(model)


def test_the_registry_of_routed_sites_shrinks_when_models_are_unapplied_or_dropped(tmp_path):
    import gc

    from farm.nn.compiled import SITES

    model = _WithHelper(_Helper()).eval()
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    path = _decide(tmp_path / "o.json", [p for p in _captured(model, q, k, v) if p.op == "sdpa_fwd"],
                   {"sdpa_fwd": "cpu.sdpa.online"})
    gc.collect()  # earlier tests' models, dropped but not yet collected
    before = len(SITES)
    for _ in range(5):
        farm.apply(model, path)
        farm.unapply(model)
    assert len(SITES) == before
    other = _WithHelper(_Helper()).eval()
    farm.apply(other, path)
    assert len(SITES) > before
    numbers = [s.number for s in applied_to(other).all_sites()]
    del other
    gc.collect()
    assert len(SITES) == before  # a model dropped without unapply takes its sites with it
    with pytest.raises(RuntimeError, match="was removed"):
        SITES[numbers[0]]
