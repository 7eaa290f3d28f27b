"""The cost model's mechanics on CPU engines: train from a results dataset, prune a tune with it (both executors),
evaluate it by holding families out; pruned rows in the Parquet tables, job.json and farm report; refusals.

Speed is not checked here (benchmarks/costmodel_cpu.py and the H200 figures in benchmarks/RESULTS.md are)."""

import json
import math

import pyarrow.dataset as ds
import pytest

from farm.costmodel.pruning import choose
from farm.errors import InputError
from farm.model.records import PruneSettings

lgb = pytest.importorskip("lightgbm", reason="the cost model needs LightGBM (pip install 'tunefarm[model]')")

FAST = {"strategy": "fixed_average", "timed_iterations": 3, "warmup_iterations": 1, "check": "off", "confirm": False}
ENGINES = {"include": ["cpu.matmul.blas", "cpu.matmul.blocked", "cpu.matmul.einsum"],
           "sweep": {"cpu.matmul.blas": {"order": ["direct", "transposed"], "threads": [1, 2]},
                     "cpu.matmul.blocked": {"block_k": [64, 128]}}}


def _workload(path, name, families, sizes=(8, 32, 64), autotune=None):
    import yaml

    problems = [{"name": f"{fam}/l{k}/m{m}", "op": "matmul", "dtype": "fp32", "tensors": {"A": [m, k], "B": [k, n]}}
                for fam, (k, n) in families.items() for m in sizes]
    path.write_text(yaml.safe_dump({"name": name, "autotune": autotune or FAST, "engines": ENGINES,
                                    "problems": problems}))
    return path


TRAIN = {"alpha": (64, 96), "beta": (96, 64), "gamma": (128, 128)}
HELD = {"delta": (96, 128)}


