"""Models end to end on the CPU: farm.capture into a workload, farm.apply routing only non-default decisions
(eager, torch.compile), the model check withdrawing what slows the step, and the tuner ranking a host-bound
step's eager calls by host time. (tests/gpu/test_models_gpu.py: the same on a CUDA GPU, graphs included.)"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the model tests need torch (pip install torch==2.14.1, as .ci/run does)")

import farm  # noqa: E402
from farm.devices.device import cpu_device  # noqa: E402
from farm.errors import InputError  # noqa: E402
from farm.model.records import CallMode  # noqa: E402
from farm.model.workload import load_workload  # noqa: E402
from farm.model.model_steps import StepInfo, Use  # noqa: E402
from farm.nn.captured import CapturedWorkload, merge, workload_dict  # noqa: E402
from farm.nn.routing import applied_to  # noqa: E402
from farm.nn.step_check import CheckSettings, check_step  # noqa: E402
from farm.nn.step_record import record_check  # noqa: E402
from farm.nn.torch_calls import read_call  # noqa: E402
from farm.store.overrides.parsing import load_overrides  # noqa: E402
from farm.store.overrides.files import write_overrides  # noqa: E402
from farm.store.overrides.entries import OverrideEntry  # noqa: E402
from farm.store.targets import resolve  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import models  # noqa: E402

F = torch.nn.functional
CPU = cpu_device()


@pytest.fixture(autouse=True)
def _no_grad_and_clean(monkeypatch):
    monkeypatch.delenv("FARM_HEUR_CONFIG_PATH", raising=False)
    with torch.no_grad():
        yield


def _capture(batch=1, device="cpu", size="tiny", **kw):
    model, inputs = models.decoder(batch=batch, size=size, device=device, **kw)
    with farm.capture(model, label=f"batch={batch}") as c:
        model(*inputs)
    return c, model, inputs


def _problems(w):
    return [{k: v for k, v in p.items() if k != "steps"} for p in workload_dict(w)["problems"]]


# -- capture -----------------------------------------------------------------------------------------
def test_capture_records_each_tunable_call_with_its_kernel_layout_calls_and_sites():
    c, model, _ = _capture(batch=4, eps=1e-5)
    w = c.workload()
    by_name = {p.kind + ":" + ",".join(p.sites): p for p in w.problems}
    qkv = by_name["linear:layers.*.self_attn.qkv_proj"]
    s = models.SIZES["tiny"]
    a, b = qkv.problem.tensor("A"), qkv.problem.tensor("B")
    # F.linear's weight [N, K] is the kernel's B = W.T: [K, N] with strides (1, K); the input folded to [M, K]
    assert a.dims == (4, s.hidden) and b.dims == (s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim)
    assert b.strides == (1, s.hidden) and qkv.problem.has_tensor("bias")
    assert qkv.uses[0].calls == s.layers  # one call a layer, layer numbers folded into the site
    sdpa = by_name["sdpa:layers.*.self_attn"]
    assert sdpa.problem.tensor("K").dims == (4, s.kv_heads, s.context, s.head_dim)
    norms = [p for p in w.problems if p.kind == "rms_norm"]
    assert sum(u.calls for p in norms for u in p.uses) == 2 * s.layers + 1
    assert w.skipped == () and all(p.calls == ("eager",) for p in w.problems)


def test_capture_on_meta_gives_the_same_problems_as_on_the_device():
    on_cpu, _, _ = _capture(batch=2)
    on_meta, _, _ = _capture(batch=2, device="meta", dtype="float32")  # meta stands for a GPU: bf16 by default
    assert _problems(on_cpu.workload()) == _problems(on_meta.workload())
    with pytest.raises(farm.UsageError, match="meta"):
        on_meta.time_step(lambda: None)


def test_a_channels_last_network_captured_on_meta_keeps_its_layout_as_on_a_device():
    model, (x,) = models.resnet50(batch=2, image=32, width=8, device="meta", dtype="float16")
    with farm.capture(model, label="n2") as c:
        model(x)
    convs = [p.problem for p in c.workload().problems if p.kind == "conv2d"]
    assert len(convs) > 10
    # every convolution's input and output NHWC, as torch's GPU kernels keep them (its meta kernel would not)
    assert all(p.tensor("X").strides[1] == 1 and p.tensor("Y").strides[1] == 1 for p in convs)


def test_capture_skips_what_the_farm_cannot_run_and_says_why(tmp_path):
    x = torch.randn(2, 4, 8, 16)
    mask = torch.ones(8, 8, dtype=torch.bool)
    lin = torch.nn.Linear(16, 32)
    with farm.capture(label="s") as c:
        F.scaled_dot_product_attention(x, x, x, attn_mask=mask)  # 2-D: torch broadcasts it, the farm's is 4-D
        F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
        F.rms_norm(x, (16,), torch.ones(16), eps=3.3e-13)  # eps below the 1e-12 its criterion counts in
        torch.nn.RMSNorm(16, eps=1e-6)(x)  # any eps a whole multiple of 1e-12: captured
        F.layer_norm(x, (16,), torch.ones(16), torch.zeros(16), eps=1e-6)  # a norm outside a norm module: not routed
        torch.bmm(x[0], x[0].transpose(1, 2))
        torch.addmm(torch.zeros(8), x[0, 0], x[0, 0].t())
        F.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), padding="same")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lin(x)
    w = c.workload()
    reasons = {s.kind: s.reason for s in w.skipped}
    assert {r for k, r in ((s.kind, s.reason) for s in w.skipped) if k == "sdpa"} == {
        "an attention mask that is not 4-D", "dropout"}
    assert "eps 3.3e-13 is not a whole multiple of 1e-12" in reasons["rms_norm"]
    assert "a norm computed by no module" in reasons["layer_norm"]
    assert "autocast" in reasons["linear"]
    kinds = sorted(p.kind for p in w.problems)
    assert kinds == ["addmm", "bmm", "conv2d", "rms_norm"]
    norm = next(p for p in w.problems if p.kind == "rms_norm").problem
    assert norm.criteria_dict["eps_e12"] == 1_000_000 and "eps_e12=1000000" in norm.label()
    conv = next(p for p in w.problems if p.kind == "conv2d").problem
    assert conv.criteria_dict["pad_h"] == conv.criteria_dict["pad_w"] == 1
    text = w.write(tmp_path / "w.yaml").read_text()
    assert "# not captured: 1 sdpa call(s)" in text and "an attention mask that is not 4-D" in text


@pytest.mark.slow
def test_captures_of_two_batch_sizes_merge_and_load_as_a_workload_with_its_steps(tmp_path):
    parts = []
    for batch in (1, 4):
        c, model, inputs = _capture(batch=batch)
        step = c.time_step(lambda: model(*inputs), repeats=3)
        assert step.bound == "host" and step.wall_ms >= step.host_ms > 0  # a CPU step is the host's work
        parts.append(c.workload())
    merged = merge(parts, name="tiny")
    path = merged.write(tmp_path / "w.yaml", {"call": ["eager", "graph"], "autotune": {"max_iterations": 5}})
    wl = load_workload(path)
    assert [s.label for s in wl.steps] == ["batch=1", "batch=4"]
    assert len(wl.problems) == len(parts[0].problems) + len(parts[1].problems)  # no problem shared
    assert all(p.host_bound and p.uses and p.sites for p in wl.problems)
    assert all(p.calls == (CallMode.EAGER, CallMode.GRAPH) for p in wl.problems)
    one = wl.problems[0]
    assert one.uses[0].ms > 0 and 0 < one.uses[0].share < 1
    # a problem two steps share: one problem, a use per step
    again = CapturedWorkload("x", (StepInfo("again"),),
                             tuple(dataclasses.replace(p, uses=(Use("again", 3),)) for p in parts[0].problems))
    twice = merge([parts[0], again])
    assert len(twice.problems) == len(parts[0].problems)
    assert [u.step for u in twice.problems[0].uses] == ["batch=1", "again"]
    with pytest.raises(InputError, match="same step label"):
        merge([parts[0], parts[0]])


def test_a_workload_naming_a_step_it_does_not_list_is_refused(tmp_path):
    (tmp_path / "w.yaml").write_text(
        "steps: [{label: a, bound: host}]\n"
        "problems:\n- {op: matmul, tensors: {A: [2, 3], B: [3, 4]}, steps: {b: {calls: 2}}}\n")
    with pytest.raises(InputError) as err:
        load_workload(tmp_path / "w.yaml")
    assert "problems[0].steps.b" in str(err.value) and "no such step" in str(err.value)
    (tmp_path / "w.yaml").write_text("steps: [{label: a, bound: sometimes}]\nproblems:\n- {op: matmul, tensors: "
                                     "{A: [2, 3], B: [3, 4]}}\n")
    with pytest.raises(InputError, match="steps\\[0\\].bound"):
        load_workload(tmp_path / "w.yaml")


def test_pytorch_tunableops_untuned_file_is_read_as_a_workload(tmp_path):
    path = tmp_path / "tunableop_untuned0.csv"
    path.write_text("GemmTunableOp_BFloat16_TN,tn_4608_1_3584_ld_3584_3584_4608\n"
                    "GemmTunableOp_BFloat16_TN,tn_4608_1_3584_ld_3584_3584_4608\n"
                    "GemmAndBiasTunableOp_Half_TN,tn_4608_8_3584_ld_3584_3584_4608\n"
                    "GemmStridedBatchedTunableOp_float_NN,nn_64_128_32_B_16_ld_64_32_64\n"
                    "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN,tn_16_16_16_ld_16_16_16\n")
    wl = load_workload(path)
    assert [p.problem.op for p in wl.problems] == ["matmul"] * 3
    linear = wl.problems[0].problem
    # TunableOp's column-major view of F.linear(x[1, 3584], W[4608, 3584]): what farm.capture records for it
    x, w = torch.empty(1, 3584, dtype=torch.bfloat16, device="meta"), torch.empty(4608, 3584, dtype=torch.bfloat16,
                                                                                  device="meta")
    assert linear.key == read_call(F.linear, (x, w), {}).problem.key
    assert wl.problems[1].problem.has_tensor("bias") and wl.problems[1].problem.dtype == "fp16"
    assert wl.problems[2].problem.tensor("A").dims == (16, 128, 32)  # our M is its n, K its k
    assert wl.problems[2].problem.tensor("B").dims == (16, 32, 64)
    assert "ScaledGemmTunableOp" in wl.description
    path.write_text("ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN,tn_16_16_16_ld_16_16_16\n")
    with pytest.raises(InputError, match="no GEMM line"):
        load_workload(path)


# -- apply ---------------------------------------------------------------------------------------------
def _override_file(path, entries):
    write_overrides(str(path), entries, device={"signature": CPU.signature, "properties": CPU.properties.to_dict()},
                    mode="replace")
    return str(path)


def _routed_modules(model):
    return [n for n, m in model.named_modules() if "_farm_site" in m.__dict__]


def _linear_problem(model, inputs, module):
    x = model.embed_tokens(inputs[0])
    return read_call(F.linear, (x.reshape(-1, x.shape[-1]), module.weight, module.bias), {}).problem


def test_apply_routes_only_non_default_decisions_and_unapply_restores(tmp_path):
    model, inputs = models.decoder(batch=2, size="small")
    ref = model(*inputs)
    up = model.layers[0].mlp.gate_up_proj
    o = model.layers[0].self_attn.o_proj
    path = _override_file(tmp_path / "o.json", [
        OverrideEntry.for_problem(_linear_problem(model, inputs, up), "cpu.matmul.blocked", (("block_k", 128),)),
        # torch's own call: the default of a torch model's call on a CPU, not routed
        OverrideEntry.for_problem(_linear_problem(model, inputs, o), "torch.cpu.matmul")])
    farm.apply(model, path)
    assert _routed_modules(model) == [f"layers.{i}.mlp.gate_up_proj" for i in range(len(model.layers))]
    assert all(type(model.layers[i].mlp.gate_up_proj).__mro__[1] is torch.nn.Linear for i in range(len(model.layers)))
    out = model(*inputs)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
    routed = applied_to(model).routed
    assert [r.route.labels["eager"] for r in routed.values() if r.route.routed] == ["cpu.matmul.blocked[block_k=128]"]
    assert len(next(iter(routed.values())).sites) == len(model.layers)
    farm.unapply(model)
    assert not _routed_modules(model) and applied_to(model) is None
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))


def test_apply_under_torch_compile_keeps_one_graph_and_runs_the_farm_op(tmp_path):
    model, inputs = models.decoder(batch=2, size="small")
    ref = model(*inputs)
    up = model.layers[0].mlp.gate_up_proj
    path = _override_file(tmp_path / "o.json", [
        OverrideEntry.for_problem(_linear_problem(model, inputs, up), "cpu.matmul.blocked", (("block_k", 128),))])
    farm.apply(model, path)
    torch._dynamo.reset()
    gm_ops = []

    def backend(gm, example):
        gm_ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    compiled = torch.compile(model, backend=backend, fullgraph=True)  # fullgraph: a graph break is an error
    out = compiled(*inputs)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert sum("farm.linear" in t for t in gm_ops) == len(model.layers)
    farm.unapply(model)


def test_apply_leaves_autograd_to_the_module(tmp_path):
    model, inputs = models.decoder(batch=2, size="tiny")
    up = model.layers[0].mlp.gate_up_proj
    path = _override_file(tmp_path / "o.json", [
        OverrideEntry.for_problem(_linear_problem(model, inputs, up), "cpu.matmul.blocked", (("block_k", 128),))])
    farm.apply(model, path)
    with torch.enable_grad():
        model(*inputs).sum().backward()
    assert up.weight.grad is not None and up.weight.grad.abs().sum() > 0
    farm.unapply(model)


def test_apply_refuses_a_model_on_meta_and_a_missing_file(tmp_path):
    model, _ = models.decoder(size="tiny", device="meta")
    with pytest.raises(farm.UsageError, match="not meta"):
        farm.apply(model, str(tmp_path))
    model, _ = models.decoder(size="tiny")
    with pytest.raises(farm.UsageError, match="FARM_HEUR_CONFIG_PATH"):
        farm.apply(model)
    with pytest.raises(InputError, match="no such file"):
        farm.apply(model, str(tmp_path / "missing.json"))


# -- the model check -------------------------------------------------------------------------------------
def _slow_decisions(tmp_path, model, inputs):
    """numpy's einsum for the MLP's projections: a third of torch's own GEMM's speed on the CPU, whatever the load."""
    entries = []
    for m in (model.layers[0].mlp.gate_up_proj, model.layers[0].mlp.down_proj):
        p = read_call(F.linear, (torch.empty(1, m.in_features), m.weight, None), {}).problem
        entries.append(OverrideEntry.for_problem(p, "cpu.matmul.einsum", metadata={"problem_name": f"p{len(entries)}"}))
    return _override_file(tmp_path / "o.json", entries)


@pytest.mark.slow
def test_the_model_check_withdraws_decisions_the_step_is_slower_with_and_rewrites_the_file(tmp_path):
    model, inputs = models.decoder(batch=1, size="small", device="cpu")
    path = _slow_decisions(tmp_path, model, inputs)
    farm.apply(model, path)
    check = check_step(lambda: model(*inputs), applied_to(model), call="eager", model="small",
                       settings=CheckSettings(rounds=8, sample_ms=30))
    assert len(check.judged) == 2 and not any(j.kept for j in check.judged)
    assert all(j.alone.speedup < 1 and j.verdict.startswith("withdrawn") for j in check.judged)
    assert check.result is None and applied_to(model).enabled == frozenset()  # the model runs the library's calls
    lines = record_check(check, resolve(path, CPU), load_overrides(path), CPU)
    assert "2 decision(s) withdrawn" in lines[0]
    doc = json.loads(Path(path).read_text())
    for e in doc["engine_overrides"]:
        assert e["engine_name"] == "torch.cpu.matmul"  # the default of a torch model's call on a CPU
        sel = e["autotune_metadata"]["selection"]
        assert sel["rule"] == "withdrawn_in_model" and sel["model_check"]["step_speedup"] < 1
    farm.unapply(model)
    farm.apply(model, path)  # the rewritten file: every decision the default, nothing routed
    assert not _routed_modules(model)
    farm.unapply(model)


def test_a_withdrawn_decision_in_a_run_folder_is_the_reducers_default_on_every_surface(tmp_path):
    from fakes import fake_result, write_results

    from farm.store.reduce import reduce_results

    model, inputs = models.decoder(batch=1, size="small", device="cpu")
    up = model.layers[0].mlp.gate_up_proj
    problem = _linear_problem(model, inputs, up)
    run = tmp_path / "run"
    props = CPU.properties
    write_results(run / "results", {props: [(problem, "up", [fake_result(problem, "torch.cpu.matmul", (1.0,) * 8),
                                                             fake_result(problem, "cpu.matmul.einsum", (0.8,) * 8,
                                                                         candidate=2)])]})
    stage = [fake_result(problem, "torch.cpu.matmul", tuple(1.0 + 0.01 * i for i in range(11))),
             fake_result(problem, "cpu.matmul.einsum", tuple(0.8 + 0.01 * i for i in range(11)), candidate=2)]
    write_results(run / "results", {props: [(problem, "up", stage)]}, round="confirm", call="eager")
    reduce_results(run / "results", run / "overrides")
    overrides = run / "overrides" / f"{CPU.signature}.json"
    assert json.loads(overrides.read_text())["engine_overrides"][0]["engine_name"] == "cpu.matmul.einsum"
    (run / "job.json").write_text(json.dumps({"job_id": "job1"}))
    farm.apply(model, str(run))
    check = check_step(lambda: model(*inputs), applied_to(model), call="eager", model="small[batch=1]",
                       settings=CheckSettings(rounds=8, sample_ms=30))
    assert [j.kept for j in check.judged] == [False]
    lines = record_check(check, resolve(str(run), CPU), load_overrides(str(overrides)), CPU)
    assert "2 model check row(s)" in lines[0]
    entry = json.loads(overrides.read_text())["engine_overrides"][0]
    sel = entry["autotune_metadata"]["selection"]
    assert entry["engine_name"] == "torch.cpu.matmul" and sel["rule"] == "withdrawn_in_model"
    assert sel["model_check"]["model"] == "small[batch=1]" and sel["model_check"]["step_speedup"] < 1
    assert entry["autotune_metadata"]["median_time_ms"] == pytest.approx(np.median(stage[0].samples))
    import duckdb

    row = duckdb.sql(f"SELECT engine_name, rule, model_verdict FROM '{run}/overrides/*.winners.parquet'").fetchall()[0]
    assert row[0] == "torch.cpu.matmul" and row[1] == "withdrawn_in_model" and row[2].startswith("withdrawn")
    farm.unapply(model)


# -- host time ---------------------------------------------------------------------------------------------
def test_an_eager_stage_of_a_host_bound_step_ranks_by_host_time_and_records_it():
    from farm.model.plans import PlanSpec
    from farm.model.engine import default_engine_registry
    from farm.model.ids import engine_name_to_id
    from farm.model.problem import Problem
    from farm.model.records import AutotuneConfig, CallMode, ConfirmSettings
    from farm.tuner.judging.confirm import run_confirmation

    problem = Problem.create("matmul", {"A": {"dims": [64, 64]}, "B": {"dims": [64, 64]}})
    specs = [(PlanSpec(engine_name_to_id("cpu.matmul.blas"), ()), 0), (PlanSpec(engine_name_to_id("cpu.matmul.einsum"),
                                                                                 ()), 1)]
    config = AutotuneConfig(confirm=ConfirmSettings(max_rounds=8, budget_ms=50, sample_ms=2))
    runs = {by: run_confirmation(problem, CPU, default_engine_registry(), specs, reference=specs[0][0],
                                 call=CallMode.EAGER, config=config, by_host=by) for by in (True, False)}
    for by, run in runs.items():
        for r in run.results:
            assert r.succeeded and r.host_ms is not None and r.host_ms > 0
            assert r.ranked_by == ("host" if by else "")
    host_rows = runs[True].results
    # the samples are the host times a call: their median is the recorded host time
    assert all(r.median_ms == pytest.approx(r.host_ms, rel=1e-9) for r in host_rows)
    assert "ranked by the host's time a call" in host_rows[0].error


def test_capture_does_not_replace_a_workload_at_its_default_path_unasked(tmp_path):
    """Without --out, farm capture writes runs/<name>/workload.yaml: a second capture there (a --meta one after a
    device's, say) is refused in one line before any work, unless --force (issue 64)."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}

    def capture(*extra):
        return subprocess.run([sys.executable, "-m", "farm", "capture", f"{root}/examples/models.py:decoder",
                               "--no-time", *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    first = capture()
    assert first.returncode == 0, first.stderr[-2000:]
    written = (tmp_path / "runs" / "decoder" / "workload.yaml").read_text()
    again = capture("--meta")
    assert again.returncode == 2 and "a workload is there already" in again.stderr and "--force" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert (tmp_path / "runs" / "decoder" / "workload.yaml").read_text() == written
    assert capture("--meta", "--force").returncode == 0
    meta = capture("--meta", "--out", "workloads/meta.yaml")
    assert meta.returncode == 0 and "next: farm tune workloads/meta.yaml --out runs/decoder" in " ".join(meta.stdout.split())
    # a run folder tuned from its workload (job.json beside it): the same problems captured again replace it (new
    # times), other problems are refused unless --force
    (tmp_path / "runs" / "decoder" / "job.json").write_text("{}")
    assert capture("--meta", "--out", "runs/decoder/workload.yaml").returncode == 0
    tuned = capture("--meta", "--with", "batch=3", "--out", "runs/decoder/workload.yaml")
    assert tuned.returncode == 2 and "tuned run's workload" in tuned.stderr and "--force" in tuned.stderr
    assert capture("--meta", "--with", "batch=3", "--out", "runs/decoder/workload.yaml", "--force").returncode == 0


def test_a_captured_workload_cut_short_is_refused_not_loaded_without_its_last_problems(tmp_path):
    c, _, _ = _capture(batch=2)
    path = c.workload().write(tmp_path / "w.yaml")
    whole = load_workload(path)
    text = path.read_text()
    last = text.rfind("\n- name:")  # cut at a line boundary before the last problem: still valid YAML
    path.write_text(text[:last + 1])
    with pytest.raises(InputError) as err:
        load_workload(path)
    assert f"wrote {len(whole.problems)} problem(s) here and {len(whole.problems) - 1} are read" in str(err.value)
    assert str(path) in str(err.value)
    # cut inside the last problem, before its sites: valid YAML, every problem there, the last one short
    path.write_text(text[:text.rfind("\n  sites:") + 1])
    with pytest.raises(InputError) as err:
        load_workload(path)
    assert "last line" in str(err.value) and "cut short" in str(err.value) and str(path) in str(err.value)
    path.write_text(text)
    assert len(load_workload(path).problems) == len(whole.problems)  # whole: loads


def test_a_template_asking_for_graph_calls_gives_a_cpu_capture_eager_calls_only_and_says_so(tmp_path):
    """A CPU has no CUDA graphs: graph decisions tuned there could never be checked (issue 64)."""
    import os
    import subprocess

    import yaml

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "farm", "capture", f"{root}/examples/models.py:decoder", "--no-time",
                           "--template", f"{root}/examples/model-step.yaml", "--out", str(tmp_path / "w.yaml"),
                           "--json"], env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any("no CUDA graphs" in n for n in json.loads(proc.stdout)["notes"])
    doc = yaml.safe_load((tmp_path / "w.yaml").read_text())
    assert doc["call"] == "eager" and doc["autotune"]["graph_repeats"] == 16  # the rest of the template kept
    assert load_workload(tmp_path / "w.yaml").problems[0].calls == (CallMode.EAGER,)


def test_mistakes_in_a_target_are_one_line_each(tmp_path):
    import os
    import subprocess

    (tmp_path / "t.py").write_text(
        "import torch\n"
        "def notmodule(batch=1): return (42, (torch.ones(1),))\n"
        "def listkw(batch=1): return (torch.nn.Linear(4, 4), (torch.ones(1, 4),), [1, 2])\n"
        "def noweights(batch=1): return (torch.nn.ReLU(), (torch.ones(1, 4),))\n"
        "def good(batch=1): return (torch.nn.Linear(4, 4), (torch.ones(batch, 4),))\n")
    cases = [(("capture", "t.py:notmodule"), "torch.nn.Module"),
             (("capture", "t.py:listkw"), "a mapping"),
             (("capture", "t.py:good", "--with", "nosuch=3"), "does not take these"),
             (("capture", "t.py:good", "--with", "batch=3,batch=4"), "given twice"),
             (("apply", "t.py:noweights", str(tmp_path)), "no parameters or buffers")]
    for args, said in cases:
        proc = subprocess.run([sys.executable, "-m", "farm", *args, *(("--out", "w.yaml") if args[0] == "capture"
                                                                     else ())], cwd=tmp_path, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                              timeout=300)
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        assert said in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
