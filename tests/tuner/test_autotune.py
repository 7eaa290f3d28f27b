"""The in-process autotuner: dispositions, ranking, modes, strategies, budgets, API guards."""

import dataclasses
import logging

import numpy as np
import pytest

from fakes import EXTRA, TILE, FakeEngine, ScriptedTimer, fake_device, matmul_problem, registry_of, tensors_for
from farm.tuner.autotuner import Autotuner
from farm.model.records import AutotuneConfig, BuildPolicy, Disposition, PrimingFailurePolicy, ResultCheck, TuneMode
from farm.model.engine import engine_id
from farm.errors import AutotuneError, InputError, UsageError
from farm.model.knobs import BENCHMARKING_KNOB
from farm.model.measurement import Strategy

FAST = AutotuneConfig(strategy="fixed_average", timed_iterations=3, warmup_iterations=1)


def tuner_with(*engines, timer=None, problem=None):
    return Autotuner(problem or matmul_problem(), fake_device(timer), registry=registry_of(*engines))


def by_name(results):
    return {r.label: r for r in results}


def test_every_disposition_exactly_one_result_per_candidate():
    engines = dict(
        good=FakeEngine("good", estimate=10),
        barred=FakeEngine("barred"),
        filtered=FakeEngine("filtered"),
        big=FakeEngine("big", estimate=10, actual=10_000),
        broken=FakeEngine("broken", fail_at="compile"),
        unbound=FakeEngine("unbound", fail_at="finalize"),
        cold=FakeEngine("cold", fail_at="warmup"),
        flaky=FakeEngine("flaky", fail_at="run"),
        wrong=FakeEngine("wrong", wrong=True),
    )
    t = tuner_with(*engines.values())
    t.add_all_engines()
    t.deselect_engines(["barred"])
    keep = [engine_id(e) for n, e in engines.items() if n != "filtered"]
    cfg = AutotuneConfig(strategy="fixed_average", timed_iterations=5, workspace_limit=100,
                         engine_id_filter=keep + [123456789], check="reference")
    results = t.autotune(config=cfg)
    assert len(results) == len(engines)
    got = {r.engine_name: r.disposition for r in results}
    assert got == {
        "good": Disposition.SUCCEEDED,
        "barred": Disposition.BARRED_BY_DESELECT,
        "filtered": Disposition.EXCLUDED_BY_FILTER,
        "big": Disposition.EXCEEDS_WORKSPACE_LIMIT,
        "broken": Disposition.FAILED_COMPILE,
        "unbound": Disposition.FAILED_FINALIZE,
        "cold": Disposition.FAILED_WARMUP,
        "flaky": Disposition.FAILED_RUN,
        "wrong": Disposition.WRONG_RESULT,
    }
    # successes first with ranks 0..n-1, failures after with rank -1
    assert results[0].engine_name == "good" and results[0].rank == 0 and results[0].succeeded
    assert all(r.rank == -1 and not r.succeeded for r in results[1:])
    by = {r.engine_name: r for r in results}
    assert "unsupported tile" in by["broken"].error and "broken" in by["broken"].error
    assert "10000 B > limit 100 B" in by["big"].error and by["big"].workspace_size == 10_000
    assert "illegal memory access" in by["flaky"].error
    assert by["wrong"].max_rel_error > 0.01 and "float64 reference" in by["wrong"].error
    assert by["good"].max_rel_error < 1e-5
    # a noisy host timer may have it re-measured once (a second round of 5)
    assert by["good"].converged and (by["good"].iterations == 5 or
                                     (by["good"].iterations == 10 and "re-measured" in by["good"].error))
    assert engines["barred"].calls.compile == [] and engines["filtered"].calls.compile == []


def test_workspace_overrun_after_compile_is_logged_when_the_estimate_fit(caplog):
    big = FakeEngine("big", estimate=10, actual=10_000)
    t = tuner_with(big, FakeEngine("ok"))
    t.add_all_engines()
    with caplog.at_level(logging.WARNING, logger="farm.tuner.autotuner"):
        t.autotune(config=AutotuneConfig(strategy="single_shot", workspace_limit=100))
    assert any("after compile (estimate 10 B)" in r.message for r in caplog.records)


def test_default_ranking_is_the_farm_winner_rule():
    # a is the default (first discovered, default knobs); b is 0.2 % faster (within the 0.5 % floor);
    # c has the lowest minimum but the slowest median: the median decides, not the minimum
    t = _per_engine_tuner({"a": [1.0, 1.0, 1.0], "b": [0.998, 0.998, 0.998], "c": [3.0, 0.5, 3.0]})
    results = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=3))
    assert [r.engine_name for r in results] == ["a", "b", "c"]
    assert [r.rank for r in results] == [0, 1, 2]
    assert results[2].min_ms == 0.5 and results[2].median_ms == 3.0