def _farm(*argv):
    from farm.cli.main import main

    return main(list(argv))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An exhaustive tune of three families in-process, and a model trained on it."""
    root = tmp_path_factory.mktemp("costmodel")
    wl = _workload(root / "train.yaml", "train", TRAIN)
    # --no-verify: the model reads main-round rows; the run's rows are those alone
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(root / "train"), "--no-verify") == 0
    assert _farm("model", "train", str(root / "train"), "--out", str(root / "model.json"), "--rounds", "50") == 0
    return root


def test_the_model_file_records_its_training_data_and_its_feature_schema(trained):
    data = json.loads((trained / "model.json").read_text())
    job = json.loads((trained / "train" / "job.json").read_text())
    t = data["training"]
    assert data["format"] == "tunefarm-cost-model" and data["library"]["name"] == "lightgbm"
    assert t["runs"] == [job["runs"][-1]["run_id"]] and t["problems"] == 9
    assert t["families"] == ["alpha", "beta", "gamma"] and t["rows"] == job["runs"][-1]["rows_written"]
    [(sig, counts)] = t["signatures"].items()
    assert sig == job["runs"][-1]["signatures"][0] and counts["problems"] == 9
    names = data["features"]["numeric"] + [c["name"] for c in data["features"]["categorical"]]
    assert {"engine", "gemm_m", "gemm_k_align", "knob_block_k", "arch"} <= set(names)


@pytest.mark.slow
def test_a_pruned_tune_measures_the_default_and_the_top_k_and_writes_a_pruned_row_for_the_rest(trained, tmp_path):
    wl = _workload(tmp_path / "held.yaml", "held", HELD)
    out = tmp_path / "pruned"
    code = _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--prune",
                 str(trained / "model.json"), "--prune-top-k", "2", "--prune-explore", "0.2", "--prune-seed", "7")
    assert code == 0
    t = ds.dataset(out / "results", partitioning="hive").to_table().to_pylist()
    assert {r["round"] for r in t} <= {"main", "verify"}
    t = [r for r in t if r["round"] != "verify"]  # farm tune's check of the published decisions: not candidates
    by_problem = {}
    for r in t:
        by_problem.setdefault(r["problem_name"], []).append(r)
    record = json.loads((out / "job.json").read_text())
    assert record["settings"]["prune"]["seed"] == 7 and record["settings"]["prune"]["top_k"] == 2
    assert record["runs"][-1]["pruning"]["pruned"] == sum(r["disposition"] == "pruned" for r in t) > 0
    for name, rows in by_problem.items():
        measured = [r for r in rows if r["disposition"] != "pruned"]
        pruned = [r for r in rows if r["disposition"] == "pruned"]
        default = min((r for r in rows if not r["knobs"]), key=lambda r: r["candidate_index"])
        assert default["disposition"] == "succeeded"  # the default is always measured
        # the default, two by rank, and ceil(0.2 x the rest)
        assert len(measured) == 3 + math.ceil(0.2 * (len(rows) - 3)) or len(measured) == 2 + math.ceil(0.2 * (len(rows) - 2))
        for r in pruned:
            assert not r["succeeded"] and r["median_ms"] is None and r["predicted_rel_time"] >= 1.0
            assert "cost model predicts" in r["error"]
        assert all(r["predicted_rel_time"] is None for r in measured)
        assert len({r["candidate_key"] for r in rows}) == len(rows)  # one row per candidate
    # the winner rule worked on what was measured: never a pruned candidate (the winners table names them)
    pruned_keys = {(r["problem_key"], r["candidate_key"]) for r in t if r["disposition"] == "pruned"}
    winners = ds.dataset(next((out / "overrides").glob("*.winners.parquet"))).to_table().to_pylist()
    assert len(winners) == len(by_problem)
    assert not {(w["problem_key"], w["candidate_key"]) for w in winners} & pruned_keys


@pytest.mark.slow
def test_pruned_rows_are_no_failures_and_farm_report_counts_them_per_problem(trained, tmp_path, capsys):
    wl = _workload(tmp_path / "held.yaml", "held", HELD)
    out = tmp_path / "pruned"
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--prune",
                 str(trained / "model.json"), "--prune-top-k", "1", "--prune-explore", "0") == 0
    capsys.readouterr()
    assert _farm("report", str(out), "--json") == 0
    [sig] = json.loads(capsys.readouterr().out)["signatures"]
    assert sig["failures"] == {} and sig["candidates_pruned"] > 0
    assert sum(p["pruned"] for p in sig["per_problem"]) == sig["candidates_pruned"]
    assert all(p["pruned"] > 0 and 1 <= p["candidates"] <= 2 for p in sig["per_problem"])  # the default and the top-1
    assert _farm("report", str(out)) == 0
    text = capsys.readouterr().out
    assert "candidates pruned" in text and "pruned" in text.split("per problem")[1]


def test_a_resume_without_prune_measures_what_was_pruned(trained, tmp_path):
    wl = _workload(tmp_path / "held.yaml", "held", HELD, sizes=(16,))
    out = tmp_path / "pruned"
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--prune",
                 str(trained / "model.json"), "--prune-top-k", "1", "--prune-explore", "0") == 0
    first = ds.dataset(out / "results", partitioning="hive").to_table().to_pylist()
    pruned = {r["candidate_key"] for r in first if r["disposition"] == "pruned"}
    assert pruned
    # pruning again writes no second pruned row; not pruning measures them
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--prune",
                 str(trained / "model.json"), "--prune-top-k", "1", "--prune-explore", "0") == 0
    again = ds.dataset(out / "results", partitioning="hive").to_table().to_pylist()
    assert len(again) == len(first)
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out)) == 0
    rows = ds.dataset(out / "results", partitioning="hive").to_table().to_pylist()
    assert {r["candidate_key"] for r in rows if r["disposition"] == "succeeded"} >= pruned


@pytest.mark.slow
def test_the_farm_prunes_on_ray_and_records_the_seed_in_job_json(trained, tmp_path):
    from farm.fleet.options import DeviceRequest, FarmOptions
    from farm.fleet.on_ray.cluster import run_farm
    from farm.model.engine import default_engine_registry
    from farm.model.workload import load_workload

    pytest.importorskip("ray", reason="the farm needs ray[default]")
    wl = _workload(tmp_path / "held.yaml", "held", HELD, sizes=(8, 64),
                   autotune={**FAST, "prune": {"model": str(trained / "model.json"), "top_k": 2, "explore": 0.1,
                                               "seed": 3}})
    workload = load_workload(wl, default_engine_registry())
    report = run_farm(workload, tmp_path / "run", devices=DeviceRequest.parse("cpu:1"), options=FarmOptions())
    record = json.loads((tmp_path / "run" / "job.json").read_text())
    assert record["settings"]["prune"]["seed"] == 3 and record["settings"]["prune"]["explore"] == 0.1
    assert report.pruning["pruned"] == record["runs"][-1]["pruning"]["pruned"] > 0
    rows = ds.dataset(tmp_path / "run" / "results", partitioning="hive").to_table().to_pylist()
    assert sum(r["disposition"] == "pruned" for r in rows) == report.pruning["pruned"]
    assert report.summary.missing == 0


def test_a_problem_outside_the_training_data_is_measured_in_full_and_says_so(trained, tmp_path):
    import yaml

    wl = tmp_path / "conv.yaml"
    wl.write_text(yaml.safe_dump({"name": "far", "autotune": FAST, "engines": ENGINES, "problems": [
        {"name": "huge/m4096", "op": "matmul", "dtype": "fp32", "tensors": {"A": [8, 8], "B": [8, 8]}}]}))
    out = tmp_path / "run"
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--prune",
                 str(trained / "model.json")) == 0
    run = json.loads((out / "job.json").read_text())["runs"][-1]
    [(sig, full)] = run["pruning"]["measured_in_full"].items()
    assert "outside the trained range" in full["huge/m4096"] and run["pruning"]["pruned"] == 0


def test_eval_holds_each_family_out_and_reports_measurements_and_regret(trained, capsys):
    capsys.readouterr()
    assert _farm("model", "eval", str(trained / "train"), "--holdout", "family", "--top-k", "2", "--explore", "0",
                 "--rounds", "30", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["holdout"] == "family" and out["groups"] == 3 and len(out["problems"]) == 9
    from farm.store.dataset import results_folder
    from farm.store.deciding.rule import decide_results

    published = {(w.signature, w.problem_name): w.label
                 for w in decide_results(results_folder(trained / "train")).winners.values()}
    for p in out["problems"]:
        # the exhaustive winner is the one the reducer published (not merely the fastest median); a pruned tune that
        # measured it publishes it too (regret 1), else the winner rule's pick among what it measured
        assert p["winner"] == published[(p["signature"], p["problem"])]
        assert p["measured"] <= p["candidates"] and p["regret"] > 0
        assert p["picked"] != p["winner"] or p["regret"] == 1.0
        assert p["measured"] == p["candidates"] or p["measured"] <= 3  # the default and two by rank
    s = out["summary"]
    assert s["candidates"] == sum(p["candidates"] for p in out["problems"]) and s["measured"] >= 9
    assert s["geomean_regret"] > 0 and 0 <= s["within_1_02"] <= 1
    assert _farm("model", "eval", str(trained / "train"), "--top-k", "2", "--rounds", "30") == 0
    text = capsys.readouterr().out
    assert "held-out family group(s)" in text and "geomean" in text


def test_a_model_whose_feature_schema_does_not_fit_is_refused(trained, tmp_path, capsys):
    from farm.costmodel.model import CostModel

    data = json.loads((trained / "model.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**data, "features": {**data["features"], "numeric": data["features"]["numeric"] + ["t0_d0"]}}))
    with pytest.raises(InputError) as err:
        CostModel.load(bad)
    assert err.value.field == "features" and str(bad) in str(err.value) and "t0_d0" in str(err.value)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**data, "features": {**data["features"], "version": 1}}))
    with pytest.raises(InputError, match="version 1"):
        CostModel.load(old)
    (tmp_path / "w.yaml").write_text("name: w\nproblems: [{name: a, op: matmul, tensors: {A: [4, 4], B: [4, 4]}}]\n")
    capsys.readouterr()
    assert _farm("tune", str(tmp_path / "w.yaml"), "--prune", str(bad)) == 2  # before any device time
    err_text = capsys.readouterr().err
    assert "bad.json" in err_text and "feature schema does not fit" in err_text and "Traceback" not in err_text
    assert _farm("tune", str(tmp_path / "w.yaml"), "--prune", str(tmp_path / "missing.json")) == 2
    assert "model file not found" in capsys.readouterr().err


def test_choose_keeps_the_default_and_incumbent_takes_the_top_k_and_draws_the_rest_with_the_seed():
    predicted = [5.0, 1.0, 1.2, 3.0, 1.1, 4.0, 2.0, 2.5, 6.0, 7.0]
    picked = choose(predicted, keep=[0, 9], top_k=2, explore=0.0, seed=0, key="p")
    assert picked == [0, 1, 4, 9]
    a = choose(predicted, keep=[0], top_k=2, explore=0.5, seed=1, key="p")
    assert set(a) >= {0, 1, 4} and len(a) == 3 + math.ceil(0.5 * 7)
    assert a == choose(predicted, keep=[0], top_k=2, explore=0.5, seed=1, key="p")  # repeatable
    draws = {tuple(choose(predicted, keep=[0], top_k=2, explore=0.3, seed=s, key="p")) for s in range(8)}
    assert len(draws) > 1  # the seed decides the draw
    assert choose([1.0, 2.0], keep=[], top_k=5, explore=0.5, seed=0, key="p") == [0, 1]


def test_prune_settings_are_checked_where_they_are_written(tmp_path):
    from farm.model.engine import default_engine_registry
    from farm.model.workload import load_workload

    with pytest.raises(InputError, match="prune.explore"):
        PruneSettings(model="m.json", explore=1.5)
    with pytest.raises(InputError, match="prune.top_k"):
        PruneSettings.parse({"model": "m.json", "top_k": 0})
    with pytest.raises(InputError, match="prune.model"):
        PruneSettings.parse({"top_k": 3})
    wl = tmp_path / "sub" / "w.yaml"
    wl.parent.mkdir()
    wl.write_text("name: w\nautotune: {prune: {model: models/m.json, seed: 4}}\n"
                  "problems: [{name: a, op: matmul, tensors: {A: [4, 4], B: [4, 4]}}]\n")
    p = load_workload(wl, default_engine_registry()).autotune.prune
    assert p.model == str(tmp_path / "sub" / "models" / "m.json") and p.seed == 4  # relative to the workload file
