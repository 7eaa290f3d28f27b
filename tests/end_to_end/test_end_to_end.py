"""Real CPU problems end to end: discover -> add -> autotune -> execute -> the output is right."""

import numpy as np
import pytest

from tests.fakes import tune_in_process

from farm.tuner.judging.winner import decide

from farm import AutotuneConfig, Autotuner, EngineSweep, Problem, TuneMode
from farm.devices.arrays import make_tensors, relative_error
from farm.model.records import Disposition
from farm.tuner.reference import reference

PROBLEMS = [
    Problem.create("matmul", {"A": [96, 128], "B": [128, 80], "bias": [80]}),
    Problem.create("conv_fprop", {"X": [2, 16, 14, 14], "W": [24, 16, 3, 3]}, criteria={"pad_h": 1, "pad_w": 1}),
    Problem.create("sdpa_fwd", {"Q": [1, 4, 64, 32], "K": [1, 2, 64, 32], "V": [1, 2, 64, 32]}, criteria={"causal": 1}),
    Problem.create("layernorm", {"X": [64, 96], "scale": [96], "bias": [96]}, dtype="fp16"),
    Problem.create("rmsnorm", {"X": [4, 32, 64], "scale": [64]}),
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.op)
@pytest.mark.parametrize("mode", ["standard", "exhaustive"])
def test_discover_add_autotune_execute(problem, mode, cpu):
    tuner = Autotuner(problem, cpu)
    configs = tuner.engine_configs()
    assert len(configs) >= 2 and all(c.applicable for c in configs)
    tuner.add_engine_configs(configs)
    for cfg in configs:  # sweep the first choice-knob of each engine besides threads
        knob = next((k for k in cfg.knobs if k.choices and k.name != "threads"), None)
        if knob is not None:
            tuner.add_engine_sweep([EngineSweep(cfg.engine_name, {knob.name: list(knob.choices[:3])})])
    assert tuner.estimated_max_workspace() >= 0
    results = tuner.autotune(config=AutotuneConfig(mode=mode, strategy="run_until_stable", max_iterations=15,
                                                   max_tuning_duration_ms=100))
    assert len(results) == len(tuner.specs)
    assert all(r.disposition is Disposition.SUCCEEDED for r in results), [r.error for r in results if not r.succeeded]
    winner = results[0]
    # ranked by the farm's winner rule: the fastest median, or the default kept within noise
    decided = decide([r.median_ms for r in results], [r.mad_ms for r in results], [r.candidate for r in results],
                     default=[not r.knobs and r.candidate == 0 for r in results])
    assert winner.rank == 0 and results[decided.winner] is winner
    assert all(r.mode is TuneMode(mode) for r in results)
    assert any(r.ran_exhaustive for r in results) == (mode == "exhaustive" and problem.op == "matmul")
    # the winner computes the right answer on fresh data
    tensors = make_tensors(problem, cpu.arrays, seed=42)
    tuner.execute(tensors)
    ref = reference(problem, {t: cpu.arrays.to_numpy(tensors[t]) for t in problem.input_ids})
    for out in problem.output_ids:
        assert relative_error(cpu.arrays.to_numpy(tensors[out]), ref[out]) < 1e-2
        assert np.isfinite(cpu.arrays.to_numpy(tensors[out])).all()
    tuner.close()


@pytest.mark.slow
def test_tuning_workload_problems_in_process(repo_root, cpu, registry, tmp_path):
    from farm.fleet.local_run import run_local
    from farm.model.workload import load_workload

    wl = load_workload(f"{repo_root}/examples/cpu-quick.yaml", registry)
    outcomes = run_local(wl, tmp_path, cpu, registry).outcomes
    assert len(outcomes) == wl.problem_count
    for o in outcomes:
        assert o.winner is not None, o.error
        assert len({(r.engine_id, r.knobs) for r in o.results}) == len(o.results)  # one row per candidate
        # engines excluded or not applicable do not appear; the sweeps did
    assert any(r.knobs for o in outcomes for r in o.results)


def test_problem_with_no_applicable_engine_is_reported_not_raised(cpu, registry, tmp_path):
    from farm.model.workload import EngineSelection, WorkloadProblem

    p = Problem.create("batchnorm_inference", {"X": [2, 3, 4, 4], "scale": [3], "bias": [3], "mean": [3], "var": [3]})
    bf16 = Problem.create("matmul", {"A": [4, 4], "B": [4, 4]}, dtype="bf16")
    bn, mm = tune_in_process(tmp_path, [WorkloadProblem(0, "bn", p, EngineSelection()),
                                        WorkloadProblem(1, "mm", bf16, EngineSelection())],
                             cpu, AutotuneConfig(), registry).outcomes
    assert bn.results == () and "no applicable engine" in bn.error
    assert mm.results == () and "bf16" in mm.error


def test_resume_skips_done_specs(cpu, registry, tmp_path):
    from farm.model.workload import EngineSelection, WorkloadProblem

    wp = WorkloadProblem(0, "mm", PROBLEMS[0], EngineSelection())
    cfg = AutotuneConfig(strategy="single_shot", confirm=False)
    (first,) = tune_in_process(tmp_path / "a", [wp], cpu, cfg, registry).outcomes
    assert first.skipped == 0 and first.results
    # candidate indices are those of discovery's full list: "discovery order first" holds in every run
    (fresh,) = tune_in_process(tmp_path / "b", [wp], cpu, cfg, registry).outcomes
    assert {(r.spec, r.candidate) for r in fresh.results} == {(r.spec, r.candidate) for r in first.results}
    (again,) = tune_in_process(tmp_path / "a", [wp], cpu, cfg, registry).outcomes
    assert again.results == () and again.skipped == len(first.results) and again.error == ""
