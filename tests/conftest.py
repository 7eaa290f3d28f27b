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
