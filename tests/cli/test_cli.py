"""The farm command as a user runs it: tables, --json, exit codes, no tracebacks for user mistakes."""

import json
import os
import subprocess
import sys

import pytest


def farm(repo_root, *args, check=False):
    env = dict(os.environ, PYTHONPATH=repo_root, COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "farm", *args], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_engines_table_lists_engines_ops_knobs(repo_root):
    out = farm(repo_root, "engines", check=True).stdout
    for text in ("cpu.matmul.blas", "cpu.conv.fft", "cpu.sdpa.online", "cpu.layernorm.onepass",
                 "block_k: int in {64, 128, 256, 512, 1024, 2048} = 256", "threads: int in [0, 256] = 0",
                 "conv_fprop", "exhaustive"):
        assert text in out, text


@pytest.mark.slow
def test_engines_json_and_op_filter(repo_root):
    data = json.loads(farm(repo_root, "engines", "--json", check=True).stdout)
    blas = next(e for e in data if e["name"] == "cpu.matmul.blas")
    assert blas["ops"] == ["matmul"] and isinstance(blas["id"], int)
    assert {k["name"] for k in blas["knobs"]} == {"threads", "order"}
    conv = json.loads(farm(repo_root, "engines", "--op", "conv_fprop", "--json", check=True).stdout)
    assert conv and all("conv_fprop" in e["ops"] for e in conv) and {"cpu.conv.fft", "sim.vendor"} <= {e["name"] for e in conv}
    bad = farm(repo_root, "engines", "--op", "gemm")
    assert bad.returncode == 2 and "unknown op 'gemm'" in bad.stderr and "Traceback" not in bad.stderr
    # a known op no engine serves (no built-in engine runs attention backward): said, not an empty table
    none = farm(repo_root, "engines", "--op", "sdpa_bwd", check=True)
    assert "no engine serves sdpa_bwd" in none.stdout


@pytest.mark.slow
def test_tune_example_json(repo_root, tmp_path):
    proc = farm(repo_root, "tune", "examples/cpu-quick.yaml", "--out", str(tmp_path / "o"), "--json", "--in-process",
                check=True)
    data = json.loads(proc.stdout)
    (worker,) = data["workers"]
    assert worker["properties"]["vendor"] == "cpu" and worker["signature"].startswith("cpu-")
    problems = data["signatures"][worker["signature"]]
    assert len(problems) >= 8
    for p in problems:
        assert p["winner"] is not None, p["error"]
        assert p["winner"]["label"] == p["results"][0]["engine_name"] + "[" + (
            ",".join(f"{k}={v}" for k, v in p["results"][0]["knobs"].items()) or "default") + "]"
        ranks = [r["rank"] for r in p["results"] if r["succeeded"]]
        assert ranks == list(range(len(ranks)))
        assert all(r["disposition"] for r in p["results"])


@pytest.mark.slow
def test_tune_tables_and_summary(repo_root, tmp_path):
    out = farm(repo_root, "tune", "examples/cpu-quick.yaml", "--out", str(tmp_path / "o"), "--in-process",
               check=True).stdout
    assert "[1/8] gemm-384" in out and "Summary: 8 problem(s)" in out
    assert "speed-up" in out and "decision" in out and "cpu.conv.im2col" in out
    assert "Outputs" in out and ".winners.parquet" in out and str(tmp_path / "o") in out


@pytest.mark.slow
def test_default_out_is_runs_workload_name(repo_root, tmp_path):
    import shutil

    shutil.copy(f"{repo_root}/examples/cpu-quick.yaml", tmp_path / "w.yaml")
    text = (tmp_path / "w.yaml").read_text().replace("name: cpu-quick", "name: tiny")
    (tmp_path / "w.yaml").write_text(text)
    env = dict(os.environ, PYTHONPATH=repo_root)
    proc = subprocess.run([sys.executable, "-m", "farm", "tune", "w.yaml", "--json", "--in-process"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["out"] == "runs/tiny"
    assert (tmp_path / "runs" / "tiny" / "job.json").exists()


def test_dry_run_measures_nothing(repo_root):
    out = farm(repo_root, "tune", "examples/cpu-quick.yaml", "--dry-run", "--json", check=True).stdout
    data = json.loads(out)
    rows = data["problems"]
    gemm = next(r for r in rows if r["name"] == "gemm-384")
    [estimate] = data["estimate"]  # the total, and (no history in a fresh checkout's runs/cpu-quick, or some) its time
    assert estimate["candidates"] == sum(len(r["candidates"]) for r in rows)
    assert "cpu.matmul.blocked[block_k=128]" in gemm["candidates"]
    assert "cpu.matmul.blas[order=transposed,threads=2]" in gemm["candidates"]


@pytest.mark.parametrize("text, fragments", [
    ("problems:\n  - op: matmul\n    tensors: {A: {dims: [4, 4]}, B: {dims: [5, 4]}}\n",
     ["bad.yaml:3", "problems[0].tensors.B.dims", "[5, 4]"]),
    ("problems:\n  - op: convolution\n    tensors: {X: [1]}\n", ["unknown op 'convolution'", "problems[0].op"]),
    ("autotune: {window: 1}\nproblems: [{op: matmul, tensors: {A: [2, 2], B: [2, 2]}}]\n",
     ["autotune.window", "must be >= 2", "(got 1)"]),
    ("engines: {sweep: {cpu.matmul.blas: {threads: [999]}}}\nproblems: [{op: matmul, tensors: {A: [2, 2], B: [2, 2]}}]\n",
     ["engines.sweep[cpu.matmul.blas].threads", "must be <= 256", "999"]),
])
def test_bad_workload_is_one_clear_line_not_a_traceback(repo_root, tmp_path, text, fragments):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = farm(repo_root, "tune", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error:")
    flat = " ".join(proc.stderr.split())
    for frag in fragments:
        assert frag in flat, (frag, proc.stderr)


def test_missing_workload_file(repo_root):
    proc = farm(repo_root, "tune", "no/such.yaml")
    assert proc.returncode == 2 and "no/such.yaml" in proc.stderr and "not found" in proc.stderr