def test_custom_ranking_function_may_reorder():
    def tuner():
        t = tuner_with(FakeEngine("a"), FakeEngine("b"), FakeEngine("c"), timer=ScriptedTimer([3.0, 2.0, 1.0]))
        t.add_all_engines()
        return t

    single = AutotuneConfig(strategy="single_shot")
    assert [r.engine_name for r in tuner().autotune(config=single)] == ["c", "b", "a"]
    # reordering in place
    results = tuner().autotune(config=AutotuneConfig(strategy="single_shot", ranking_fn=lambda rs: rs.reverse()))
    assert [r.engine_name for r in results] == ["a", "b", "c"]
    assert [r.rank for r in results] == [0, 1, 2]  # ranks are re-assigned after the function
    # returning a new order works too
    results = tuner().autotune(config=AutotuneConfig(
        strategy="single_shot", ranking_fn=lambda rs: sorted(rs, key=lambda r: r.engine_name == "b", reverse=True)))
    assert results[0].engine_name == "b"


@pytest.mark.parametrize("bad_fn", [
    lambda rs: 1 / 0,                 # throws
    lambda rs: rs[:1],                # drops a result
    lambda rs: rs + rs[:1],           # duplicates one
])
def test_ranking_function_that_misbehaves_falls_back_to_min_time(bad_fn, caplog):
    timer = ScriptedTimer([5.0, 5.0, 1.0, 1.0])  # candidates run in discovery (name) order: a_slow, b_fast
    t = tuner_with(FakeEngine("a_slow"), FakeEngine("b_fast"), timer=timer)
    t.add_all_engines()
    with caplog.at_level(logging.WARNING, logger="farm.tuner.autotuner"):
        results = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=2, ranking_fn=bad_fn))
    assert [r.engine_name for r in results] == ["b_fast", "a_slow"]
    assert any("ranking function failed" in r.message for r in caplog.records)


def test_engine_id_filter_is_a_subset_and_ignores_unknown_ids():
    a, b = FakeEngine("a"), FakeEngine("b")
    t = tuner_with(a, b)
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(strategy="single_shot", engine_id_filter=[engine_id(b), 42]))
    assert by_name(results)["a[default]"].disposition is Disposition.EXCLUDED_BY_FILTER
    assert results[0].engine_name == "b"


def test_exhaustive_mode_primes_with_the_benchmarking_knob_then_compiles_real_plans():
    ex = FakeEngine("ex", knobs=(TILE,), exhaustive=True)
    plain = FakeEngine("plain")
    t = tuner_with(ex, plain)
    t.add_all_engines()
    t.add_engine("ex", {"tile": 32})
    results = t.autotune(config=AutotuneConfig(mode="exhaustive", strategy="single_shot"))
    by = {r.label: r for r in results}
    assert by["ex[default]"].ran_exhaustive and by["ex[tile=32]"].ran_exhaustive
    assert not by["plain[default]"].ran_exhaustive and not by["plain[default]"].supports_exhaustive
    assert all(r.mode is TuneMode.EXHAUSTIVE for r in results)
    bench = [k[BENCHMARKING_KNOB] for k in ex.calls.compile]
    assert bench == [1, 1, 0, 0]  # two priming plans first, then the two real plans
    assert ex.calls.compile[0]["tile"] == 64 and ex.calls.compile[1]["tile"] == 32  # priming keeps the spec's knobs
    assert ex.primed_runs == 2
    assert BENCHMARKING_KNOB not in plain.calls.compile[0]


def test_priming_failure_abort_and_benchmark_unprimed():
    t = tuner_with(FakeEngine("ex", exhaustive=True, fail_at="prime"), FakeEngine("plain"))
    t.add_all_engines()
    with pytest.raises(AutotuneError, match="priming failed for ex"):
        t.autotune(config=AutotuneConfig(mode="exhaustive", strategy="single_shot"))
    t = tuner_with(FakeEngine("ex", exhaustive=True, fail_at="prime_compile"), FakeEngine("plain"))
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(mode="exhaustive", strategy="single_shot",
                                               priming_failure=PrimingFailurePolicy.BENCHMARK_UNPRIMED))
    ex = by_name(results)["ex[default]"]
    assert ex.succeeded and not ex.ran_exhaustive
    assert ex.error == ""  # the RFC: a success with its error empty ...
    assert "priming failed, benchmarked unprimed" in ex.exhaustive_not_run_reason  # ... and the reason here
    assert "cannot build priming plan" in ex.exhaustive_not_run_reason
    plain = by_name(results)["plain[default]"]
    assert plain.exhaustive_not_run_reason == "the engine does not support exhaustive priming"


