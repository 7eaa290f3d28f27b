"""farm tune --history: a cost model trained on earlier results prunes a new tune, the bound it assumes is stated,
a published root's history and decisions are used (a decided problem only checked), farm publish --history fills
that history; mistakes are one line."""

import json

import pyarrow.dataset as ds
import pytest

lgb = pytest.importorskip("lightgbm", reason="the cost model needs LightGBM (pip install 'tunefarm[model]')")

FAST = {"strategy": "fixed_average", "timed_iterations": 3, "warmup_iterations": 1, "check": "off", "confirm": False}
ENGINES = {"include": ["cpu.matmul.blas", "cpu.matmul.blocked", "cpu.matmul.einsum"],
           "sweep": {"cpu.matmul.blas": {"order": ["direct", "transposed"], "threads": [1, 2]},
                     "cpu.matmul.blocked": {"block_k": [64, 128]}}}
TRAIN = {"alpha": (64, 96), "beta": (96, 64), "gamma": (128, 128)}


def _workload(path, name, families, sizes=(8, 32)):
    import yaml

    problems = [{"name": f"{fam}/l{k}/m{m}", "op": "matmul", "dtype": "fp32", "tensors": {"A": [m, k], "B": [k, n]}}
                for fam, (k, n) in families.items() for m in sizes]
    path.write_text(yaml.safe_dump({"name": name, "autotune": FAST, "engines": ENGINES, "problems": problems}))
    return path


def _farm(*argv):
    from farm.cli.main import main

    return main(list(argv))


