"""What an eager caller pays (issue 43): the confirmation stage times what production runs, farm verify replays
every published decision where it runs, and farm.ops' per-call path stays a lookup plus the library call.

Everything here runs on the CPU and on simulated devices: the CPU engines through farm.ops' numpy path, and
simulated engines whose plans, compiled by a replaying process, can be made slower than the ones measured.
"""

import json

import numpy as np
import pytest

from farm.devices.device import cpu_device
from farm.errors import InputError
from farm.model.engine import DirectCall, EngineRegistry, default_engine_registry
from farm.model.ids import engine_name_to_id
from farm.model.plans import PlanSpec
from farm.model.problem import Problem
from farm.model.records import AutotuneConfig
from farm.tuner.callers import COLD_CACHE_FACTOR, cache_bytes, input_set_count
from farm.store.dataset import ResultsDataset
from farm.tuner.judging.confirm import run_confirmation
from tests.fakes import FakeEngine, fake_device, matmul_problem

FAST_STAGE = AutotuneConfig(check="off", confirm={"max_rounds": 8, "budget_ms": 50, "sample_ms": 2})


def _spec(registry, name, **knobs):
    return PlanSpec(engine_name_to_id(name), tuple(sorted(knobs.items())))


# -- the confirmation stage times what production calls ----------------------------------------------------------
def test_every_participant_gets_the_same_calls_a_sample_the_default_is_the_direct_call_the_rest_go_through_farm_ops(
        monkeypatch):
    import farm.dispatch.calls as calls

    entered = []
    real = calls.OpCalls.matmul

    def spy(self, *args, **kwargs):
        entered.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(calls.OpCalls, "matmul", spy)
    registry = default_engine_registry()
    problem = Problem.create("matmul", {"A": [48, 64], "B": [64, 32]}, dtype="fp32")
    default = _spec(registry, "cpu.matmul.blas")
    entries = [(default, 0), (_spec(registry, "cpu.matmul.blas", threads=1), 1),
               (_spec(registry, "cpu.matmul.einsum"), 2), (_spec(registry, "cpu.matmul.blocked", block_k=64), 3)]
    run = run_confirmation(problem, cpu_device(), registry, entries, reference=default, config=FAST_STAGE)
    rows = {r.spec: r for r in run.results}
    assert all(r.succeeded for r in rows.values()), [r.error for r in rows.values()]
    assert len({r.calls_per_sample for r in rows.values()}) == 1 and rows[default].calls_per_sample > 1
    assert rows[default].call_path == "direct" and "np.matmul(A, B)" in rows[default].error
    assert {rows[s].call_path for s, _ in entries[1:]} == {"replay"}
    assert all("farm.ops.matmul" in rows[s].error for s, _ in entries[1:])
    assert all(r.input_sets == 1 for r in rows.values())
    # the three challengers' calls went through farm.ops' own entry point: warm-up, estimate and every sample
    n, rounds = rows[default].calls_per_sample, rows[default].iterations
    assert len(entered) >= 3 * (1 + n * rounds)


class _Counted(FakeEngine):
    """A matmul engine whose plan and direct call are counted apart, and which notes the inputs each call got."""

    def __init__(self, name, *, direct=True, priority=100):
        super().__init__(name, priority=priority)
        self.direct_calls = 0
        self.seen_a: set[int] = set()
        self.has_direct = direct

    def compile(self, problem, knobs, device):
        plan = super().compile(problem, knobs, device)
        run = plan.run

        def counted(tensors, workspace, stream):
            self.seen_a.add(id(tensors["A"]))
            run(tensors, workspace, stream)

        plan.run = counted
        return plan

    def direct_call(self, problem, device):
        if not self.has_direct:
            return None

        def call(a, b):
            self.direct_calls += 1
            self.seen_a.add(id(a))
            return a @ b

        return DirectCall(call, ("A", "B"), label="lib.mm(A, B)")


