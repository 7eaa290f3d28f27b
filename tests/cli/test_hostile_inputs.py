"""Hostile and broken inputs: never a silent wrong answer, never outside the root, never a traceback.

Each case builds a bad input of one format and checks what the farm does with it: the value is validated
exactly like a workload's, the error names the file, field and value, and nothing is run or written where
it should not be.
"""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import farm.ops as ops
from farm.devices.device import cpu_device
from farm.store.overrides.entries import OverrideEntry
from farm.store.overrides.files import write_overrides
from farm.model.problem import Problem

PROBLEM = Problem.create("matmul", {"A": [48, 40], "B": [40, 24]}, dtype="fp32")


@pytest.fixture(autouse=True)
def clean(replay_env):
    yield


def _override_file(path, knobs, engine="cpu.matmul.blocked"):
    dev = cpu_device()
    write_overrides(path, [OverrideEntry.for_problem(PROBLEM, engine, knobs, {"rank": 0})],
                    device={"signature": dev.signature, "properties": dev.properties.to_dict()}, mode="replace")
    return path


def _operands():
    rng = np.random.default_rng(3)
    return rng.random((48, 40), dtype=np.float32), rng.random((40, 24), dtype=np.float32)


def _replay_with_config(monkeypatch, caplog, config_path):
    """farm.ops.matmul with FARM_HEUR_CONFIG_PATH set: checks the answer, returns the choice made."""
    monkeypatch.setenv("FARM_HEUR_CONFIG_PATH", str(config_path))
    a, b = _operands()
    with caplog.at_level(logging.WARNING):
        c = ops.matmul(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    [choice] = ops.choices()
    return choice


@pytest.mark.parametrize("knobs", [(("block_k", -1),), (("block_k", 0),), (("block_k", 100),), (("block_k", "64"),)])
def test_an_override_knob_outside_the_engines_declared_values_is_never_run(tmp_path, monkeypatch, caplog, knobs):
    """block_k: -1 made farm.ops.matmul return zeros; block_k: 0 raised out of the production call."""
    path = _override_file(tmp_path / "ovr.json", knobs)
    choice = _replay_with_config(monkeypatch, caplog, path)
    assert choice["source"] == "SelectionHeuristic::StaticOrdering"  # Config declined; the next policy answered
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(path) in m and knobs[0][0] in m for m in warned), warned


@pytest.mark.parametrize("knobs", [(("tile", 7),), (("global.benchmarking", 1),)])
def test_a_knob_the_engine_does_not_have_is_ignored_never_run(tmp_path, monkeypatch, caplog, knobs):
    """Knobs in a file are information where the engine lacks them (hipDNN's SPLIT_K): the engine runs with the
    knobs it has, the benchmarking knob is the tuner's alone, and a warning names the ignored one."""
    path = _override_file(tmp_path / "ovr.json", knobs)
    choice = _replay_with_config(monkeypatch, caplog, path)
    assert choice["source"] == "SelectionHeuristic::Config" and choice["engine"] == "cpu.matmul.blocked"
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(path) in m and knobs[0][0] in m for m in warned), warned