def test_priming_skipped_for_workspace_is_not_a_failure():
    big = FakeEngine("big", exhaustive=True, estimate=10, actual=10_000)
    t = tuner_with(big, FakeEngine("ok"))
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(mode="exhaustive", strategy="single_shot", workspace_limit=100))
    assert by_name(results)["big[default]"].disposition is Disposition.EXCEEDS_WORKSPACE_LIMIT
    assert big.primed_runs == 0
    assert by_name(results)["big[default]"].exhaustive_not_run_reason == \
        "priming skipped: workspace 10000 B over the limit 100 B"


def test_run_until_stable_with_scripted_timings():
    # stable after the noisy start: 3 samples within 5 % CoV end the loop
    t = tuner_with(FakeEngine("a"), timer=ScriptedTimer([9.0, 1.0, 1.0, 1.0, 1.0]))
    t.add_all_engines()
    (r,) = t.autotune(config=AutotuneConfig(window=3, stability_threshold=0.05))
    assert r.iterations == 4 and r.converged and r.strategy is Strategy.RUN_UNTIL_STABLE
    assert r.samples == (9.0, 1.0, 1.0, 1.0) and r.min_ms == 1.0 and r.median_ms == 1.0
    # never stable: capped at max_iterations, converged false
    t = tuner_with(FakeEngine("a"), timer=ScriptedTimer([1.0, 3.0]))
    t.add_all_engines()
    (r,) = t.autotune(config=AutotuneConfig(window=3, max_iterations=8))
    assert r.iterations == 8 and not r.converged


def test_budgets_per_candidate():
    t = tuner_with(FakeEngine("a"), timer=ScriptedTimer([1.0, 3.0]))
    t.add_all_engines()
    (r,) = t.autotune(config=AutotuneConfig(max_iterations=100, max_tuning_samples=5))
    assert r.iterations == 5 and not r.converged

    import time

    slow = FakeEngine("slow")
    orig = slow.compile

    def compile(problem, knobs, device):
        plan = orig(problem, knobs, device)
        inner = plan.run

        def run(*a):
            time.sleep(0.004)
            inner(*a)

        plan.run = run
        return plan

    slow.compile = compile
    t = tuner_with(slow, timer=ScriptedTimer([1.0, 3.0]))
    t.add_all_engines()
    (r,) = t.autotune(config=AutotuneConfig(max_iterations=100, max_tuning_duration_ms=20, max_tuning_samples=50))
    assert 2 <= r.iterations <= 8 and not r.converged  # ~4 ms each: the duration budget wins


@pytest.mark.parametrize("kwargs, field", [
    (dict(window=1), "window"),
    (dict(window=5, max_iterations=4), "max_iterations"),
    (dict(stability_threshold=0.0), "stability_threshold"),
    (dict(stability_threshold=1.0), "stability_threshold"),
    (dict(timed_iterations=0), "timed_iterations"),
    (dict(warmup_iterations=-1), "warmup_iterations"),
    (dict(max_tuning_samples=0), "max_tuning_samples"),
    (dict(max_tuning_duration_ms=-5), "max_tuning_duration_ms"),
    (dict(strategy="fastest"), "strategy"),
    (dict(mode="turbo"), "mode"),
    (dict(workspace_limit=-1), "workspace_limit"),
])
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(InputError) as info:
        AutotuneConfig(**kwargs)
    assert info.value.field == field


def test_stable_only_checks_apply_to_run_until_stable():
    assert AutotuneConfig(strategy="fixed_average", window=1).window == 1  # window is irrelevant there
    with pytest.raises(InputError) as info:
        AutotuneConfig(strategy="run_until_stable", window=1)
    assert info.value.field == "window"


def test_winner_is_what_execute_runs_and_others_are_released():
    a, b = FakeEngine("a"), FakeEngine("b")
    t = tuner_with(a, b, timer=ScriptedTimer([2.0, 2.0, 1.0, 1.0]))
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=2))
    assert results[0].engine_name == "b"
    assert a.calls.closed == 1 and b.calls.closed == 0
    before_a, before_b = a.calls.run, b.calls.run
    tensors = tensors_for(t.problem, seed=3)
    t.execute(tensors)
    assert (a.calls.run, b.calls.run) == (before_a, before_b + 1)
    np.testing.assert_allclose(tensors["C"], tensors["A"] @ tensors["B"], rtol=1e-5)
    t.close()
    assert b.calls.closed == 1


