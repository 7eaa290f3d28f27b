"""The confirmation stage on every surface: the scheduler's confirm tasks, the reducer's decision from the
stage's rows (override file, winners table, report, diff) and replay's graph decision."""

import dataclasses
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from farm.cli import main
from farm.devices.device import cpu_device
from farm.fleet.tasks import CONFIRM, Candidate, PriorRow
from farm.fleet.scheduler import Scheduler
from farm.model.engine import default_engine_registry
from farm.model.plans import PlanSpec
from farm.model.records import AutotuneConfig, CallMode, ConfirmSettings, Disposition
from farm.model.workload import EngineSelection, WorkloadProblem
from farm.store.deciding.rule import decide_results
from farm.store.overrides.parsing import call_choice, load_overrides
from farm.store.reduce import reduce_results
from farm.tuner.judging.winner import ConfirmedRule
from tests.fakes import fake_props, fake_result, matmul_problem, write_results

P1, P2 = matmul_problem(8, 8, 8), matmul_problem(16, 16, 16)
GPU = fake_props()


# -- the scheduler ----------------------------------------------------------------------------------
def _spec(i):
    return PlanSpec(i, () if i == 0 else (("t", i),))


def _result(spec, median, mad=0.0):
    from farm.model.records import AutotuneResult, Disposition, TuneMode
    from farm.model.measurement import Strategy

    return AutotuneResult(problem_key=P1.key, engine_id=spec.engine_id, engine_name=f"e{spec.engine_id}",
                          knobs=spec.knobs, disposition=Disposition.SUCCEEDED, mode=TuneMode.STANDARD,
                          strategy=Strategy.FIXED_AVERAGE, median_ms=median, mad_ms=mad, min_ms=median)


def _problem(calls=(CallMode.EAGER, CallMode.GRAPH)):
    wp = WorkloadProblem(0, "mm", P1, EngineSelection(), calls)
    return wp, [Candidate(_spec(i), f"e{i}", i) for i in range(4)]


def _run(sched, task, medians):
    for spec in task.specs:
        sched.on_result(task, _result(spec, medians[spec.engine_id]), f"s{task.id}")
    sched.on_task_end(task)


def test_after_the_main_round_each_calling_mode_gets_one_confirm_task_probed_when_its_worker_dies():
    sched = Scheduler(shard_size=2, confirm=ConfirmSettings(runners_up=0))
    wp, cands = _problem()
    sched.add_problem("sig", 0, wp, cands)
    medians = {0: 2.0, 1: 1.0, 2: 1.005, 3: 3.0}
    for _ in range(2):  # the two shards
        task = sched.next_task("sig", "dev")
        assert task.round == "main"
        _run(sched, task, medians)
    eager, graph = sched.next_task("sig", "d1"), sched.next_task("sig", "d2")
    assert (eager.round, eager.call, graph.call) == (CONFIRM, "eager", "graph")
    # graph: each shard's leader, its near rival and the default, not the slow one; eager: every engine's
    # fastest too (each candidate here is an engine of its own), since engines differ in host cost a call
    assert set(graph.specs) == {_spec(0), _spec(1), _spec(2)} and eager.reference == graph.reference == _spec(0)
    assert set(eager.specs) == {_spec(0), _spec(1), _spec(2), _spec(3)}
    assert sched.remeasured == 0 and not sched.done
    # a stage whose worker dies: each participant runs alone (a probe); the one that kills its worker alone gets
    # a failed row of the stage, and the stage runs again without it
    config = AutotuneConfig()
    sched.on_task_lost(eager, [], "crash", config, "worker died")
    probes = [sched.next_task("sig", f"d{i}") for i in range(4)]
    assert all(p.probe and p.careful and p.round == CONFIRM and p.call == "eager" for p in probes)
    assert {p.specs for p in probes} == {(s,) for s in eager.specs} and not sched.done
    for p in probes:
        if p.specs == (_spec(1),):
            rows = sched.on_task_lost(p, [], "crash", config, "worker died")
            assert [(r.spec, r.disposition) for r in rows] == [(_spec(1), Disposition.CRASHED)]
            assert "confirmation (eager)" in rows[0].error and "alone" in rows[0].error
        else:
            sched.on_task_end(p)  # a probe that passes reports nothing
    again = sched.next_task("sig", "d1")
    assert (again.call, again.attempt, again.probe) == ("eager", 2, False)
    assert set(again.specs) == set(eager.specs) - {_spec(1)}
    # lost again, probed again, nobody found: the stage runs a third time; lost then, the main round decides
    sched.on_task_lost(again, [], "timeout", config)
    for p in [sched.next_task("sig", f"d{i}") for i in range(3)]:
        sched.on_task_end(p)
    third = sched.next_task("sig", "d1")
    assert (third.attempt, set(third.specs)) == (3, set(again.specs))
    assert sched.on_task_lost(third, [], "crash", config) == []
    assert sched.next_task("sig", "d1") is None
    _run(sched, graph, medians)
    assert sched.done