def test_the_default_is_timed_by_its_direct_call_never_its_plan():
    lib, other = _Counted("lib.mm", priority=1), _Counted("fast.mm", direct=False)
    registry = EngineRegistry([lib, other])
    problem = matmul_problem(32, 32, 32)
    default, challenger = PlanSpec(engine_name_to_id("lib.mm"), ()), PlanSpec(engine_name_to_id("fast.mm"), ())
    run = run_confirmation(problem, fake_device(), registry, [(default, 0), (challenger, 1)], reference=default,
                           config=FAST_STAGE)
    rows = {r.spec: r for r in run.results}
    n, rounds = rows[default].calls_per_sample, rows[default].iterations
    assert rows[default].call_path == "direct" and "lib.mm(A, B)" in rows[default].error
    assert lib.calls.run == 0  # its plan was built, never run: the direct call stood for it
    # the warm-up, the estimate, every sample and the untimed call before it
    assert lib.direct_calls == 1 + 8 + (n + 1) * rounds
    assert other.calls.run == 1 + 8 + (n + 1) * rounds and rows[challenger].call_path == "replay"
    # a default with no direct call: its plan, called straight (no farm dispatch)
    lib2, other2 = _Counted("lib2.mm", direct=False, priority=1), _Counted("fast2.mm", direct=False)
    d2 = PlanSpec(engine_name_to_id("lib2.mm"), ())
    run = run_confirmation(problem, fake_device(), EngineRegistry([lib2, other2]),
                           [(d2, 0), (PlanSpec(engine_name_to_id("fast2.mm"), ()), 1)], reference=d2, config=FAST_STAGE)
    assert {r.engine_name: r.call_path for r in run.results} == {"lib2.mm": "plan", "fast2.mm": "replay"}


def test_cold_cache_sizes_the_rotation_from_the_cache_and_every_set_is_called():
    from farm.devices.open import open_device
    from farm.devices.sim import SimConfig

    sim = open_device("sim", 0, sim=SimConfig())
    big = Problem.create("matmul", {"A": [1024, 1024], "B": [1024, 1024]}, dtype="fp32")  # 8 MiB of inputs a set
    per_set = sum(big.tensor(t).nbytes for t in big.input_ids)
    n = input_set_count(big, sim, cold_cache=True)
    assert (n - 1) * per_set >= COLD_CACHE_FACTOR * cache_bytes(sim) > (n - 2) * per_set
    assert input_set_count(big, sim) == 1 and input_set_count(big, sim, rotating_buffers=7) == 8
    assert input_set_count(big, sim, rotating_buffers=40, cold_cache=True) == 41  # more asked for: more given
    # on the CPU: the stage rotates the sets it sized, each call taking the next (the host's last-level cache)
    lib, other = _Counted("lib.mm", priority=1), _Counted("fast.mm", direct=False)
    problem = matmul_problem(128, 128, 128)
    device = fake_device()
    want = input_set_count(problem, device, cold_cache=True)
    per_set = sum(problem.tensor(t).nbytes for t in problem.input_ids)
    assert want > 8 and ((want - 1) * per_set >= 2 * cache_bytes(device) or want == 1024)
    default = PlanSpec(engine_name_to_id("lib.mm"), ())
    config = AutotuneConfig(check="off", cold_cache=True, confirm={"max_rounds": 8, "budget_ms": 50, "sample_ms": 5})
    run = run_confirmation(problem, device, EngineRegistry([lib, other]),
                           [(default, 0), (PlanSpec(engine_name_to_id("fast.mm"), ()), 1)], reference=default,
                           config=config)
    assert {r.input_sets for r in run.results} == {want}
    r = run.results[0]
    # the estimate's 8 calls and the samples' calls each take the next set (both from the first); the untimed
    # call before a sample takes the set before its first (the last set, before the first sample)
    made = max(8, r.calls_per_sample * r.iterations) + 1
    assert r.calls_per_sample * r.iterations > 1
    assert len(lib.seen_a) == min(want, made) and len(other.seen_a) == min(want, made)


# -- farm verify -------------------------------------------------------------------------------------------------
SIM_SLOW = """\
devices: [{name: Sim V, count: 1}]
noise: 0.01
faults:
  - {kind: slow_replay, engine: sim.gemm, factor: 10}
"""


def _sim(tmp_path, text=SIM_SLOW):
    from farm.devices.open import open_device
    from farm.devices.sim import SimConfig

    path = tmp_path / "sim.yaml"
    path.write_text(text)
    return path, open_device("sim", 0, sim=SimConfig.load(path))


def _fastest_gemm(problem, device):
    """The sim.gemm setting the simulated cost model makes fastest, and its time against sim.vendor's default."""
    from engines.sim import SimPlan
    import itertools

    best = min(({"block": b, "stages": s, "split_k": k} for b, s, k in
                itertools.product((16, 32, 64, 128, 256), (1, 2, 3, 4, 5), (1, 2, 4, 8))),
               key=lambda kn: SimPlan("sim.gemm", problem, kn, device, 0).base_ms)
    vendor = SimPlan("sim.vendor", problem, {"algo": 0}, device, 0).base_ms
    return best, vendor / SimPlan("sim.gemm", problem, best, device, 0).base_ms