def _rows(out):
    rows = ds.dataset(out / "results", partitioning="hive").to_table().to_pylist()
    return [r for r in rows if r["round"] == "main"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test its own cache of trained history models (never the user's)."""
    monkeypatch.setenv("FARM_HISTORY_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """An exhaustive tune of three families, published with its results to a root."""
    root = tmp_path_factory.mktemp("history")
    wl = _workload(root / "train.yaml", "train", TRAIN)
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(root / "train"), "--no-verify") == 0
    assert _farm("publish", str(root / "train" / "overrides"), "--to", str(root / "pub"), "--history") == 0
    return root


def test_publish_history_copies_the_runs_results_once(history, capsys):
    run_files = sorted(p.relative_to(history / "train" / "results")
                       for p in (history / "train" / "results").rglob("*.parquet"))
    copied = sorted(p.relative_to(history / "pub" / "history") for p in (history / "pub" / "history").rglob("*.parquet"))
    assert copied == run_files and run_files
    capsys.readouterr()
    assert _farm("publish", str(history / "train" / "overrides"), "--to", str(history / "pub"), "--history",
                 "--json") == 0
    again = json.loads(capsys.readouterr().out)["history"]
    assert again["copied"] == 0 and again["present"] == len(run_files)
    assert not list((history / "pub" / "history").rglob("*.tmp"))


def test_a_tune_with_history_prunes_by_a_model_trained_on_it_and_states_its_bound(history, tmp_path, capsys):
    wl = _workload(tmp_path / "new.yaml", "new", {"delta": (96, 128), "alpha": (64, 96)}, sizes=(16,))
    out = tmp_path / "run"
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--history",
                 str(history / "train"), "--prune-top-k", "2", "--prune-explore", "0") == 0
    captured = capsys.readouterr()
    assert "held out in turn" in captured.err and "within 1.02 of the best on" in captured.err
    assert "Pruned by the cost model" in captured.out and "bound" in captured.out
    model = json.loads((out / "history-model.json").read_text())
    assert model["training"]["problems"] == 6 and model["training"]["held_out"]["families"] == 3
    record = json.loads((out / "job.json").read_text())
    assert record["settings"]["prune"]["top_k"] == 2 and record["settings"]["prune"]["check_decided"] is False
    rows = _rows(out)
    for name in {r["problem_name"] for r in rows}:
        mine = [r for r in rows if r["problem_name"] == name]
        measured = [r for r in mine if r["disposition"] != "pruned"]
        assert 2 <= len(measured) <= 3 < len(mine)  # the default and the top 2 (one may be the default)
        assert any(not r["knobs"] and r["disposition"] == "succeeded" for r in measured)
    # a resume reuses the model (same history) and prunes the same: no new rows
    stamp = (out / "history-model.json").stat().st_mtime_ns
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--history",
                 str(history / "train"), "--prune-top-k", "2", "--prune-explore", "0") == 0
    assert (out / "history-model.json").stat().st_mtime_ns == stamp
    assert len(_rows(out)) == len(rows)


def test_a_published_root_gives_history_and_decisions_a_decided_problem_is_only_checked(history, tmp_path):
    # two problems the root decides, one it does not
    wl = _workload(tmp_path / "mixed.yaml", "mixed", {"alpha": (64, 96), "delta": (96, 128)}, sizes=(8,))
    out = tmp_path / "run"
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out), "--history",
                 str(history / "pub"), "--prune-explore", "0") == 0
    published = json.loads(next((history / "pub").glob("*/*.json")).read_text())
    winners = {e["autotune_metadata"]["problem_key"]: e["engine_name"] for e in published["engine_overrides"]}
    rows = _rows(out)
    decided = [r for r in rows if r["problem_name"] == "alpha/l64/m8"]
    measured = [r for r in decided if r["disposition"] != "pruned"]
    key = decided[0]["problem_key"]
    assert key in winners
    assert winners[key] in {r["engine_name"] for r in measured} and len(measured) <= 2
    assert any(not r["knobs"] for r in measured)  # the default, to check the decision against
    assert all("decided in the published root" in r["error"] for r in decided if r["disposition"] == "pruned")
    fresh = [r for r in rows if r["problem_name"] == "delta/l96/m8"]
    assert not any("decided in the published root" in (r["error"] or "") for r in fresh)
    run = json.loads((out / "job.json").read_text())["runs"][-1]["pruning"]
    [(sig, names)] = run["decided"]["checked"].items()
    assert names == ["alpha/l64/m8"] and run["decided"]["spared"] == len(decided) - len(measured)
    # --retune-decided tunes it like any other (the cost model's pruning only)
    out2 = tmp_path / "retune"
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(out2), "--history",
                 str(history / "pub"), "--retune-decided", "--prune-explore", "0") == 0
    assert not any("decided in the published root" in (r["error"] or "") for r in _rows(out2))


def test_history_mistakes_are_one_line(history, tmp_path, capsys):
    wl = _workload(tmp_path / "w.yaml", "w", {"alpha": (64, 96)}, sizes=(8,))
    base = ["tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(tmp_path / "o")]
    assert _farm(*base, "--history", str(tmp_path / "nowhere")) == 2
    assert "nowhere" in capsys.readouterr().err
    assert _farm(*base, "--history", str(history / "train"), "--prune", str(tmp_path / "m.json")) == 2
    assert "not both" in capsys.readouterr().err
    assert _farm(*base, "--retune-decided") == 2
    assert "--retune-decided needs --history" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_second_run_folder_tuned_from_the_same_history_copies_the_model_not_trains_it(history, tmp_path, capsys):
    wl = _workload(tmp_path / "w.yaml", "w", {"delta": (96, 128)}, sizes=(8,))
    args = ["--in-process", "--devices", "cpu", "--history", str(history / "train"), "--no-verify"]
    assert _farm("tune", str(wl), "--out", str(tmp_path / "a"), *args) == 0
    assert "training the cost model" in capsys.readouterr().err
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    assert _farm("tune", str(wl), "--out", str(tmp_path / "b"), *args) == 0
    assert "training the cost model" not in capsys.readouterr().err
    assert (tmp_path / "b" / "history-model.json").read_text() == (tmp_path / "a" / "history-model.json").read_text()
    # other pruning settings: another model (its bound was measured with those settings)
    assert _farm("tune", str(wl), "--out", str(tmp_path / "c"), *args, "--prune-top-k", "3") == 0
    assert "training the cost model" in capsys.readouterr().err
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2


def _copy_results(src, dest):
    import shutil

    shutil.copytree(src, dest)
    return dest


def test_rows_with_a_median_of_zero_or_below_are_skipped_with_a_warning(history, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    results = _copy_results(history / "train" / "results", tmp_path / "bad" / "results")
    winner = pq.read_table(next((history / "train" / "overrides").glob("*.winners.parquet"))).to_pylist()[0]
    bad = 0
    for n, part in enumerate(sorted(results.rglob("*.parquet"))):
        t = pq.read_table(part)
        keys = t.select(["problem_key", "candidate_key"]).to_pylist()
        med = t.column("median_ms").to_pylist()
        for i, k in enumerate(keys):  # every time of a published winner read 0: no time to learn from
            if (k["problem_key"], k["candidate_key"]) == (winner["problem_key"], winner["candidate_key"]):
                med[i], bad = 0.0, bad + 1
        if n == 0:  # and a negative time, and none at all
            med[-1], med[-2], bad = -1.0, float("nan"), bad + 2
        pq.write_table(t.set_column(t.schema.get_field_index("median_ms"), "median_ms",
                                    pa.array(med, t.schema.field("median_ms").type)), part)
    wl = _workload(tmp_path / "w.yaml", "w", {"delta": (96, 128)}, sizes=(8,))
    capsys.readouterr()
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(tmp_path / "o"),
                 "--history", str(tmp_path / "bad"), "--no-verify") == 0
    assert f"{bad} row(s) with a median time of 0 or below" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["altered", "malformed", "no checksum"])
def test_a_damaged_or_altered_cached_model_is_trained_again_never_trusted_nor_loaded(history, tmp_path, capsys,
                                                                                    damage):
    import hashlib
    import re

    wl = _workload(tmp_path / "w.yaml", "w", {"delta": (96, 128)}, sizes=(8,))
    args = ["--in-process", "--devices", "cpu", "--history", str(history / "train"), "--no-verify"]
    assert _farm("tune", str(wl), "--out", str(tmp_path / "a"), *args) == 0
    [cached] = (tmp_path / "cache").glob("*.json")
    data = json.loads(cached.read_text())
    if damage == "altered":  # still a valid model, another one: the cache must not hand it out
        data["training"]["problems"] = 999
    else:  # trees LightGBM's loader aborts the process on (its tree_sizes no longer the trees')
        data["booster"] = re.sub(r"tree_sizes=\d+", "tree_sizes=7", data["booster"], count=1)
    cached.write_text(json.dumps(data))
    if damage == "no checksum":
        cached.with_name(cached.name + ".sha256").unlink()
    capsys.readouterr()
    assert _farm("tune", str(wl), "--out", str(tmp_path / "b"), *args) == 0  # the process lives to say so
    assert "training the cost model" in capsys.readouterr().err
    model = json.loads((tmp_path / "b" / "history-model.json").read_text())
    assert model["training"]["problems"] == 6
    sums = (tmp_path / "b" / "history-model.json.sha256").read_text().split()[0]
    assert sums == hashlib.sha256((tmp_path / "b" / "history-model.json").read_bytes()).hexdigest()


def test_a_model_file_with_malformed_trees_is_refused_not_handed_to_lightgbm(history, tmp_path):
    import re
    import subprocess
    import sys

    from farm.costmodel.model import CostModel

    src = tmp_path / "m.json"
    assert _farm("model", "train", str(history / "train"), "--out", str(src)) == 0
    data = json.loads(src.read_text())
    bad = tmp_path / "bad.json"
    data["booster"] = re.sub(r"num_leaves=(\d+)", lambda m: f"num_leaves={int(m.group(1)) * 10}", data["booster"],
                             count=1)
    bad.write_text(json.dumps(data))
    code = ("import sys; from farm.costmodel.model import CostModel\n"
            "try:\n    CostModel.load(sys.argv[1])\nexcept Exception as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True)
    assert done.returncode == 0 and "refused:" in done.stdout and "malformed" in done.stdout  # not SIGABRT
    assert CostModel.load(src).booster.num_trees() > 0  # the file as written loads


def test_publish_history_checks_everything_before_writing_and_never_leaves_the_root(history, tmp_path, capsys):
    import os

    # no results folder beside the overrides: refused, the root not made
    lone = tmp_path / "lone" / "overrides"
    lone.mkdir(parents=True)
    for f in (history / "train" / "overrides").glob("*.json"):
        (lone / f.name).write_text(f.read_text())
    assert _farm("publish", str(lone), "--to", str(tmp_path / "root1"), "--history") == 2
    assert "no results folder" in capsys.readouterr().err
    assert not (tmp_path / "root1").exists()
    # a history folder linking out of the root: refused for publishing and for reading
    root = tmp_path / "root2"
    assert _farm("publish", str(history / "train" / "overrides"), "--to", str(root)) == 0
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    sig = next((history / "train" / "results").glob("device_signature=*")).name
    (root / "history").mkdir()
    os.symlink(outside, root / "history" / sig)
    capsys.readouterr()
    assert _farm("publish", str(history / "train" / "overrides"), "--to", str(root), "--history") == 2
    assert "link out of the published root" in capsys.readouterr().err
    assert not any(outside.iterdir())
    wl = _workload(tmp_path / "w.yaml", "w", {"delta": (96, 128)}, sizes=(8,))
    assert _farm("tune", str(wl), "--in-process", "--devices", "cpu", "--out", str(tmp_path / "o"), "--history",
                 str(root)) == 2
    assert "link out of the published root" in capsys.readouterr().err


def test_two_publishers_of_one_run_use_temp_names_of_their_own(history, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from farm.store.publish.history import publish_history

    root = tmp_path / "root"
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: publish_history(history / "train" / "overrides", str(root)), range(4)))
    files = sorted(p.relative_to(root / "history") for p in (root / "history").rglob("*.parquet"))
    assert files == sorted(p.relative_to(history / "train" / "results")
                           for p in (history / "train" / "results").rglob("*.parquet"))
    assert sum(d.copied for d in done) >= len(files) and not list((root / "history").rglob("*.tmp"))
