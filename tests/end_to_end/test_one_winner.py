"""One winner everywhere: the override file, the winners table (the README's SQL), farm tune --json,
farm report, farm diff and the Ray and in-process executors all show the reducer's decision."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from farm.store.overrides.parsing import load_overrides
from farm.model.knobs import candidate_label
from farm.cli.tables.runs import winners_query

WORKLOAD = """
name: one-winner
seed: 0
autotune: {strategy: run_until_stable, max_iterations: 15, max_tuning_duration_ms: 40, window: 3}
engines:
  sweep:
    cpu.matmul.blocked: {block_k: [64, 256]}
    cpu.matmul.blas: {order: [direct, transposed], threads: [0, 1]}
    cpu.layernorm.twopass: {row_block: [64, 1024]}
problems:
  - {name: gemm-a, op: matmul, dtype: fp32, tensors: {A: {dims: [192, 160]}, B: {dims: [160, 96]}}}
  - {name: gemm-b, op: matmul, dtype: fp32, tensors: {A: {dims: [64, 512]}, B: {dims: [512, 48]}}}
  - {name: gemm-512, op: matmul, dtype: fp32, tensors: {A: {dims: [512, 512]}, B: {dims: [512, 512]}}}
  - {name: ln, op: layernorm, tensors: {X: {dims: [256, 384]}, scale: {dims: [384]}, bias: {dims: [384]}}}
"""


def farm(repo_root, *args, check=True):
    env = dict(os.environ, PYTHONPATH=repo_root, COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "farm", *map(str, args)], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=400)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory, repo_root):
    root = tmp_path_factory.mktemp("one-winner")
    workload = root / "w.yaml"
    workload.write_text(WORKLOAD)
    out = {}
    for name, extra in (("local", ["--in-process"]), ("ray", ["--devices", "cpu:1"])):
        proc = farm(repo_root, "tune", workload, "--out", root / name, "--json", *extra)
        out[name] = (root / name, json.loads(proc.stdout))
    return out


def _tune_winners(data):
    [sig] = data["signatures"]
    return sig, {p["name"]: p["winner"]["label"] for p in data["signatures"][sig]}


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_every_surface_names_the_same_winner(runs, repo_root, executor):
    duckdb = pytest.importorskip("duckdb")
    folder, data = runs[executor]
    sig, from_json = _tune_winners(data)
    assert set(from_json) == {"gemm-a", "gemm-b", "gemm-512", "ln"}
    assert data["no_winner"] == {}

    f = load_overrides(folder / "overrides" / f"{sig}.json")
    from_file = {e.metadata["problem_name"]: candidate_label(e.engine_name, e.knobs) for e in f.entries}

    # the README's query (the same text `farm tune` prints), one row per tuned problem
    rows = duckdb.sql(winners_query(str(folder))).fetchall()
    from_sql = {name: candidate_label(engine, tuple((k["id"], _value(k)) for k in knobs)) for name, engine, knobs, *_ in rows}
    assert len(rows) == 4

    report = json.loads(farm(repo_root, "report", folder / "results", "--json").stdout)
    [s] = report["signatures"]
    from_report = {p["problem"]: p["winner"] for p in s["per_problem"]}

    assert from_json == from_file == from_sql == from_report

    # where the winner is not the fastest candidate, every surface says why, in the same words
    table = {r[0]: r[4] for r in rows}
    for e in f.entries:
        name = e.metadata["problem_name"]
        why = e.metadata["selection"]["why"]
        assert table[name] == why == next(p["why"] for p in s["per_problem"] if p["problem"] == name)
        assert (why == "") == (e.metadata["selection"]["rule"] == "fastest")


def _value(knob):
    return int(knob["value"]) if knob["type"] == "int" else float(knob["value"]) if knob["type"] == "double" else knob["value"]


def test_diff_of_result_folders_and_of_override_files_agree(runs, repo_root):
    (a, da), (b, db) = runs["local"], runs["ray"]
    sig_a, _ = _tune_winners(da)
    sig_b, _ = _tune_winners(db)
    assert sig_a == sig_b  # same host, same threads: one signature (see the next test)
    on_results = json.loads(farm(repo_root, "diff", a, b, "--json").stdout)
    on_files = json.loads(farm(repo_root, "diff", a / "overrides" / f"{sig_a}.json",
                               b / "overrides" / f"{sig_b}.json", "--json").stdout)
    assert on_results["counts"] == on_files["counts"]
    assert sorted((r["problem"], r["status"], r["old_winner"], r["new_winner"]) for r in on_results["rows"]) == \
        sorted((r["problem"], r["status"], r["old_winner"], r["new_winner"]) for r in on_files["rows"])


def test_ray_workers_measure_with_the_threads_production_uses(runs):
    """Ray starts actors with OMP_NUM_THREADS=1; the farm's CPU worker runs with this host's threads, the
    same as the in-process run and farm.ops, and records them in the signature (compute_units)."""
    from farm.devices.runtimes.cpu import blas_threads_in_force

    (_, local), (ray_folder, ray) = runs["local"], runs["ray"]
    assert local["workers"][0]["properties"]["compute_units"] == blas_threads_in_force()
    assert ray["workers"][0]["properties"]["compute_units"] == blas_threads_in_force()
    assert ray["workers"][0]["signature"] == local["workers"][0]["signature"]
    job = json.loads((ray_folder / "job.json").read_text())
    assert job["runs"][-1]["state"] == "finished" and job["runs"][-1]["winners"] == 4


def test_a_cpu_worker_runs_with_the_threads_it_is_given_or_the_hosts_cores(repo_root):
    """What DeviceWorkerImpl does first in a Ray actor (which starts with OMP_NUM_THREADS=1), in a subprocess."""
    script = (
        "import os\n"
        "from farm.fleet.on_ray.worker import DeviceWorkerImpl\n"
        "from farm.devices.runtimes.cpu import usable_cores, blas_threads_in_force\n"
        "w = DeviceWorkerImpl('cpu', 0, cpu_threads=int(os.environ['WANT']) or None)\n"
        "print(blas_threads_in_force(), w.device.properties.compute_units, usable_cores())\n")
    for want in ("1", "0"):
        env = dict(os.environ, PYTHONPATH=repo_root, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", WANT=want)
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        in_force, units, cores = map(int, proc.stdout.split())
        expected = 1 if want == "1" else cores
        assert in_force == units == expected, (want, proc.stdout)


def test_tune_prints_the_readme_query_and_the_readme_has_it(repo_root, runs):
    readme = Path(repo_root, "README.md").read_text()
    assert winners_query("runs/quick") in readme
    assert not re.search(r"WHERE rank = 0", readme)
