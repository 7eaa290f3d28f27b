"""Shared fixtures. Tests import helpers from tests/fakes.py."""

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