def test_manual_path():
    a, b = FakeEngine("a", estimate=8), FakeEngine("b", estimate=16)
    t = tuner_with(a, b, FakeEngine("broken", fail_at="compile"))
    t.add_all_engines()
    assert t.check_support() == 3
    assert t.build_plans() == 2  # the broken one keeps its slot, with its reason
    assert t.plan_count == 3
    assert [t.plan_name_at_index(i) for i in range(3)] == ["a[default]", "b[default]", "broken[default]"]
    assert t.workspace_size_at_index(1) == 16 and t.get_autotune_workspace_size() == 16
    assert "failed to build" in t.excluded_reason(2)
    assert t.workspace_size_at_index(2) == -1  # never compiled: -1, as the autotuning RFC has it
    assert t.estimated_workspace_at_index(1) == 16
    tensors = tensors_for(t.problem)
    t.execute_plan_at_index(1, tensors)
    assert b.calls.run == 1
    with pytest.raises(InputError, match="invalid value: plan 2"):
        t.execute_plan_at_index(2, tensors)
    with pytest.raises(UsageError, match="no plan selected"):
        t.workspace_size_at_index(-1)
    t.build_plan_at_index(0)
    assert t.workspace_size_at_index(-1) == 8  # -1: the plan execute() runs
    t.execute(tensors)
    assert a.calls.run == 1
    for bad in (-2, 3, "0", True):
        with pytest.raises(UsageError, match="out of range"):
            t.execute_plan_at_index(bad, tensors)
    with pytest.raises(UsageError, match="after build_plans"):
        t.add_engine("a")
    with pytest.raises(UsageError, match="EXHAUSTIVE"):
        t.autotune(config=AutotuneConfig(mode="exhaustive"))
    results = t.autotune(config=AutotuneConfig(strategy="single_shot"))  # compiled-plan path, STANDARD
    assert [(r.candidate, r.disposition) for r in sorted(results, key=lambda r: r.candidate)] == \
        [(0, Disposition.SUCCEEDED), (1, Disposition.SUCCEEDED), (2, Disposition.FAILED_COMPILE)]


def test_compiled_plan_path_deselect_keeps_indices_and_bars_on_both_paths():
    """RFC §6.3: deselecting after build excludes plans in place (indices and plan_count unchanged); running
    one is an invalid-value error; autotune gives excluded plans a barred result, as the plan-spec path does."""
    a, b, c = FakeEngine("a", estimate=8), FakeEngine("b", estimate=16), FakeEngine("c", estimate=4)
    t = tuner_with(a, b, c)
    t.add_all_engines()
    t.build_plans()
    t.deselect_engines(["a"]).deselect_workspace_greater_than(10)
    assert t.plan_count == 3 and [t.plan_name_at_index(i) for i in range(3)] == ["a[default]", "b[default]", "c[default]"]
    tensors = tensors_for(t.problem)
    with pytest.raises(InputError, match="engine deselected"):
        t.execute_plan_at_index(0, tensors)
    with pytest.raises(InputError, match="exceeds the deselect ceiling 10 B"):
        t.build_plan_at_index(1)
    t.execute_plan_at_index(2, tensors)
    assert t.get_autotune_workspace_size() == 4
    by = {r.candidate: r for r in t.autotune(config=AutotuneConfig(strategy="single_shot"))}
    assert (by[0].disposition, by[1].disposition, by[2].disposition) == \
        (Disposition.BARRED_BY_DESELECT, Disposition.BARRED_BY_DESELECT, Disposition.SUCCEEDED)
    # the plan-spec path: the same deselections, the same barred results
    t2 = tuner_with(FakeEngine("a", estimate=8), FakeEngine("b", estimate=16), FakeEngine("c", estimate=4))
    t2.add_all_engines()
    t2.deselect_engines(["a"]).deselect_workspace_greater_than(10)
    by2 = {r.candidate: r for r in t2.autotune(config=AutotuneConfig(strategy="single_shot"))}
    assert [by2[i].disposition for i in range(3)] == [by[i].disposition for i in range(3)]
    assert "workspace 16 B exceeds the deselect ceiling 10 B" == by2[1].error