def _prior(rows):
    return [PriorRow(_spec(i), rnd, sess, True, med, 0.0, call, at, size) for i, rnd, sess, med, call, at, size in rows]


def test_a_resume_runs_only_the_stages_that_are_missing_or_were_cut_short():
    main = [(i, "main", "m", m, "", 100.0, None) for i, m in enumerate((2.0, 1.0, 1.005, 3.0))]
    whole = [(0, "confirm", "c1", 2.0, "eager", 200.0, 3), (1, "confirm", "c1", 1.0, "eager", 200.0, 3),
             (2, "confirm", "c1", 1.0, "eager", 200.0, 3)]
    wp, cands = _problem()
    sched = Scheduler(confirm=ConfirmSettings())
    sched.add_problem("sig", 0, wp, cands, _prior(main + whole))
    task = sched.next_task("sig", "d")
    assert (task.round, task.call) == (CONFIRM, "graph") and sched.next_task("sig", "d") is None
    sched = Scheduler(confirm=ConfirmSettings())
    sched.add_problem("sig", 0, wp, cands, _prior(main + whole[:2]))  # two rows of a stage of three: cut short
    assert {sched.next_task("sig", "d").call, sched.next_task("sig", "d").call} == {"eager", "graph"}
    # the stage off: nothing after the main round
    sched = Scheduler(confirm=ConfirmSettings(enabled=False))
    sched.add_problem("sig", 0, wp, cands, _prior(main))
    assert sched.next_task("sig", "d") is None and sched.done


# -- the reducer -----------------------------------------------------------------------------------------
def _stage(problem, rows, seed=0, drift=0.3):
    """Confirm rows of one stage: (engine, knobs, true ms, candidate index), measured in 24 paired rounds."""
    rng = np.random.default_rng(seed)
    d = rng.lognormal(0.0, drift, 24)
    return [fake_result(problem, e, tuple(ms * d * rng.lognormal(0.0, 0.01, 24)), knobs=k, candidate=c,
                        started_at="2026-11-30T02:00:00.000Z") for e, k, ms, c in rows]


def _synthetic(root, graph=True):
    write_results(root, {GPU: [(P1, "p1", [fake_result(P1, "lib.default", (20.0, 1.2, 30.0), candidate=0),
                                           fake_result(P1, "tuned.fast", (0.84,) * 3, knobs=(("tile", 64),), candidate=1),
                                           fake_result(P1, "tuned.graph", (0.9,) * 3, candidate=2)])]})
    write_results(root, {GPU: [(P1, "p1", _stage(P1, [("lib.default", (), 1.1, 0), ("tuned.fast", (("tile", 64),), 0.84, 1),
                                                     ("tuned.graph", (), 0.9, 2)]))]}, round="confirm", call="eager")
    if graph:
        write_results(root, {GPU: [(P1, "p1", _stage(P1, [("lib.default", (), 1.0, 0), ("tuned.fast", (("tile", 64),), 0.9, 1),
                                                         ("tuned.graph", (), 0.7, 2)], seed=1))]},
                      round="confirm", call="graph")


