"""The cluster sequence of docs/usage.md, verbatim, on a real Ray head with token authentication on.

The bash block after ``<!-- run by tests/end_to_end/test_ray_job.py -->`` in docs/usage.md (activate the venv,
``RAY_AUTH_MODE=token``, ``ray start --head``, ``ray job submit -- python -m jobs.tune``, follow the
logs, the status, ``farm report``, stopping that head alone) runs as one script from the checkout, in a fresh
home folder (no Ray token yet, as on a new machine), with no other environment of ours, beside another Ray
instance (tests/conftest.py's bystander, which must outlive it).
"""

import json
import os
import re
import shutil
import socket
import subprocess

import pytest

from farm.fleet.on_ray.ray_instance import instance_processes, stop_instance
from farm.store.overrides.parsing import load_overrides
from tests.cli.test_docs_commands import RAY_JOB, REPO, blocks

pytestmark = pytest.mark.slow  # an end-to-end test of the farm: Ray, a cluster, the docs run whole

pytest.importorskip("ray", reason="needs ray[default]")


def _readme_cluster_block() -> str:
    (block,) = [b for b in blocks(REPO / "docs" / "usage.md") if b.marker == RAY_JOB]
    return block.text


def _busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_readme_cluster_sequence_runs_as_written(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    if not (REPO / ".venv" / "bin" / "activate").exists():
        pytest.skip("the sequence activates the Quick start's .venv, which this checkout does not have")
    busy = [p for p in (6379, 8265) if _busy(p)]
    if busy:
        pytest.skip(f"ports {busy} are taken here: `ray start --head` needs Ray's default ports")
    script = _readme_cluster_block()
    temp = re.search(r"--temp-dir=(\S+)", script).group(1)  # the head's own: the sequence stops it by this
    assert f"python -m jobs.stop_head {temp}" in script and "ray stop" not in script
    out = REPO / "runs" / "cluster"
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "FARM_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    env["HOME"] = str(tmp_path / "home")  # a new machine: no ~/.ray/auth_token yet
    (tmp_path / "home").mkdir()
    try:
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        text = proc.stdout + proc.stderr
        assert "AuthenticationError" not in text and "succeeded" in text.lower()
        assert (tmp_path / "home" / ".ray" / "auth_token").exists()  # token authentication was on
        job = json.loads((out / "job.json").read_text())
        run = job["runs"][-1]
        assert run["state"] == "finished" and job["settings"]["address"] != "local"  # the job joined the head
        files = list((out / "overrides").glob("*.json"))
        assert len(files) == 1 and len(load_overrides(files[0]).entries) == 8
        n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/results/**/*.parquet', hive_partitioning=true)"
                       ).fetchall()[0][0]
        assert n == run["rows_written"] > 0
        assert "winner vs default" in proc.stdout  # farm report of the job's results
        assert not instance_processes(temp)  # the sequence stopped its head
    finally:
        stop_instance(temp)  # the script ended early: its head, no other
        shutil.rmtree(out, ignore_errors=True)