def test_the_workspace_ceiling_is_the_compiled_plans_not_the_estimate():
    under_est = FakeEngine("liar", estimate=4, actual=64)  # estimate under the ceiling, real workspace over
    over_est = FakeEngine("modest", estimate=64, actual=4)  # estimate over, real workspace under
    t = tuner_with(under_est, over_est)
    t.add_all_engines()
    t.deselect_workspace_greater_than(32)
    by = by_name(t.autotune(config=AutotuneConfig(strategy="single_shot")))
    assert by["liar[default]"].disposition is Disposition.BARRED_BY_DESELECT and by["liar[default]"].workspace_size == 64
    assert by["modest[default]"].succeeded


def test_build_plans_all_or_the_heuristic_choice():
    first_broken = FakeEngine("broken", fail_at="compile", priority=1)
    a, b = FakeEngine("a", priority=2), FakeEngine("b", priority=3)
    t = tuner_with(first_broken, a, b)
    t.add_all_engines()
    assert t.build_plans("heuristics_choice") == 1  # the first that compiles, in heuristic order
    assert t.plan_count == 3 and len(b.calls.compile) == 0
    with pytest.raises(UsageError, match="not built"):
        t.execute_plan_at_index(2, tensors_for(t.problem))
    t.build_plan_at_index(2)  # built on demand
    assert len(b.calls.compile) == 1
    t = tuner_with(FakeEngine("broken", fail_at="compile", priority=1), FakeEngine("a", priority=2),
                   FakeEngine("b", priority=3))
    t.add_all_engines()
    assert t.build_plans(BuildPolicy.ALL) == 2
    with pytest.raises(ValueError):
        t.build_plans("fastest")


def test_check_support_names_why_nothing_applies():
    t = tuner_with(FakeEngine("no", applicable=False))
    t.add_engine("no")
    with pytest.raises(AutotuneError, match="not supported here: no does not apply: fake says no"):
        t.check_support()


def test_log_lines_follow_the_rfc(caplog):
    """Per-engine start and result, per-iteration times with CoV progress, priming summary, failures at WARNING."""
    t = tuner_with(FakeEngine("ex", exhaustive=True), FakeEngine("broken", fail_at="run"),
                   timer=ScriptedTimer([1.0, 1.0, 1.0, 1.0]))
    t.add_all_engines()
    with caplog.at_level(logging.DEBUG, logger="farm.tuner.autotuner"):
        t.autotune(config=AutotuneConfig(mode="exhaustive", window=3))
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert all(m.startswith("autotune: ") for _, m in lines)
    assert ("INFO", "autotune: [2/2] ex[default]: start") in lines
    assert any(m.startswith("autotune: primed 1 of 2 candidate(s)") for _, m in lines)
    assert any(lvl == "DEBUG" and "iteration 3: 1.0000 ms, CoV of the last 3 0.0% (target 5%)" in m for lvl, m in lines)
    assert any(lvl == "INFO" and m.startswith("autotune: ex[default]: 1.0000 ms min") for lvl, m in lines)
    assert any(lvl == "WARNING" and "broken[default] failed_" in m for lvl, m in lines)


def test_api_guards():
    t = tuner_with(FakeEngine("a"))
    with pytest.raises(UsageError, match="build_plans"):
        _ = t.plan_count
    with pytest.raises(UsageError, match="no plan selected"):
        t.execute(tensors_for(t.problem))
    with pytest.raises(AutotuneError, match="no autotuning candidates"):
        t.autotune()
    with pytest.raises(AutotuneError):
        t.build_plans()
    t.add_all_engines()
    with pytest.raises(InputError, match="missing tensor B"):
        t.autotune({"A": np.zeros((8, 5), np.float32)})
    with pytest.raises(InputError, match="shape must be"):
        t.autotune({"A": np.ones((8, 5)), "B": np.ones((4, 6)), "C": np.ones((8, 6))})
    extra = tensors_for(t.problem)
    extra["unused"] = np.ones(3)  # extra tensors are accepted
    assert t.autotune(extra, AutotuneConfig(strategy="single_shot"))[0].succeeded


def test_all_candidates_failing_raises_with_the_results():
    t = tuner_with(FakeEngine("x", fail_at="compile"), FakeEngine("y", wrong=True))
    t.add_all_engines()
    with pytest.raises(AutotuneError, match="every candidate failed") as info:
        t.autotune(config=AutotuneConfig(check="reference"))
    assert {r.disposition for r in info.value.results} == {Disposition.FAILED_COMPILE, Disposition.WRONG_RESULT}
    assert t.winner is None


