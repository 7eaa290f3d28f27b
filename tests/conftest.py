"""Shared fixtures. Tests import helpers from tests/fakes.py, servers from tests/servers.py (the benchmarks too)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the suite runs from a checkout without an install, too
    sys.path.insert(0, ROOT)
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="session")
def repo_root() -> str:
    return ROOT


@pytest.fixture(scope="session")
def cpu():
    from farm.devices.device import cpu_device

    return cpu_device()


@pytest.fixture(scope="session")
def registry():
    from farm.model.engine import default_engine_registry

    return default_engine_registry()


@pytest.fixture
def replay_env(monkeypatch):
    """No replay or selection settings from the environment, and farm.ops caches empty before and after."""
    import farm.ops as ops

    for name in ("FARM_HEUR_CONFIG_PATH", "HIPDNN_HEUR_CONFIG_PATH", "FARM_HEUR_POLICY_ORDER", "FARM_TUNABLE_ENABLED",
                 "FARM_TUNABLE_TUNING", "FARM_TUNABLE_FILENAME"):
        monkeypatch.delenv(name, raising=False)
    ops.reset()
    yield monkeypatch
    ops.reset()


@pytest.fixture()
def s3_server(tmp_path):
    """A real S3-compatible endpoint: moto's server in a subprocess (skips when moto is not installed)."""
    pytest.importorskip("moto", reason="the S3 test needs moto[server] (pip install 'tunefarm[dev]')")
    from servers import moto_server

    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture()
def s3_bucket(s3_server, monkeypatch):
    """A bucket on moto's S3 server; returns (pyarrow S3FileSystem, URI query that reaches the server)."""
    import pyarrow.fs as pafs
    from servers import s3_query

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fs = pafs.S3FileSystem(endpoint_override=s3_server, scheme="http", region="us-east-1", allow_bucket_creation=True)
    fs.create_dir("tunefarm")
    return fs, s3_query(s3_server)


_RAY_DEFAULT_PORTS = {6379, 8265, 10001, 52365, 8076, 8077, 44217, 44227}


def _free_ports(n: int) -> list[int]:
    import socket

    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _RAY_DEFAULT_PORTS and port not in ports:
            ports.append(port)
    return ports


@pytest.fixture(scope="session", autouse=True)
def bystander_ray(request):
    """Someone else's Ray on this machine (a developer's cluster, another job's head), started before a suite that
    starts and stops Ray instances (one holding the end-to-end tests), with a temp dir and ports of its own. After
    the suite it must still be up: no test stops a Ray instance it did not start (issue 56)."""
    import subprocess
    from pathlib import Path

    ray = Path(sys.executable).with_name("ray")
    if not any(item.get_closest_marker("slow") for item in request.session.items) or not ray.exists() \
            or not Path("/proc").is_dir():
        yield None
        return
    from farm.fleet.on_ray.ray_instance import instance_processes, stop_instance

    _stop_orphaned_bystanders(stop_instance)
    temp = f"/tmp/rayb{os.getpid()}"  # Ray's socket paths must stay short
    owner = _own(temp)  # held while this suite runs: another suite never takes this bystander for an orphan
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    try:
        # a loaded machine's first start can time out (Ray's node startup): what it started is stopped, then once more
        for _ in range(2):
            p = _free_ports(9)
            try:
                start = subprocess.run(
                    [str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={p[0]}", "--num-cpus=0",
                     f"--temp-dir={temp}", "--include-dashboard=false", f"--dashboard-port={p[1]}",
                     f"--ray-client-server-port={p[2]}", f"--dashboard-agent-listen-port={p[3]}",
                     f"--dashboard-agent-grpc-port={p[4]}", f"--metrics-export-port={p[5]}",
                     f"--runtime-env-agent-port={p[6]}", f"--node-manager-port={p[7]}", f"--object-manager-port={p[8]}",
                     "--disable-usage-stats"], env=env, capture_output=True, text=True, timeout=300)
                ok, said = start.returncode == 0, start.stdout + start.stderr
            except subprocess.TimeoutExpired as exc:
                ok, said = False, f"ray start did not return within {exc.timeout:.0f} s"
            if ok:
                break
            stop_instance(temp)
        assert ok, "the bystander Ray did not start (twice; what it started is stopped):\n" + said
        before = [pid for pid in instance_processes(temp)  # its GCS and raylet: the instance is up while they are
                  if Path(f"/proc/{pid}/comm").read_text().strip() in ("gcs_server", "raylet")]
        assert len(before) == 2, f"the bystander Ray's GCS and raylet are not found by its temp dir {temp}: {before}"
        yield temp
        gone = [pid for pid in before if not Path(f"/proc/{pid}").exists()]
        import socket

        with socket.socket() as s:
            answers = s.connect_ex(("127.0.0.1", p[0])) == 0
        assert not gone and answers, (f"a test stopped a Ray instance it did not start: of the bystander's "
                                      f"GCS server and raylet {gone} are gone; its GCS port {p[0]} "
                                      f"{'answers' if answers else 'does not answer'}")
    finally:
        stop_instance(temp)
        os.close(owner)
        Path(f"{temp}.owner").unlink(missing_ok=True)


def _own(temp: str) -> int:
    """Take ``temp``'s owner lock (``TEMP.owner``, an exclusive flock held by this process until it closes it or
    ends): what tells another suite that this bystander's suite is alive, in any process namespace sharing /tmp."""
    import fcntl

    fd = os.open(f"{temp}.owner", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _stop_orphaned_bystanders(stop_instance) -> None:
    """Stop the bystanders of suites that were killed: those whose owner lock nobody holds (its owner ended). A
    bystander is never judged by its name (a pid in a name may be another namespace's, or reused) nor stopped
    while its owner lock is held; one without an owner file is not this code's to stop."""
    import fcntl
    from pathlib import Path

    for lock in Path("/tmp").glob("rayb[0-9]*.owner"):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its suite is running
            os.close(fd)
            continue
        try:
            stop_instance(str(lock)[: -len(".owner")], grace_s=2.0)
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