def _override_file(path, device, problem, engine, knobs, published, input_sets=1):
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    meta = {"rank": 0, "problem_name": "mm", "problem_key": problem.key, "call": "eager",
            "selection": {"rule": "confirmed", "speedup_over_default": published,
                          "confirmation": {"call": "eager", "interval": [published * 0.98, published * 1.02],
                                           "host_cpus": ["Some Other CPU 9000"], "input_sets": input_sets}}}
    write_overrides(path, [OverrideEntry.for_problem(problem, engine, tuple(sorted(knobs.items())), meta)],
                    device={"signature": device.signature, "properties": device.properties.to_dict()}, mode="replace")


def _one_gemm_workload(tmp_path, knobs):
    """A workload of one 2048^3 fp16 matmul: sim.vendor's default against sim.gemm at ``knobs``, with a stage."""
    import yaml

    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "v", "autotune": {"strategy": "fixed_average", "timed_iterations": 5, "check": "off",
                                  "confirm": {"max_rounds": 16, "budget_ms": 200}},
        "engines": {"include": ["sim.vendor", "sim.gemm"], "defaults": True, "sweep": {"sim.gemm": knobs}},
        "problems": [{"name": "mm", "op": "matmul", "dtype": "fp16", "tensors": {"A": [2048, 2048],
                                                                                 "B": [2048, 2048]}}]}))
    return wl