def test_check_against_the_first_candidate_and_off():
    t = tuner_with(FakeEngine("good"), FakeEngine("wrong", wrong=True))
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(strategy="single_shot", check=ResultCheck.FIRST))
    wrong = by_name(results)["wrong[default]"]
    assert wrong.disposition is Disposition.WRONG_RESULT and "good[default] (first candidate)" in wrong.error
    t = tuner_with(FakeEngine("good"), FakeEngine("wrong", wrong=True))
    t.add_all_engines()
    assert all(r.succeeded for r in t.autotune(config=AutotuneConfig(strategy="single_shot", check="off")))


def test_unwritten_outputs_are_caught_by_poisoning():
    lazy = FakeEngine("lazy")
    orig = lazy.compile

    def compile(problem, knobs, device):
        plan = orig(problem, knobs, device)
        plan.run = lambda tensors, ws, stream: None  # writes nothing
        return plan

    lazy.compile = compile
    t = tuner_with(FakeEngine("good"), lazy)
    t.add_all_engines()
    results = t.autotune(tensors_for(matmul_problem()), AutotuneConfig(strategy="single_shot", check="reference"))
    assert by_name(results)["lazy[default]"].disposition is Disposition.WRONG_RESULT


def test_listener_sees_every_candidate_and_compile_pool_gives_the_same_outcome():
    engines = [FakeEngine(f"e{i}", knobs=(TILE,)) for i in range(3)] + [FakeEngine("bad", fail_at="compile")]
    seen = []
    t = tuner_with(*engines)
    t.add_all_engines()
    for e in engines[:3]:
        t.add_engine(e.name, {"tile": 32})
    results = t.autotune(config=AutotuneConfig(strategy="single_shot", compile_workers=2), listener=seen.append)
    assert len(seen) == len(results) == 7
    assert all(r.rank == -1 for r in seen)  # streamed before ranking
    assert sum(r.succeeded for r in results) == 6
    assert sorted(r.candidate for r in results) == list(range(7))


def test_workspace_is_allocated_through_the_runtime_and_reused():
    e = FakeEngine("ws", knobs=(EXTRA,), estimate=0)
    t = tuner_with(e)
    t.add_engine("ws", {"extra": 4096})
    t.add_engine("ws", {"extra": 1024})
    results = t.autotune(config=AutotuneConfig(strategy="single_shot"))
    assert {r.workspace_size for r in results} == {4096, 1024}
    assert t._workspace_size == 4096  # grown once, reused for the smaller plan


def test_not_applicable_engine_added_by_id_fails_at_compile_time():
    t = tuner_with(FakeEngine("ok"), FakeEngine("nope", applicable=False))
    assert [c.engine_name for c in t.engine_configs()] == ["ok"]
    t.add_engine("nope")
    t.add_engine("ok")
    results = t.autotune(config=AutotuneConfig(strategy="single_shot"))
    nope = by_name(results)["nope[default]"]
    assert nope.disposition is Disposition.FAILED_COMPILE and "does not apply: fake says no" in nope.error


def input_recording_engine(seen: list) -> FakeEngine:
    """A fake engine whose plans append A[0, 0] of the inputs of each run to ``seen``."""
    e = FakeEngine("rot")
    orig = e.compile

    def compile(problem, knobs, device):
        plan = orig(problem, knobs, device)
        inner = plan.run

        def run(tensors, ws, stream):
            seen.append(float(tensors["A"][0, 0]))
            inner(tensors, ws, stream)

        plan.run = run
        return plan

    e.compile = compile
    return e


def test_rotating_buffers_give_each_timed_run_other_inputs():
    seen = []
    e = input_recording_engine(seen)
    t = tuner_with(e)
    t.add_all_engines()
    (r,) = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=6, warmup_iterations=0,
                                            check="off", rotating_buffers=2))
    timed = seen[-6:]
    assert len(set(timed[:3])) == 3 and timed[:3] == timed[3:]  # three input sets, in turn


def test_graph_timing_divides_by_the_runs_in_the_graph_and_falls_back_without_capture():
    calls = {"capture": 0}

    def capture(device, fn, repeats):
        calls["capture"] += 1
        return lambda: [fn() for _ in range(repeats)]

    dev = dataclasses.replace(fake_device(ScriptedTimer([8.0])), extras={"capture_graph": capture})
    t = Autotuner(matmul_problem(), dev, registry=registry_of(FakeEngine("g")))
    t.add_all_engines()
    (r,) = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=3, graph_repeats=4))
    assert calls["capture"] == 1 and r.min_ms == 2.0 and r.samples == (2.0, 2.0, 2.0)
    t2 = tuner_with(FakeEngine("g"), timer=ScriptedTimer([8.0]))  # a CPU device: no graphs
    t2.add_all_engines()
    (r2,) = t2.autotune(config=AutotuneConfig(strategy="single_shot", graph_repeats=4))
    assert r2.min_ms == 8.0 and "no graph capture" in r2.error and r2.succeeded


