"""A driver killed at every phase of a job, then resumed, writes the override files of an uninterrupted run.

Simulated devices give deterministic times, so "the same winners" is exact. Two signatures with one
device each and shards of 40 candidates: every matmul is measured in several sessions, then confirmed
in one stage (a kill can cut that stage short), and the reduce writes two files (a kill can land between them). The drivers connect to
one Ray cluster (`ray start --head`, token auth on) that outlives them, as on a real head node: a
killed driver takes its workers with it, never the cluster.
"""

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from farm.fleet.on_ray.ray_instance import stop_instance
from farm.store.overrides.parsing import load_overrides
from farm.store.dataset import ResultsDataset
from tests.fakes import SIM_GEMM_SWEEP

pytestmark = pytest.mark.slow  # an end-to-end test of the farm: Ray, a cluster, the docs run whole

pytest.importorskip("ray", reason="the farm needs ray[default]")

WORKLOAD = {
    "name": "resume",
    "autotune": {"strategy": "fixed_average", "timed_iterations": 3},
    "engines": {"sweep": {"sim.gemm": SIM_GEMM_SWEEP}},
    "problems": [{"name": f"mm{i}", "op": "matmul", "tensors": {"A": [128 * (i + 1), 512], "B": [512, 256]}}
                 for i in range(2)]
                + [{"name": "norm", "op": "rmsnorm", "tensors": {"X": [64, 4096], "scale": [4096]}}],
}
SIM = {"devices": [{"name": "Sim A", "count": 1}, {"name": "Sim B", "count": 1, "speed": 2.0}], "noise": 0.005}
PHASES = ("start", "mid-run", "confirm", "reduce")


RAY = Path(sys.executable).with_name("ray")


@pytest.fixture(scope="module")
def cluster(repo_root):
    if not RAY.exists():
        pytest.skip(f"the ray command is not beside {sys.executable}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=repo_root, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    temp = f"/tmp/rayr{os.getpid()}"  # Ray's socket paths must stay short
    start = subprocess.run([str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                            "--num-cpus=2", f"--temp-dir={temp}", "--include-dashboard=false",
                            "--disable-usage-stats"], env=env, capture_output=True, text=True, timeout=180)
    assert start.returncode == 0, start.stdout + start.stderr
    try:
        yield env, f"127.0.0.1:{port}"
    finally:
        stop_instance(temp)  # this head alone (`ray stop` would stop every Ray here)


@pytest.fixture(scope="module")
def job(tmp_path_factory, repo_root, cluster):
    env, address = cluster
    d = tmp_path_factory.mktemp("resume")
    (d / "w.yaml").write_text(yaml.safe_dump(WORKLOAD))
    (d / "sim.yaml").write_text(yaml.safe_dump(SIM))
    args = ["tune", str(d / "w.yaml"), "--devices", f"sim:{d / 'sim.yaml'}", "--shard-size", "40", "--json",
            "--address", address]

    def run(out, phase=None):
        head = [sys.executable, os.path.join(repo_root, "tests", "kill_driver.py"), phase] if phase else \
            [sys.executable, "-m", "farm"]
        return subprocess.run(head + args + ["--out", str(out)], env=env, cwd=repo_root, capture_output=True,
                              text=True, timeout=300, start_new_session=True)

    clean = run(d / "clean")
    assert clean.returncode == 0, clean.stderr[-3000:]
    return d, run


def entries(out):
    files = sorted((out / "overrides").glob("*.json"))
    return {f.name: [(e.op, e.engine_name, e.knobs, json.dumps([t.dims for t in e.tensors])) for e in load_overrides(f).entries]
            for f in files}


def main_rows(out):
    t = ResultsDataset(out / "results").table(["device_signature", "problem_name", "candidate_key", "round"])
    return [r for r in t.to_pylist() if r["round"] == "main"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_driver_killed_then_resumed_writes_the_uninterrupted_winners(job, phase):
    d, run = job
    out = d / phase
    killed = run(out, phase)
    assert killed.returncode == -9, f"the driver was not killed at {phase}: {killed.stderr[-2000:]}"
    record = json.loads((out / "job.json").read_text())
    assert record["runs"][-1]["state"] == "running"  # killed: nobody recorded an end
    if phase == "reduce":
        assert len(list((out / "overrides").glob("*.json"))) == 1  # killed between the two files
    before = {(r["device_signature"], r["problem_name"], r["candidate_key"]) for r in main_rows(out)}
    assert (phase == "start") == (not before)
    resumed = run(out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # only what was missing is measured (confirmation stages aside)
    assert json.loads(resumed.stdout)["candidates"] == len(main_rows(d / "clean")) - len(before)
    assert entries(out) == entries(d / "clean") and entries(out)
    keys = [(r["device_signature"], r["problem_name"], r["candidate_key"]) for r in main_rows(out)]
    assert len(keys) == len(set(keys)) == len(main_rows(d / "clean"))  # every candidate once in the main round
    record = json.loads((out / "job.json").read_text())
    assert [r["state"] for r in record["runs"]] == ["running", "finished"]
