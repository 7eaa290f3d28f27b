"""farm tune decides and writes each override file once, its check (farm verify) included, and a first run on
local devices expands its problems only where they are tuned (issue 55)."""

from __future__ import annotations

import collections

import pytest
import functools

import farm.store.reduce as reduce_module
from farm.devices.device import cpu_device
from farm.fleet.local_run import run_local
from farm.fleet.options import FarmOptions
from farm.model.engine import default_engine_registry
from farm.model.workload import parse_workload
from farm.replay.verify import verify_for_job

WORKLOAD = {"name": "two", "autotune": {"max_iterations": 6, "confirm": {"budget_ms": 200}},
            "engines": {"include": ["cpu.matmul.blas", "cpu.matmul.einsum"]},
            "problems": [{"name": "a", "op": "matmul", "tensors": {"A": [32, 24], "B": [24, 16]}},
                         {"name": "b", "op": "matmul", "tensors": {"A": [16, 40], "B": [40, 8]}}]}


def test_each_override_file_is_written_once_though_the_check_wrote_rows(tmp_path, monkeypatch):
    writes: collections.Counter[str] = collections.Counter()
    real = reduce_module.write_overrides

    def counted(path, *args, **kw):
        writes[str(path)] += 1
        return real(path, *args, **kw)

    monkeypatch.setattr(reduce_module, "write_overrides", counted)
    registry = default_engine_registry()
    wl = parse_workload(WORKLOAD, registry=registry)
    report = run_local(wl, tmp_path / "run", cpu_device(), registry,
                       options=FarmOptions(verifier=functools.partial(verify_for_job, only_losers=True)))
    summary = report.summary
    assert summary.verified and len(summary.verified) == 2  # the check ran on both decisions and wrote its rows
    [path] = list((tmp_path / "run" / "overrides").glob("*.json"))
    assert writes == {str(path): 1}
    # the file holds the decisions the check saw: every entry records its check
    text = path.read_text()
    assert text.count('"verified"') >= 2


@pytest.mark.slow
def test_a_first_run_on_simulated_devices_expands_its_problems_on_the_workers_only(tmp_path, monkeypatch):
    """The driver used to expand every problem to learn that a first run has work (its results folder always
    exists: the writer makes it), before the workers expanded them again; a resume with nothing left still
    finds that out here, and starts no Ray instance."""
    import pytest

    pytest.importorskip("ray", reason="the farm needs ray[default]")
    import farm.fleet.on_ray.worker as worker_module
    from farm.devices.sim import SimConfig
    from farm.fleet.options import DeviceRequest, FarmOptions
    from farm.fleet.on_ray.cluster import run_farm

    calls: list[int] = []
    real = worker_module.expand_problems

    def counted(problems, *args, **kw):
        calls.append(len(problems))
        return real(problems, *args, **kw)

    monkeypatch.setattr(worker_module, "expand_problems", counted)  # this (the driver's) process only
    wl = parse_workload({"name": "sim", "autotune": {"strategy": "fixed_average", "timed_iterations": 2,
                                                     "confirm": False},
                         "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [64, 32], "B": [32, 16]}}]},
                        registry=default_engine_registry())
    sim = SimConfig.parse({"devices": [{"name": "Sim A", "count": 1}], "sleep": 0.0})
    first = run_farm(wl, tmp_path / "run", devices=DeviceRequest("sim", 1, sim), options=FarmOptions())
    assert first.workers_started and calls == []
    again = run_farm(wl, tmp_path / "run", devices=DeviceRequest("sim", 1, sim), options=FarmOptions())
    assert not again.workers_started and calls == [1]


def test_in_process_each_problem_is_expanded_once(tmp_path, monkeypatch):
    """The in-process executor discovers through the farm's planner on its one worker: each problem once."""
    import farm.fleet.on_ray.worker as worker_module

    expanded: list[int] = []
    real = worker_module.expand_problems

    def counted(problems, *args, **kw):
        expanded.extend(i for i, _ in problems)
        return real(problems, *args, **kw)

    monkeypatch.setattr(worker_module, "expand_problems", counted)
    registry = default_engine_registry()
    report = run_local(parse_workload(WORKLOAD, registry=registry), tmp_path / "run", cpu_device(), registry)
    assert sorted(expanded) == [0, 1] and all(o.winner is not None for o in report.outcomes)