def test_a_captured_graph_takes_the_input_sets_in_turn():
    # one input set replayed 16 times keeps a decode GEMM's weights in L2; production streams them from memory
    seen = []
    e = input_recording_engine(seen)
    captured = []

    def capture(device, fn, repeats):
        start = len(seen)
        for _ in range(repeats):
            fn()
        captured.append(seen[start:])
        return lambda: None

    dev = dataclasses.replace(fake_device(ScriptedTimer([8.0])), extras={"capture_graph": capture})
    t = Autotuner(matmul_problem(), dev, registry=registry_of(e))
    t.add_all_engines()
    t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=2, warmup_iterations=0, check="off",
                                     rotating_buffers=2, graph_repeats=6))
    (runs,) = captured
    assert len(set(runs[:3])) == 3 and runs[:3] == runs[3:]  # three input sets, in turn, inside the graph


def test_first_candidate_comparison_can_stay_on_the_device():
    from farm.devices.arrays import NumpyArrays, relative_error

    calls = {"device": 0}

    class DeviceSideArrays(NumpyArrays):  # stands in for TorchArrays: compares without a host copy
        def clone(self, tensor):
            return tensor.copy()

        def relative_error(self, out, ref):
            calls["device"] += 1
            return relative_error(out, ref)

    dev = dataclasses.replace(fake_device(), arrays=DeviceSideArrays())
    t = Autotuner(matmul_problem(), dev, registry=registry_of(FakeEngine("good"), FakeEngine("wrong", wrong=True)))
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(strategy="single_shot", check="first"))
    assert by_name(results)["wrong[default]"].disposition is Disposition.WRONG_RESULT
    assert calls["device"] >= 2


def test_torch_arrays_compare_on_the_device():
    torch = pytest.importorskip("torch", reason="torch is not installed (it is optional)")
    from farm.devices.arrays import TorchArrays

    a = TorchArrays()
    x = torch.ones(10)
    assert a.relative_error(x, x) == 0.0
    assert a.relative_error(x * 1.1, x) == pytest.approx(0.1)
    assert a.relative_error(torch.full((3,), float("nan")), torch.ones(3)) == float("inf")


def test_timed_loops_and_gil_heavy_compiles_take_turns():
    import time

    from farm.devices.timing import gil_heavy_section

    spans = {"heavy": [], "timed": []}

    class HeavyCompile(FakeEngine):
        def compile(self, problem, knobs, device):
            with gil_heavy_section():  # as the Triton engine wraps its in-process compiles
                t0 = time.perf_counter()
                time.sleep(0.01)
                spans["heavy"].append((t0, time.perf_counter()))
            return super().compile(problem, knobs, device)

    class SpanTimer:
        def measure(self, fn):
            t0 = time.perf_counter()
            fn()
            time.sleep(0.002)
            spans["timed"].append((t0, time.perf_counter()))
            return 1.0

    t = tuner_with(HeavyCompile("heavy", knobs=(TILE,)), timer=SpanTimer())
    for tile in (16, 32, 64, 128):
        t.add_engine("heavy", {"tile": tile})
    results = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=5, compile_workers=3))
    assert len(results) == 4 and all(r.succeeded for r in results)
    assert len(spans["heavy"]) == 4 and len(spans["timed"]) == 20
    overlaps = [(h, m) for h in spans["heavy"] for m in spans["timed"] if h[0] < m[1] and m[0] < h[1]]
    assert overlaps == []


@pytest.mark.parametrize("workers", [0, 2])
def test_tuning_time_is_each_candidates_own_not_the_time_since_the_batch_began(workers):
    import time

    class SlowCompile(FakeEngine):
        def compile(self, problem, knobs, device):
            time.sleep(0.08)
            return super().compile(problem, knobs, device)

    t = tuner_with(SlowCompile("slow", knobs=(TILE,)))
    for tile in (16, 32, 64, 128):
        t.add_engine("slow", {"tile": tile})
    results = t.autotune(config=AutotuneConfig(strategy="single_shot", compile_workers=workers))
    assert all(r.compile_ms >= 80 for r in results)
    # each is its own 80 ms compile plus a quick measurement; counted from the batch's start, later
    # candidates would carry the earlier ones' compiles too (160 ms and more)
    assert all(r.compile_ms <= r.tuning_ms < r.compile_ms + 60 for r in results), [(r.compile_ms, r.tuning_ms) for r in results]


