"""The user's path on a real Ray cluster: ray start --head, ray job submit -- python -m jobs.tune."""

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.store.override_files import load_overrides

pytest.importorskip("ray", reason="needs ray[default]")
RAY = Path(sys.executable).with_name("ray")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not RAY.exists(), reason=f"the ray command is not beside {sys.executable}")
def test_ray_job_submit_runs_jobs_tune(tmp_path, repo_root):
    duckdb = pytest.importorskip("duckdb")
    port, dash = free_port(), free_port()
    temp = Path("/tmp") / f"rayt{os.getpid()}"  # Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "PYTHONPATH"}
    # Ray's token authentication stays on; the cluster and the job client share a token of this test's
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    start = subprocess.run([str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                            "--num-cpus=2", f"--temp-dir={temp}", "--include-dashboard=true",
                            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--disable-usage-stats"],
                           env=env, capture_output=True, text=True, timeout=180)
    assert start.returncode == 0, start.stdout + start.stderr
    address = f"http://127.0.0.1:{dash}"
    out = tmp_path / "run"
    try:
        sub = subprocess.run([str(RAY), "job", "submit", "--address", address, "--working-dir", repo_root,
                              "--submission-id", f"tunefarm-test-{os.getpid()}", "--",
                              sys.executable, "-m", "jobs.tune", "examples/cpu-quick.yaml", "--out", str(out), "--json"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert sub.returncode == 0, sub.stdout[-3000:] + sub.stderr[-3000:]
        status = subprocess.run([str(RAY), "job", "status", "--address", address, f"tunefarm-test-{os.getpid()}"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert "succeeded" in (status.stdout + status.stderr).lower(), status.stdout + status.stderr
        # the job's own JSON report is in its logs
        report = json.loads(sub.stdout[sub.stdout.index("{"):sub.stdout.rindex("}") + 1])
        assert report["executor"] == "ray" and report["rows_written"] > 0
        files = list((out / "overrides").glob("*.json"))
        assert len(files) == 1 and files[0].stem == report["workers"][0]["signature"]
        assert len(load_overrides(files[0]).entries) == 8
        n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/results/**/*.parquet', hive_partitioning=true)").fetchall()[0][0]
        assert n == report["rows_written"]
        job = json.loads((out / "job.json").read_text())
        assert job["runs"][-1]["state"] == "finished" and job["settings"]["address"] != "local"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, capture_output=True, timeout=120)
