"""The story and the Ray runs, end to end (farm tune as a user runs it, Ray clusters, the README's commands):
every test here is marked ``slow``, so ``pytest -m "not slow"`` is the edit loop over the per-stage folders."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    # a conftest's hook sees every collected item, not only this folder's
    for item in items:
        if Path(item.path).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)