def test_a_recorded_winner_with_a_bad_knob_is_not_replayed(tmp_path, monkeypatch, caplog):
    dev = cpu_device()
    results = tmp_path / "farm_tunable_results0.json"
    _override_file(results, (("block_k", -1),))
    monkeypatch.setenv("FARM_TUNABLE_ENABLED", "1")
    monkeypatch.setenv("FARM_TUNABLE_TUNING", "0")
    monkeypatch.setenv("FARM_TUNABLE_FILENAME", str(tmp_path / "farm_tunable_results.json"))
    a, b = _operands()
    with caplog.at_level(logging.WARNING):
        c = ops.matmul(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    assert ops.choices()[0]["source"] != "recorded"
    assert any("block_k" in r.getMessage() and str(results) in r.getMessage() for r in caplog.records)
    assert dev.signature  # the file was for this device: only the knob was wrong


def test_farm_publish_refuses_a_file_with_a_bad_knob(tmp_path, repo_root):
    folder = tmp_path / "overrides"
    folder.mkdir()
    dev = cpu_device()
    _override_file(folder / f"{dev.signature}.json", (("block_k", -1),))
    data = json.loads((folder / f"{dev.signature}.json").read_text())
    data["engine_overrides"][0]["autotune_metadata"].update({"median_time_ms": 1.0, "mode": "standard"})
    (folder / f"{dev.signature}.json").write_text(json.dumps(data))
    env = dict(os.environ, PYTHONPATH=repo_root)
    proc = subprocess.run([sys.executable, "-m", "farm", "publish", str(folder), "--to", str(tmp_path / "root")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip()
    assert "block_k" in line and "-1" in line and f"{dev.signature}.json" in line, line
    assert not (tmp_path / "root" / "index.json").exists()


# -- paths from files never leave their root --------------------------------------------------------
@pytest.mark.parametrize("bad_path", ["../outside.json", "/etc/passwd", "sub/../../outside.json", "x86/../../x.json",
                                      "C:/x.json", "a\\\\..\\\\b.json"])
def test_a_published_index_cannot_point_the_config_policy_outside_its_root(tmp_path, monkeypatch, caplog, bad_path):
    """index.json's `path` was followed as given: `../x.json`, absolute paths and /etc/passwd were applied."""
    from farm.store.publish.root import publish

    dev = cpu_device()
    good = tmp_path / "good"
    good.mkdir()
    _override_file(good / f"{dev.signature}.json", (("block_k", 64),))
    data = json.loads((good / f"{dev.signature}.json").read_text())
    data["engine_overrides"][0]["autotune_metadata"].update({"median_time_ms": 1.0, "mode": "standard"})
    (good / f"{dev.signature}.json").write_text(json.dumps(data))
    root = tmp_path / "root"
    publish(good, str(root))
    # an attacker's file outside the root, naming another engine, and an index that points at it
    _override_file(tmp_path / "outside.json", (), engine="cpu.matmul.einsum")
    published = next(root.rglob(f"{dev.signature}.json"))
    published.unlink()
    index = json.loads((root / "index.json").read_text())
    index["files"][dev.signature]["path"] = bad_path
    (root / "index.json").write_text(json.dumps(index))
    choice = _replay_with_config(monkeypatch, caplog, root)
    assert choice["engine"] != "cpu.matmul.einsum" and choice["source"] == "SelectionHeuristic::StaticOrdering"


def test_an_arch_named_dot_dot_publishes_inside_the_root(tmp_path):
    from farm.store.publish.published import arch_dir

    assert arch_dir("..") == "_.." and arch_dir(".") == "_." and arch_dir("../../etc") == "_.._.._etc"
    assert arch_dir("sm_90") == "sm_90" and arch_dir("gfx942:sramecc+:xnack-") == "gfx942"


# -- farm reduce writes only inside --out, under the rows' own signature ------------------------------
def test_a_partition_folder_named_like_a_path_is_skipped_and_nothing_is_written_outside(tmp_path):
    """device_signature=..%2F..%2Fpwned made farm reduce write ../../pwned.json outside --out."""
    import shutil

    from farm.store.reduce import reduce_results
    from tests.fakes import fake_props, fake_result, matmul_problem, write_results

    p = matmul_problem()
    gpu = fake_props()
    write_results(tmp_path / "results", {gpu: [(p, "p", [fake_result(p, "e", (1.0, 1.0, 1.0))])]})
    good = next((tmp_path / "results").glob("device_signature=*"))
    bad = tmp_path / "results" / "device_signature=..%2F..%2Fpwned"
    shutil.copytree(good, bad)
    out = tmp_path / "deep" / "er" / "out"
    report = reduce_results(tmp_path / "results", out)
    assert [s.signature for s in report.signatures] == [gpu.signature]
    assert any("device_signature=..%2F..%2Fpwned" in path for path, _ in report.skipped_files)
    assert not list(tmp_path.rglob("pwned*"))
    assert sorted(f.name for f in out.iterdir() if not f.name.startswith(".")) == \
        [f"{gpu.signature}.json", f"{gpu.signature}.winners.parquet"]


def test_rows_whose_own_device_disagrees_with_their_folder_get_no_override(tmp_path, caplog):
    import shutil

    from farm.store.reduce import reduce_results
    from tests.fakes import fake_props, fake_result, matmul_problem, write_results

    p = matmul_problem()
    a, b = fake_props(), fake_props("Other GPU", arch="gfx942")
    write_results(tmp_path / "results", {a: [(p, "p", [fake_result(p, "e", (1.0, 1.0, 1.0))])]})
    src = next((tmp_path / "results").glob("device_signature=*"))
    shutil.copytree(src, tmp_path / "results" / f"device_signature={b.signature}")  # a's rows under b's name
    with caplog.at_level(logging.WARNING):
        report = reduce_results(tmp_path / "results", tmp_path / "out")
    assert [s.signature for s in report.signatures] == [a.signature]
    assert not (tmp_path / "out" / f"{b.signature}.json").exists()
    assert any("are for device" in r.getMessage() for r in caplog.records)


# -- names and paths from the command line and workloads ----------------------------------------------
def _farm(repo_root, *args, cwd=None):
    env = dict(os.environ, PYTHONPATH=repo_root)
    return subprocess.run([sys.executable, "-m", "farm", *map(str, args)], cwd=cwd or repo_root, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_workload_named_like_a_path_writes_under_runs(tmp_path, repo_root):
    # YAML's double-quoted escapes: \e is ESC, \a is BEL (raw control characters are not valid YAML)
    (tmp_path / "w.yaml").write_text(
        'name: "../../escape\\e]0;pwned\\a"\nproblems:\n'
        '  - {name: "mm\\e[2J", op: matmul, dtype: fp32, tensors: {A: [8, 4], B: [4, 8]}}\n')
    proc = _farm(repo_root, "tune", tmp_path / "w.yaml", "--in-process", cwd=tmp_path / ".")
    assert proc.returncode == 0, proc.stderr
    written = [p.relative_to(tmp_path) for p in tmp_path.rglob("job.json")]
    assert len(written) == 1 and written[0].parts[0] == "runs" and len(written[0].parts) == 3, written
    assert "\x1b" not in proc.stdout + proc.stderr  # the names are shown, their escape sequences are not run
    assert "\\x1b" in proc.stdout


def test_publish_to_an_empty_root_is_a_one_line_error(tmp_path, repo_root):
    (tmp_path / "o").mkdir()
    proc = _farm(repo_root, "publish", tmp_path / "o", "--to", "")
    assert proc.returncode == 2 and "--to" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# -- jobs where some problems get no winner finish, say so, and exit 3 ---------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("executor", [["--in-process"], ["--devices", "cpu:1"]])
def test_a_job_where_no_candidate_can_run_finishes_with_exit_code_3(tmp_path, repo_root, executor):
    """An int8 matmul on the CPU (no engine applies) ended in IndexError and a job.json saying 'running'."""
    (tmp_path / "w.yaml").write_text("name: int8\nproblems:\n"
                                     "  - {name: mm8, op: matmul, dtype: int8, tensors: {A: [8, 4], B: [4, 8]}}\n")
    proc = _farm(repo_root, "tune", tmp_path / "w.yaml", "--out", tmp_path / "o", *executor)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "no winner" in proc.stdout and "mm8" in proc.stdout
    assert "0 of 1 problem(s) have a winner, 1 have none: mm8" in " ".join(proc.stderr.split())
    again = _farm(repo_root, "tune", tmp_path / "w.yaml", "--out", tmp_path / "o", "--allow-partial", *executor)
    assert again.returncode == 3  # nothing at all to accept
    run = json.loads((tmp_path / "o" / "job.json").read_text())["runs"][-1]
    assert run["state"] == "finished" and run["winners"] == 0 and "mm8" in next(iter(run["no_winner"].values()))
    # and reducing that folder (or an empty one) says there was nothing to reduce
    for folder in (tmp_path / "o" / "results", tmp_path):
        red = _farm(repo_root, "reduce", folder, "--out", tmp_path / "r")
        assert red.returncode == 1 and "nothing to reduce" in red.stderr and "Traceback" not in red.stderr


@pytest.mark.parametrize("flag,value", [("--candidate-timeout", "-1"), ("--candidate-timeout", "nan"),
                                        ("--candidate-timeout", "inf"), ("--progress-every", "0"),
                                        ("--top-k", "0"), ("--top-k", "-2")])
@pytest.mark.slow
def test_cli_numbers_out_of_range_are_one_line_errors(repo_root, flag, value):
    proc = _farm(repo_root, "tune", "examples/cpu-quick.yaml", "--dry-run", f"{flag}={value}")
    assert proc.returncode == 2 and flag in proc.stderr and "Traceback" not in proc.stderr


def test_nan_or_negative_times_never_win_a_reduce(tmp_path):
    from farm.store.reduce import reduce_results
    from tests.fakes import fake_props, fake_result, matmul_problem, write_results

    p, gpu = matmul_problem(), fake_props()
    write_results(tmp_path / "results", {gpu: [(p, "p", [
        fake_result(p, "honest", (1.0, 1.0, 1.0), candidate=0),
        fake_result(p, "negative", (-5.0, -5.0, -5.0), candidate=1),
        fake_result(p, "nan", (float("nan"),) * 3, candidate=2)])]})
    reduce_results(tmp_path / "results", tmp_path / "out")
    from farm.store.overrides.parsing import load_overrides

    assert load_overrides(tmp_path / "out" / f"{gpu.signature}.json").match(p).engine_name == "honest"


# -- workloads: one-line errors before any device time ----------------------------------------------
@pytest.mark.parametrize("text,field", [
    ("name: w\nname: v\nproblems: []\n", "name"),  # YAML keeps the last silently
    ("name: w\nautotune: {cold_cache: 'no'}\nproblems:\n  - {name: a, op: matmul, tensors: {A: [2, 2], B: [2, 2]}}\n",
     "cold_cache"),
    ("name: w\nproblems:\n  - {name: a, op: matmul, tensors: {A: [2, 9223372036854775808], B: [9223372036854775808, 2]}}\n",
     "dims"),
    ("name: w\nproblems:\n  - {name: a, op: conv_fprop, criteria: {pad_h: 99999999999999999999},\n"
     "     tensors: {X: [1, 1, 4, 4], W: [1, 1, 3, 3]}}\n", "pad_h"),
])
@pytest.mark.slow
def test_bad_workloads_are_one_line_errors(tmp_path, repo_root, text, field):
    (tmp_path / "w.yaml").write_text(text)
    proc = _farm(repo_root, "tune", tmp_path / "w.yaml", "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and field in err and "w.yaml" in err, err


# -- measurements reach disk; one writer per job folder ----------------------------------------------
def test_rows_reach_disk_within_a_second_without_another_row_arriving(tmp_path):
    """The driver's writer flushed only on the next append: a long candidate kept the earlier rows in memory,
    and a kill -9 of the driver lost them."""
    import time

    from farm.store.results import MeasurementContext, ResultWriter, RunContext, result_row
    from tests.fakes import fake_props, fake_result, matmul_problem

    p, gpu = matmul_problem(), fake_props()
    run = RunContext(job_id="j")
    w = ResultWriter(tmp_path, run.run_id, flush_rows=1000, flush_seconds=0.3, background=True)
    try:
        w.append([result_row(fake_result(p, "e"), p, "p", run, MeasurementContext(gpu))])
        # the background flush after 0.3 s: waited for (60 s at most: a loaded machine delays the thread)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(tmp_path.rglob("part-*.parquet")):
            time.sleep(0.05)
        assert len(list(tmp_path.rglob("part-*.parquet"))) == 1 and w.rows_written == 1, \
            "the background flush wrote no part within 60 s"
    finally:
        w.close()
    assert w.rows_written == 1  # close() wrote nothing twice


@pytest.mark.slow
def test_a_second_farm_tune_into_the_same_folder_is_refused(tmp_path, repo_root):
    """Two farm tune processes into one --out measured everything twice and lost one run's 'finished'."""
    from filelock import FileLock

    (tmp_path / "w.yaml").write_text("name: w\nproblems:\n  - {name: a, op: matmul, tensors: {A: [4, 4], B: [4, 4]}}\n")
    out = tmp_path / "o"
    out.mkdir()
    with FileLock(str(out / ".job.lock")):  # what a running farm tune holds
        proc = _farm(repo_root, "tune", tmp_path / "w.yaml", "--out", out, "--in-process")
    assert proc.returncode == 2 and "another farm tune is running into this folder" in proc.stderr
    assert not (out / "job.json").exists()
    proc = _farm(repo_root, "tune", tmp_path / "w.yaml", "--out", out, "--in-process")  # free again
    assert proc.returncode == 0, proc.stderr


# -- CLI targets and executors: bounded, one line -----------------------------------------------------
@pytest.mark.slow
def test_in_process_honours_the_candidate_timeout(tmp_path, repo_root):
    """A hanging candidate in-process gets a timed_out row; the run restarts itself and finishes the rest."""
    (tmp_path / "sim.yaml").write_text("devices: [{name: Sim H, count: 1}]\n"
                                       "faults: [{kind: hang, engine: sim.gemm, knobs: {block: 32}}]\n")
    (tmp_path / "w.yaml").write_text("name: hang\nautotune: {strategy: fixed_average, timed_iterations: 3}\n"
                                     "engines: {sweep: {sim.gemm: {block: [16, 32, 128]}}}\n"
                                     "problems: [{name: mm, op: matmul, tensors: {A: [128, 512], B: [512, 256]}}]\n")
    proc = _farm(repo_root, "tune", tmp_path / "w.yaml", "--in-process", "--devices", f"sim:{tmp_path / 'sim.yaml'}",
                 "--candidate-timeout", "1.5", "--out", tmp_path / "o", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hung for" in proc.stderr and "restarting" in proc.stderr and "Traceback" not in proc.stderr
    from farm.store.dataset import ResultsDataset

    rows = [r for r in ResultsDataset(tmp_path / "o" / "results").table(["candidate_key", "disposition", "round"])
            .to_pylist() if r["round"] == "main"]
    assert sorted(r["disposition"] for r in rows).count("timed_out") == 1
    assert [r for r in rows if r["disposition"] == "timed_out"][0]["candidate_key"].endswith('[["block",32]]')
    assert len({r["candidate_key"] for r in rows}) == len(rows) == 5  # everything once, the rest measured
    runs = json.loads((tmp_path / "o" / "job.json").read_text())["runs"]
    assert [r["state"] for r in runs] == ["failed", "finished"] and "hung" in runs[0]["error"]


def test_an_address_where_no_cluster_listens_is_a_one_line_error(tmp_path, repo_root):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    proc = _farm(repo_root, "tune", "examples/cpu-quick.yaml", "--address", f"127.0.0.1:{port}", "--out", tmp_path / "o")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr  # it ended (its own connect timeout)
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in proc.stderr


def test_unwritable_targets_are_one_line_errors(tmp_path, repo_root, capsys):
    from farm.cli import main as farm_main

    (tmp_path / "a-file").write_text("x")
    blocked = tmp_path / "a-file" / "sub"  # a file where a folder should be (root ignores permissions)
    wl = tmp_path / "w.yaml"
    wl.write_text("name: w\nautotune: {strategy: single_shot}\nengines: {include: [cpu.matmul.blas]}\n"
                  "problems: [{name: mm, op: matmul, tensors: {A: [8, 8], B: [8, 8]}, dtype: fp32}]\n")
    assert farm_main(["tune", str(wl), "--in-process", "--out", str(blocked)]) == 2
    assert farm_main(["tune", str(wl), "--in-process", "--out", str(tmp_path / "ok")]) == 0
    capsys.readouterr()
    for argv in (["report", str(tmp_path / "ok" / "results"), "--html", str(blocked / "r.html")],
                 ["reduce", str(tmp_path / "ok" / "results"), "--out", str(blocked)],
                 ["publish", str(tmp_path / "ok" / "overrides"), "--to", str(blocked)]):
        assert farm_main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "a-file" in err and "Traceback" not in err, (argv, err)


@pytest.mark.slow
def test_a_problem_larger_than_the_devices_memory_is_an_error_before_any_device_time(tmp_path, repo_root):
    (tmp_path / "w.yaml").write_text("name: big\nproblems:\n"
                                     "  - {name: huge, op: matmul, tensors: {A: [400000, 400000], B: [400000, 8]}}\n")
    for executor in (["--in-process"], ["--devices", "cpu"]):
        proc = _farm(repo_root, "tune", tmp_path / "w.yaml", *executor, "--out", tmp_path / "o")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        line = proc.stderr.strip()
        assert "problems[0].tensors" in line and "huge" in line and "GiB" in line and "w.yaml" in line, line
        assert not (tmp_path / "o").exists()