def test_the_reducer_publishes_the_stage_decision_with_its_interval_and_the_graph_decision_beside_it(tmp_path):
    _synthetic(tmp_path / "r")
    w = decide_results(tmp_path / "r").winners[(GPU.signature, P1.key)]
    # the main round's 20 ms default (contention) would have claimed ~24x; the stage says ~1.3x
    assert (w.label, w.rule, w.call) == ("tuned.fast[tile=64]", ConfirmedRule.CONFIRMED, "eager")
    lo, hi = w.speedup_interval
    assert lo <= 1.1 / 0.84 <= hi and 1.2 < w.speedup_over_default < 1.45 and w.trusted
    assert w.why.startswith("confirmed: 1.3") and "99 % interval" in w.why
    (g,) = w.others
    assert (g.call, g.label) == ("graph", "tuned.graph[default]")
    report = reduce_results(tmp_path / "r", tmp_path / "o")
    entry = load_overrides(report.signatures[0].write.path).match(P1)
    meta = entry.metadata
    # hipDNN reads engine_name (the eager decision); the graph decision sits inside autotune_metadata
    assert entry.engine_name == "tuned.fast" and meta["call"] == "eager"
    assert meta["selection"]["confirmation"]["interval"] == [lo, hi]
    assert call_choice(entry, "graph") == ("tuned.graph", ())
    assert call_choice(entry, "eager") == ("tuned.fast", (("tile", 64),))
    table = pq.read_table(report.signatures[0].winners_path).to_pylist()
    assert [(r["call"], r["primary"], r["engine_name"]) for r in table] == [("eager", True, "tuned.fast"),
                                                                          ("graph", False, "tuned.graph")]
    assert table[0]["speedup_low"] == lo and table[0]["confirm_rounds"] == 24
    # farm report shows the same decision and interval
    assert main(["report", str(tmp_path / "r"), "--json"]) == 0


def test_a_stage_cut_short_is_not_read_and_a_tie_is_a_confirmed_tie_in_diff(tmp_path, capsys):
    _synthetic(tmp_path / "r", graph=False)
    # a later stage of which one row of three reached disk: the earlier whole one decides
    write_results(tmp_path / "r", {GPU: [(P1, "p1", _stage(P1, [("tuned.graph", (), 0.1, 2)], seed=7))]},
                  round="confirm", call="eager", session_size=3)
    assert decide_results(tmp_path / "r").winners[(GPU.signature, P1.key)].label == "tuned.fast[tile=64]"
    # two runs whose stages could not tell their winners apart: a confirmed tie, not a change
    rng = np.random.default_rng(3)
    drift = 0.84 * rng.lognormal(0.0, 0.2, 24)
    for name, up, down in (("a", 1.004, 0.997), ("b", 1.003, 0.996)):  # y a hair slower in a, faster in b
        write_results(tmp_path / name, {GPU: [(P1, "p1", [fake_result(P1, "lib.default", (1.1,) * 3, candidate=0),
                                                          fake_result(P1, "tuned.x", (0.84,) * 3, candidate=1),
                                                          fake_result(P1, "tuned.y", (0.84,) * 3, candidate=2)])]})
        y = drift * np.where(np.arange(24) % 2 == 0, up, down)
        stage = [fake_result(P1, "lib.default", tuple(drift * 1.3), candidate=0),
                 fake_result(P1, "tuned.x", tuple(drift), candidate=1), fake_result(P1, "tuned.y", tuple(y), candidate=2)]
        write_results(tmp_path / name, {GPU: [(P1, "p1", stage)]}, round="confirm")
    wa = decide_results(tmp_path / "a").winners[(GPU.signature, P1.key)]
    wb = decide_results(tmp_path / "b").winners[(GPU.signature, P1.key)]
    assert wa.label != wb.label and wb.label in wa.confirmed.ties
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["status"] == "confirmed tie"