def test_verify_fix_of_a_run_does_not_call_fixed_what_the_runs_rows_cannot_fix(tmp_path, capsys, replay_env):
    # the run's override file holds an entry of a problem the run has no rows of (appended from elsewhere): the
    # fix lands through the rows, so that decision stays as it is, and verify says so (and --strict fails)
    from farm.cli.main import main
    from farm.store.overrides.parsing import load_overrides
    from tests.fakes import fake_result, write_results

    cfg, device = _sim(tmp_path)
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    knobs, gain = _fastest_gemm(problem, device)
    run = tmp_path / "run"
    other = matmul_problem(8, 8, 8)
    write_results(run / "results", {device.properties: [(other, "small", [fake_result(other, "sim.vendor", (1.0,) * 3)])]})
    path = run / "overrides" / f"{device.signature}.json"
    path.parent.mkdir(parents=True)
    _override_file(path, device, problem, "sim.gemm", knobs, gain)
    assert main(["verify", str(run), "--devices", f"sim:{cfg}", "--fix", "--strict", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    (d,) = out["decisions"]
    assert d["verdict"].startswith("flagged") and not d["fixed"]
    assert any("not fixed" in n for n in d["notes"]) and any("not fixed" in w for w in out["written"])
    assert any(e.engine_name == "sim.gemm" for e in load_overrides(path).entries)  # nothing claimed, nothing changed


def test_a_default_decision_holds_where_replayed_and_farm_ops_own_cost_is_a_note(tmp_path, capsys, replay_env):
    # the default published: what a caller without the farm runs (farm.apply leaves it alone). Its replay through
    # farm.ops costing more than the direct call is farm.ops' own cost, said, not a decision that fails to hold
    from farm.cli.main import main

    cfg, device = _sim(tmp_path)
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    path = tmp_path / f"{device.signature}.json"
    _override_file(path, device, problem, "sim.vendor", {}, 1.5)  # a figure its replay does not deliver
    assert main(["verify", str(path), "--devices", f"sim:{cfg}", "--json", "--strict"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    assert d["verdict"] == "holds" and d["delivered"] < 1.1 and d["replayed"] == d["published_winner"], d
    assert any(n.startswith("the default: delivers") and "farm.ops' own cost" in n for n in d["notes"]), d


def test_verify_flags_a_decision_slower_where_replayed_and_fix_publishes_the_default(tmp_path, capsys, replay_env):
    from farm.cli.main import main
    from farm.store.overrides.parsing import load_overrides

    cfg, device = _sim(tmp_path)
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    knobs, gain = _fastest_gemm(problem, device)
    assert gain > 1.05  # the cost model makes it a real winner where it was measured
    path = tmp_path / f"{device.signature}.json"
    _override_file(path, device, problem, "sim.gemm", knobs, gain)
    assert main(["verify", str(path), "--devices", f"sim:{cfg}", "--json"]) == 0
    capsys.readouterr()
    assert main(["verify", str(path), "--devices", f"sim:{cfg}", "--json", "--strict"]) == 1
    out = json.loads(capsys.readouterr().out)
    (d,) = out["decisions"]
    assert d["verdict"].startswith("flagged") and d["delivered"] < 0.99 and d["replayed"] == d["published_winner"]
    assert d["direct"] == "sim.vendor's own call" and d["calls_per_sample"] >= 1
    assert any("Some Other CPU 9000" in n for n in d["notes"])  # measured on another host's CPU: said
    assert load_overrides(path).entries[0].engine_name == "sim.gemm"  # without --fix nothing is written
    assert main(["verify", str(path), "--devices", f"sim:{cfg}", "--fix", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    assert d["fixed"] and d["verdict"].startswith("fixed")
    (entry,) = load_overrides(path).entries
    sel = entry.metadata["selection"]
    assert entry.engine_name == "sim.vendor" and not entry.knobs and sel["rule"] == "not_delivered"
    assert sel["verified"]["delivered"] < 0.99 and sel["replaced"].startswith("sim.gemm") and "farm verify" in sel["why"]
    # a production process replaying the fixed file runs the default
    from farm.replay.file_replay import FileReplay
    from farm.devices.sim import SimTensor

    replay = FileReplay(str(path), device)
    replay.calls.matmul(SimTensor((2048, 2048), "fp16"), SimTensor((2048, 2048), "fp16"))
    assert replay.binding_of(problem).bound.engine_name == "sim.vendor"


def test_a_spelled_out_default_knob_is_the_same_candidate_to_verify(tmp_path, capsys, replay_env):
    """A file (a hand edit, another writer) that spells out a knob at its default (split_k=1) names the candidate
    replay runs: verify judges it as published, never 'runs another candidate', and --fix keeps it."""
    from engines.sim import SimPlan
    from farm.cli.main import main
    from farm.replay.verified import canonical_knobs
    from farm.store.overrides.parsing import load_overrides

    cfg, device = _sim(tmp_path, "devices: [{name: Sim V, count: 1}]\nnoise: 0.01\n")  # replays as measured
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    vendor = SimPlan("sim.vendor", problem, {"algo": 0}, device, 0).base_ms
    # the fastest setting with its stages at the default (3), every knob spelled out as a hand edit would
    written = min(({"block": b, "stages": 3, "split_k": k} for b in (16, 32, 64, 128, 256) for k in (1, 2, 4, 8)),
                  key=lambda kn: SimPlan("sim.gemm", problem, kn, device, 0).base_ms)
    gain = vendor / SimPlan("sim.gemm", problem, written, device, 0).base_ms
    assert gain > 1.05
    assert canonical_knobs("sim.gemm", written.items()) == \
        canonical_knobs("sim.gemm", [(k, v) for k, v in written.items() if k != "stages"])  # one candidate
    assert canonical_knobs("no.such.engine", [("x", 1)]) == (("x", 1),)  # as written where unknown here
    path = tmp_path / f"{device.signature}.json"
    _override_file(path, device, problem, "sim.gemm", written, gain)
    assert main(["verify", str(path), "--devices", f"sim:{cfg}", "--json", "--fix", "--strict"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    assert d["replayed"] == d["published_winner"] and "stages" not in d["published_winner"], d
    assert d["verdict"].startswith("holds") and not d["fixed"], d
    (entry,) = load_overrides(path).entries
    assert entry.engine_name == "sim.gemm" and entry.metadata["selection"]["verified"]["verdict"].startswith("holds")


def test_verify_holds_a_files_count_of_input_sets_to_the_tuners_memory_cap(tmp_path, capsys, replay_env):
    from farm.cli.main import main
    from farm.tuner.callers import MEMORY_SHARE

    cfg, device = _sim(tmp_path, "devices: [{name: Sim V, count: 1}]\nnoise: 0.01\n")
    problem = Problem.create("matmul", {"A": [16384, 16384], "B": [16384, 16384]}, dtype="fp16")  # 1 GiB a set
    path = tmp_path / f"{device.signature}.json"
    _override_file(path, device, problem, "sim.gemm", {"block": 128}, 1.0, input_sets=1024)
    main(["verify", str(path), "--devices", f"sim:{cfg}", "--json"])
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    room = int(MEMORY_SHARE * device.properties.total_memory) // 2**30
    assert 1 <= d["input_sets"] == room < 1024, d  # the tuner's cap, not the file's 1,024 GiB


def test_verify_holds_for_a_decision_that_delivers_and_says_so_in_a_run_folder(tmp_path, capsys, replay_env):
    """A whole tune on a simulated device: farm tune verifies after its reduce, a decision that loses to the
    direct call where replayed is not published, and every surface names the same winner."""
    import pyarrow.parquet as pq

    from farm.cli.main import main
    from farm.store.overrides.parsing import load_overrides

    cfg, device = _sim(tmp_path)
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    knobs, gain = _fastest_gemm(problem, device)
    wl = _one_gemm_workload(tmp_path, knobs)
    run = tmp_path / "run"
    assert main(["tune", str(wl), "--in-process", "--devices", f"sim:{cfg}", "--out", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (v,) = out["verified"]
    assert v["published_winner"].startswith("sim.gemm") and v["verdict"].startswith("fixed")
    (entry,) = load_overrides(run / "overrides" / f"{device.signature}.json").entries
    assert entry.engine_name == "sim.vendor" and entry.metadata["selection"]["rule"] == "not_delivered"
    winners = pq.read_table(run / "overrides" / f"{device.signature}.winners.parquet").to_pylist()
    assert [(w["engine_name"], w["verdict"][:5]) for w in winners] == [("sim.vendor", "fixed")]
    assert main(["report", str(run), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["signatures"][0]
    (p,) = rep["per_problem"]
    assert p["winner"] == "sim.vendor[default]" and p["decisions"][0]["verdict"].startswith("fixed")
    job = json.loads((run / "job.json").read_text())
    assert job["runs"][-1]["verify"]["fixed"] == 1
    # farm verify again: it checks the default now published; the fix stays, with that newer check beside it
    assert main(["verify", str(run), "--devices", f"sim:{cfg}", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    assert d["published_winner"] == "sim.vendor[default]"
    (entry,) = load_overrides(run / "overrides" / f"{device.signature}.json").entries
    sel = entry.metadata["selection"]
    assert entry.engine_name == "sim.vendor" and sel["rule"] == "not_delivered" and sel["verified"]["verdict"] == d["verdict"]
    # resumed with nothing to measure: nothing new is verified (the decision in force was checked)
    assert main(["tune", str(wl), "--in-process", "--devices", f"sim:{cfg}", "--out", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows_written"] == 0
    # without the fault, the same tune's decision holds where it is replayed
    (tmp_path / "ok").mkdir()
    cfg2, _ = _sim(tmp_path / "ok", "devices: [{name: Sim V, count: 1}]\nnoise: 0.01\n")
    run2 = tmp_path / "run2"
    assert main(["tune", str(wl), "--in-process", "--devices", f"sim:{cfg2}", "--out", str(run2), "--json"]) == 0
    (v,) = json.loads(capsys.readouterr().out)["verified"]
    assert v["verdict"] == "holds" and v["published_winner"].startswith("sim.gemm")
    assert abs(v["delivered"] / v["published"] - 1) < 0.05
    assert main(["verify", str(run2), "--devices", f"sim:{cfg2}", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    assert d["verdict"] == "holds"
    (entry,) = load_overrides(run2 / "overrides" / f"{device.signature}.json").entries
    assert entry.engine_name == "sim.gemm" and entry.metadata["selection"]["verified"]["verdict"] == "holds"


def test_a_decision_short_of_its_figure_where_replayed_is_published_untrusted(tmp_path, capsys, replay_env):
    """A decision farm.ops replays slower than measured, yet still faster than the direct call: farm tune keeps it
    (no loss beyond noise) but its published figure is not what a caller gets, so the entry is untrusted on every
    surface and farm publish --trusted-only leaves it out."""
    import pyarrow.parquet as pq

    from farm.cli.main import main
    from farm.store.overrides.parsing import load_overrides

    _, device = _sim(tmp_path)
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    knobs, gain = _fastest_gemm(problem, device)
    factor = gain ** 0.5  # delivers sqrt(gain): above 1, short of the published gain by more than 5 %
    assert factor > 1.06
    (tmp_path / "short").mkdir()
    cfg, device = _sim(tmp_path / "short", "devices: [{name: Sim V, count: 1}]\nnoise: 0.01\nfaults:\n"
                                            f"  - {{kind: slow_replay, engine: sim.gemm, factor: {factor}}}\n")
    wl = _one_gemm_workload(tmp_path, knobs)
    run = tmp_path / "run"
    assert main(["tune", str(wl), "--in-process", "--devices", f"sim:{cfg}", "--out", str(run), "--json"]) == 0
    (v,) = json.loads(capsys.readouterr().out)["verified"]
    assert v["verdict"].startswith("flagged") and 1.0 < v["delivered"] < v["published"] / 1.05, v
    (entry,) = load_overrides(run / "overrides" / f"{device.signature}.json").entries
    sel = entry.metadata["selection"]
    assert entry.engine_name == "sim.gemm" and sel["rule"] == "confirmed"  # kept: it still beats the direct call
    assert sel["trusted"] is False and sel["untrusted"].startswith("farm verify: flagged")
    winners = pq.read_table(run / "overrides" / f"{device.signature}.winners.parquet").to_pylist()
    assert [w["trusted"] for w in winners] == [False]
    assert main(["report", str(run), "--json"]) == 0
    (doubt,) = json.loads(capsys.readouterr().out)["signatures"][0]["untrusted"]
    assert doubt["problem"] == "mm" and doubt["why"].startswith("farm verify: flagged")
    assert main(["tune", str(wl), "--in-process", "--devices", f"sim:{cfg}", "--out", str(run)]) == 0
    assert "Untrusted (short of its figure where replayed): mm." in " ".join(capsys.readouterr().out.split())
    assert main(["publish", str(run / "overrides"), "--to", str(tmp_path / "pub"), "--trusted-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["files"][0]["left_out_untrusted"] == ["mm"]


def test_verify_refuses_a_file_of_another_device_and_names_unknown_problems(tmp_path, replay_env):
    from farm.cli.verify import _keys
    from farm.store.targets import resolve
    from farm.store.overrides.parsing import load_overrides

    cfg, device = _sim(tmp_path)
    problem = Problem.create("matmul", {"A": [64, 64], "B": [64, 64]}, dtype="fp16")
    path = tmp_path / "x.json"
    _override_file(path, device, problem, "sim.vendor", {}, 1.0)
    with pytest.raises(InputError, match="names no entry"):
        _keys(load_overrides(path), ["nope"], str(path))
    assert _keys(load_overrides(path), ["mm"], str(path)) == [problem.key]
    with pytest.raises(InputError, match="holds no override file for this device"):
        (tmp_path / "run" / "results").mkdir(parents=True)
        (tmp_path / "run" / "overrides").mkdir()
        resolve(str(tmp_path / "run"), device)
    from farm.cli.main import main

    assert main(["verify", str(path), "--devices", "cpu"]) == 2  # a sim device's file on the CPU: refused


# -- farm.ops' per-call path ----------------------------------------------------------------------------------------
def test_bound_callables_run_the_bound_plan_and_check_shapes(replay_env):
    import farm.ops as ops

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((24, 16), dtype=np.float32), rng.standard_normal((16, 8), dtype=np.float32)
    mm = ops.bind_matmul(a, b)
    a2 = rng.standard_normal((24, 16), dtype=np.float32)
    assert np.allclose(mm(a2, b), a2 @ b, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="bind another one"):
        mm(b, a)
    x, w = rng.standard_normal((1, 4, 8, 8), dtype=np.float32), rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    conv = ops.bind_conv2d(x, w, padding=1)
    assert np.allclose(conv(x, w), ops.conv2d(x, w, padding=1))
    q = rng.standard_normal((1, 2, 16, 8), dtype=np.float32)
    attn = ops.bind_sdpa(q, q, q, causal=True)
    assert np.allclose(attn(q, q, q), ops.sdpa(q, q, q, causal=True))
    with pytest.raises(InputError):
        attn(q, q)


def test_a_call_mixing_kinds_of_tensor_gets_a_clear_error(replay_env):
    import farm.ops as ops

    class NotATensor:
        shape = (4, 4)

    with pytest.raises(InputError, match="numpy array or a torch tensor"):
        ops.matmul(np.ones((4, 4), np.float32), NotATensor())


def test_results_record_the_host_cpu_and_what_each_confirm_sample_called(tmp_path):
    import pyarrow.dataset as ds

    from farm.cli.main import main
    from farm.devices.runtimes.cpu import host_cpu

    wl = tmp_path / "w.yaml"
    wl.write_text("name: c\nautotune: {strategy: fixed_average, timed_iterations: 3, check: 'off', confirm: {budget_ms: 100}}\n"
                  "engines: {include: [cpu.matmul.blas, cpu.matmul.einsum]}\n"
                  "problems: [{name: mm, op: matmul, dtype: fp32, tensors: {A: [32, 32], B: [32, 32]}}]\n")
    assert main(["tune", str(wl), "--in-process", "--out", str(tmp_path / "r"), "--json"]) == 0
    t = ds.dataset(tmp_path / "r" / "results", partitioning="hive").to_table().to_pylist()
    assert {r["host_cpu"] for r in t} == {host_cpu()}
    confirm = [r for r in t if r["round"] == "confirm"]
    assert confirm and len({r["calls_per_sample"] for r in confirm}) == 1
    assert {r["call_path"] for r in confirm} == {"direct", "replay"}
    verify = [r for r in t if r["round"] == "verify"]
    assert len(verify) == 2 and {r["call_path"] for r in verify} == {"direct", "replay"}
    assert verify[0]["verdict"] == verify[1]["verdict"] and verify[0]["samples_ms"] and verify[1]["samples_ms"]
    assert all(r["calls_per_sample"] == verify[0]["calls_per_sample"] for r in verify)


def test_verify_fix_republishes_a_published_root(tmp_path, capsys, replay_env):
    """A published root (farm publish): read-only without --fix; --fix republishes the changed entry, the index
    learns the new file, and a production process pointed at the root runs the default."""
    from farm.cli.main import main
    from farm.replay.file_replay import FileReplay
    from farm.devices.sim import SimTensor
    from farm.store.overrides.parsing import load_overrides
    from farm.store.publish.published import find_published

    cfg, device = _sim(tmp_path)
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    knobs, gain = _fastest_gemm(problem, device)
    src = tmp_path / "ovr"
    src.mkdir()
    _override_file(src / f"{device.signature}.json", device, problem, "sim.gemm", knobs, gain)
    root = tmp_path / "root"
    assert main(["publish", str(src), "--to", str(root)]) == 0
    capsys.readouterr()
    index_before = (root / "index.json").read_text()
    path, note = find_published(str(root), device.properties)
    assert not note and load_overrides(path).entries[0].engine_name == "sim.gemm"
    assert main(["verify", str(root), "--devices", f"sim:{cfg}", "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    assert d["verdict"].startswith("flagged") and (root / "index.json").read_text() == index_before  # read-only
    assert main(["verify", str(root), "--devices", f"sim:{cfg}", "--fix", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decisions"][0]["fixed"] and any("republished" in w for w in out["written"])
    (entry,) = load_overrides(path).entries
    assert entry.engine_name == "sim.vendor" and entry.metadata["selection"]["rule"] == "not_delivered"
    index = json.loads((root / "index.json").read_text())
    assert index["files"][device.signature]["sha256"] != json.loads(index_before)["files"][device.signature]["sha256"]
    replay = FileReplay(str(root), device)
    replay.calls.matmul(SimTensor((2048, 2048), "fp16"), SimTensor((2048, 2048), "fp16"))
    assert replay.binding_of(problem).bound.engine_name == "sim.vendor"


def _hipdnn_shared_file(path, problem):
    """A hipDNN-written file (no device field) holding a decision of hipDNN's own engine and one of ours."""
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    theirs = OverrideEntry.for_problem(problem, "HIPBLASLT_ENGINE", (("algo", 17),), {"problem_name": "theirs"})
    other = Problem.create("matmul", {"A": [40, 24], "B": [24, 16]})
    ours = OverrideEntry.for_problem(other, "cpu.matmul.einsum", (), {"problem_name": "ours"})
    write_overrides(path, [theirs, ours], device=None, mode="replace")


def test_verify_fix_leaves_an_entry_of_an_engine_the_farm_does_not_run(tmp_path, capsys, replay_env):
    from farm.cli.main import main
    from farm.store.overrides.parsing import load_overrides

    path = tmp_path / "hipdnn_autotune.json"
    _hipdnn_shared_file(path, Problem.create("matmul", {"A": [32, 24], "B": [24, 16]}))
    before = path.read_text()
    main(["verify", str(path), "--devices", "cpu", "--fix", "--json", "--rounds", "8", "--calls", "4"])
    out = json.loads(capsys.readouterr().out)
    theirs = next(d for d in out["decisions"] if d["problem"] == "theirs")
    assert "does not run" in theirs["verdict"] and not theirs["fixed"], theirs
    entries = load_overrides(path).entries
    assert [e.engine_name for e in entries][0] == "HIPBLASLT_ENGINE"  # hipDNN's own decision stays hipDNN's
    assert json.loads(path.read_text())["engine_overrides"][0] == json.loads(before)["engine_overrides"][0]


def test_verify_strict_fails_on_a_file_production_refuses(tmp_path, capsys, replay_env):
    from farm.cli.main import main

    path = tmp_path / "o.json"
    _hipdnn_shared_file(path, Problem.create("matmul", {"A": [32, 24], "B": [24, 16]}))
    doc = json.loads(path.read_text())
    doc["engine_overrides"].append({"op": "matmul", "engine_name": "cpu.matmul.blas"})  # no tensors: unreadable
    path.write_text(json.dumps(doc))
    assert main(["verify", str(path), "--devices", "cpu", "--json", "--strict", "--rounds", "8", "--calls", "4"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["refused_by_production"] and "engine_overrides[2]" in out["refused_by_production"]
    assert main(["verify", str(path), "--devices", "cpu", "--rounds", "8", "--calls", "4"]) == 0  # says so, exit 0
    assert "production refuses this file" in capsys.readouterr().err


def test_verify_fix_keeps_a_winner_that_still_beats_the_direct_call_and_corrects_its_figure(tmp_path, capsys,
                                                                                           replay_env):
    """A winner delivering less than it published (a loaded host, a slower replay) but still faster than the direct
    call beyond noise is never undone by --fix: the file publishes the delivered figure instead."""
    from farm.cli.main import main
    from farm.store.overrides.parsing import load_overrides

    cfg, device = _sim(tmp_path, "devices: [{name: Sim V, count: 1}]\nnoise: 0.01\nfaults:\n"
                                 "  - {kind: slow_replay, engine: sim.gemm, factor: 1.25}\n")
    problem = Problem.create("matmul", {"A": [2048, 2048], "B": [2048, 2048]}, dtype="fp16")
    knobs, gain = _fastest_gemm(problem, device)
    assert gain / 1.25 > 1.1  # still a real gain where replayed 25 % slower
    path = tmp_path / f"{device.signature}.json"
    _override_file(path, device, problem, "sim.gemm", knobs, gain)
    assert main(["verify", str(path), "--devices", f"sim:{cfg}", "--json", "--fix", "--strict"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["decisions"]
    assert d["corrected"] and not d["fixed"] and d["verdict"].startswith("corrected"), d
    assert d["delivered_interval"][0] > 1.0
    (entry,) = load_overrides(path).entries
    sel = entry.metadata["selection"]
    assert entry.engine_name == "sim.gemm"  # kept
    assert sel["speedup_over_default"] == pytest.approx(d["delivered"]) and sel["figure_corrected"]["was"] == gain


def test_farm_verify_bounds_each_replay_a_hang_is_fixed_and_the_rest_said_not_replayed(tmp_path, repo_root):
    """farm verify --candidate-timeout: a decision whose replay hangs (simulated ``hang_replay``) is flagged, fixed
    with --fix, its timed-out row recorded, and the command ends; the decisions after it are named as not replayed."""
    import os
    import subprocess
    import sys

    (tmp_path / "sim.yaml").write_text("devices: [{name: Sim H200, count: 1}]\nnoise: 0.0\n"
                                       "faults: [{kind: hang_replay, engine: sim.gemm}]\n")
    (tmp_path / "wl.yaml").write_text(
        "name: hangs\nautotune: {strategy: fixed_average, timed_iterations: 3, check: 'off'}\n"
        "engines: {include: [sim.vendor, sim.gemm], sweep: {sim.gemm: {block: [16, 32], stages: [2]}}}\n"
        "problems:\n  - {name: mm, op: matmul, dtype: fp16, tensors: {A: [2048, 2048], B: [2048, 2048]}}\n"
        "  - {name: mm2, op: matmul, dtype: fp16, tensors: {A: [1024, 4096], B: [4096, 1024]}}\n")
    env = dict(os.environ, PYTHONPATH=repo_root)
    sim = f"sim:{tmp_path / 'sim.yaml'}"

    def farm(*args):
        return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True, env=env,
                              timeout=120)

    assert farm("tune", str(tmp_path / "wl.yaml"), "--devices", sim, "--in-process", "--out", str(tmp_path / "run"),
                "--no-verify").returncode == 0
    proc = farm("verify", str(tmp_path / "run"), "--devices", sim, "--candidate-timeout", "1.5", "--fix", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads(proc.stdout)["decisions"]  # in the file's order, as replayed
    [hung] = [i for i, r in enumerate(records) if r["verdict"].startswith("fixed")]
    assert records[hung]["verdict"].startswith("fixed: its replay did not end within the candidate timeout (1.5 s)")
    name = records[hung]["problem"]
    assert all(r["verdict"] == f"not verified: the replay of {name} (eager) before it hung" for r in records[hung + 1:])
    assert all(r["verdict"] == "holds" for r in records[:hung])  # the default's own replay, say
    rows = ResultsDataset(tmp_path / "run" / "results").table(["problem_name", "round", "disposition"]).to_pylist()
    assert [r["problem_name"] for r in rows if r["round"] == "verify" and r["disposition"] == "timed_out"] == [name]