def test_a_failed_compile_records_how_long_it_took():
    t = tuner_with(FakeEngine("bad", fail_at="compile"), FakeEngine("good"))
    t.add_engine("bad")
    t.add_engine("good")
    r = by_name(t.autotune(config=AutotuneConfig(strategy="single_shot")))["bad[default]"]
    assert r.disposition is Disposition.FAILED_COMPILE and r.compile_ms is not None and r.tuning_ms >= r.compile_ms


def _per_engine_tuner(times):
    """A tuner whose timer returns each engine's own scripted samples (cycled)."""
    import itertools

    engines = [FakeEngine(n) for n in times]
    seqs = {n: itertools.cycle(v) for n, v in times.items()}
    current = {}

    class PerEngineTimer:
        def measure(self, fn):
            fn()
            return next(seqs[current["name"]])

    t = tuner_with(*engines, timer=PerEngineTimer())
    t.add_all_engines()
    for e in engines:
        orig = e.compile

        def compile(problem, knobs, device, _orig=orig, _name=e.name):
            plan = _orig(problem, knobs, device)
            run = plan.run

            def tracked(tensors, ws, stream, _run=run):
                current["name"] = _name
                return _run(tensors, ws, stream)

            plan.run = tracked
            return plan

        e.compile = compile
    return t


def test_a_noisy_candidate_near_the_top_is_measured_again_and_does_not_win_on_noise():
    # a: the default, stable 1.0; b: noisy around 0.98 (its noise overlaps a's time); c: noisy but far behind
    t = _per_engine_tuner({"a": [1.0], "b": [0.8, 1.16, 0.98, 0.8, 1.16, 0.98], "c": [3.0, 5.0, 3.0, 5.0]})
    results = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=6))
    by = {r.engine_name: r for r in results}
    assert by["b"].iterations == 12 and "re-measured" in by["b"].error
    assert by["a"].iterations == 6 and by["c"].iterations == 6  # stable, or noisy but not near the top
    # b's median is lower, but it is noisy and within noise of the stable default: the default stays first
    assert by["b"].median_ms < by["a"].median_ms
    assert [r.engine_name for r in results][:2] == ["a", "b"]


def test_results_carry_the_compiled_plan_index_and_minus_one_when_never_compiled():
    a, b = FakeEngine("a", estimate=8), FakeEngine("b", estimate=16)
    t = tuner_with(a, b, FakeEngine("broken", fail_at="compile"))
    t.add_all_engines()
    results = t.autotune(config=AutotuneConfig(strategy="fixed_average", timed_iterations=2, warmup_iterations=0,
                                               check="off"))
    by_name = {r.engine_name: r for r in results}
    assert by_name["a"].compiled_plan_index == by_name["a"].candidate == 0
    assert by_name["b"].compiled_plan_index == 1
    assert by_name["broken"].compiled_plan_index == -1 and not by_name["broken"].succeeded


def test_get_engine_configs_takes_the_heuristic_mode():
    from farm.model.records import HeuristicMode

    low, high = FakeEngine("z.low"), FakeEngine("a.high")
    low.priority, high.priority = 5, 90
    t = tuner_with(high, low)
    assert [c.engine_name for c in t.get_engine_configs()] == [c.engine_name for c in t.engine_configs()]
    assert [c.engine_name for c in t.get_engine_configs([HeuristicMode.A])] == ["z.low", "a.high"]
    assert [c.engine_name for c in t.get_engine_configs(["b", "fallback"])] == ["z.low", "a.high"]  # each once
    with pytest.raises(ValueError):
        t.get_engine_configs(["z"])


def test_a_tuning_process_prepares_its_engines_and_replay_does_not(tmp_path):
    """Autotuner.autotune lets the candidates' engines start what their compiles want (Triton's compile pool on a
    GPU: a process that tunes compiles in parallel); the replay runtime asks it not to (a library process starts
    no pool it was not asked for)."""
    calls = []

    class Preparing(FakeEngine):
        def prepare(self, device_kind):
            calls.append((self.name, device_kind))

    t = tuner_with(Preparing("p"), FakeEngine("plain"))
    t.add_all_engines()
    t.autotune(config=FAST)
    assert calls == [("p", "cpu")]
    calls.clear()
    t2 = tuner_with(Preparing("p"))
    t2.add_all_engines()
    t2.autotune(config=FAST, prepare=False)
    assert calls == []