def test_a_winner_an_undecided_stage_could_not_separate_yet_is_a_change_in_diff_not_a_tie(tmp_path, capsys):
    # before: the stage's budget ended undecided (the default kept, the challenger "tied"); after: the challenger
    # confirmed 4x faster. That is a changed winner on every surface of diff, not a confirmed tie.
    rng = np.random.default_rng(5)
    for name, rounds, speed, noise in (("before", 4, 0.9, 0.6), ("after", 24, 0.25, 0.02)):
        write_results(tmp_path / name, {GPU: [(P1, "p1", [fake_result(P1, "lib.default", (1.0,) * 3, candidate=0),
                                                          fake_result(P1, "tuned.x", (0.9,) * 3, candidate=1)])]})
        base = rng.lognormal(0.0, 0.05, rounds)
        stage = [fake_result(P1, "lib.default", tuple(base), candidate=0),
                 fake_result(P1, "tuned.x", tuple(base * speed * rng.lognormal(0.0, noise, rounds)), candidate=1)]
        write_results(tmp_path / name, {GPU: [(P1, "p1", stage)]}, round="confirm")
    before = decide_results(tmp_path / "before").winners[(GPU.signature, P1.key)]
    after = decide_results(tmp_path / "after").winners[(GPU.signature, P1.key)]
    assert not before.confirmed.settled and after.label in before.confirmed.ties  # what misled diff
    assert before.label == "lib.default[default]" and after.label == "tuned.x[default]" and after.confirmed.settled
    assert main(["diff", str(tmp_path / "before"), str(tmp_path / "after"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["status"] == "winner changed"
    for name in ("before", "after"):
        reduce_results(tmp_path / name, tmp_path / f"{name}-o")
    files = [next((tmp_path / f"{name}-o").glob("*.json")) for name in ("before", "after")]
    assert main(["diff", str(files[0]), str(files[1]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["status"] == "winner changed"


# -- replay: the graph decision while a graph is captured ---------------------------------------------------
def test_replay_runs_the_graph_decision_only_while_a_graph_is_being_captured(tmp_path, monkeypatch):
    import farm.ops as ops

    props = cpu_device().properties
    a = np.ones((8, 8), np.float32)
    p = matmul_problem(8, 8, 8)
    write_results(tmp_path / "r", {props: [(p, "p", [fake_result(p, "cpu.matmul.blas", (1.0,) * 3, candidate=0),
                                                     fake_result(p, "cpu.matmul.einsum", (1.1,) * 3, candidate=1)])]})
    write_results(tmp_path / "r", {props: [(p, "p", _stage(p, [("cpu.matmul.blas", (), 1.0, 0),
                                                               ("cpu.matmul.einsum", (), 1.2, 1)]))]},
                  round="confirm", call="eager")
    write_results(tmp_path / "r", {props: [(p, "p", _stage(p, [("cpu.matmul.blas", (), 1.0, 0),
                                                               ("cpu.matmul.einsum", (), 0.8, 1)], seed=2))]},
                  round="confirm", call="graph")
    report = reduce_results(tmp_path / "r", tmp_path / "o")
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", report.signatures[0].write.path)
    capturing = [False]
    real = ops._devices

    def devices(kind, index):
        tune, run = real(kind, index)
        return tune, dataclasses.replace(run, extras={**run.extras, "is_capturing": lambda d: capturing[0]})

    monkeypatch.setattr(ops, "_devices", devices)
    ops.reset()
    try:
        ops.matmul(a, a)
        sources = {c["engine"]: c["source"] for c in ops.choices()}
        assert sources == {"cpu.matmul.blas": "SelectionHeuristic::Config",
                           "cpu.matmul.einsum": "SelectionHeuristic::Config (graph)"}
        (cached,) = {id(b): b for b in ops.CALLS.bindings.values()}.values()
        ran = []
        for which, c in (("eager", cached), ("graph", cached.graph)):
            c.bound.plan.run = (lambda f, w: lambda *x: (ran.append(w), f(*x))[1])(c.bound.plan.run, which)
        ops.matmul(a, a, out=np.empty((8, 8), np.float32))
        capturing[0] = True
        ops.matmul(a, a, out=np.empty((8, 8), np.float32))
        assert ran == ["eager", "graph"]
    finally:
        ops.reset()


def test_a_malformed_graph_record_names_its_path():
    from farm.store.overrides.entries import OverrideEntry

    e = OverrideEntry.for_problem(P1, "x", (), {"calls": {"graph": {"engine_name": 3}}})
    with pytest.raises(Exception, match="autotune_metadata.calls.graph.engine_name"):
        call_choice(e, "graph")
    assert call_choice(OverrideEntry.for_problem(P1, "x", (), {}), "graph") is None
