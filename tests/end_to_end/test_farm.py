"""The Ray farm on simulated devices: many devices, two signatures, faults, a killed driver."""

import collections
import json
import os
import subprocess
import sys

import pytest

from farm.fleet.options import DeviceRequest, FarmOptions
from farm.fleet.on_ray.cluster import run_farm
from farm.model.engine import default_engine_registry
from farm.store.overrides.parsing import load_overrides
from farm.store.dataset import ResultsDataset
from farm.devices.sim import SimConfig
from farm.model.workload import parse_workload
from tests.fakes import SIM_GEMM_SWEEP

pytestmark = pytest.mark.slow  # an end-to-end test of the farm: Ray, a cluster, the docs run whole

ray = pytest.importorskip("ray", reason="the farm needs ray[default]")

SWEEP = {"sim.gemm": SIM_GEMM_SWEEP,
         "sim.conv": {"tile": [32, 64, 128], "layout": ["nchw", "nhwc"]}}


def workload_dict(n_mm=5, sweep=SWEEP):
    return {
        "name": "farmtest",
        "autotune": {"strategy": "fixed_average", "timed_iterations": 3},
        "engines": {"sweep": sweep},
        "problems": [{"name": f"mm{i}", "op": "matmul", "tensors": {"A": [128 * (i + 1), 512], "B": [512, 256]}}
                     for i in range(n_mm)]
                    + [{"name": "conv", "op": "conv_fprop", "tensors": {"X": [8, 64, 28, 28], "W": [64, 64, 3, 3]},
                        "criteria": {"pad_h": 1, "pad_w": 1}},
                       {"name": "norm", "op": "rmsnorm", "tensors": {"X": [64, 4096], "scale": [4096]}}],
    }


@pytest.fixture(scope="module")
def local_ray():
    from farm.fleet.on_ray.cluster import _init_ray

    if not ray.is_initialized():
        _init_ray(None, DeviceRequest("sim"))
    yield
    ray.shutdown()


def rows(out):
    cols = ["device_signature", "problem_name", "candidate_key", "round", "disposition", "engine_name", "error",
            "actor_id", "session_id"]
    return ResultsDataset(out / "results").table(cols).to_pylist()


def test_eight_devices_over_two_signatures(tmp_path, local_ray):
    wl = parse_workload(workload_dict(), registry=default_engine_registry())
    sim = SimConfig.parse({"devices": [{"name": "Sim A", "count": 4, "speed": 1.0},
                                       {"name": "Sim B", "count": 4, "speed": 2.5}], "sleep": 0.05})
    out = tmp_path / "run"
    report = run_farm(wl, out, devices=DeviceRequest("sim", 8, sim), options=FarmOptions(shard_size=40))
    sigs = sorted({w.signature for w in report.workers})
    assert len(report.workers) == 8 and len(sigs) == 2
    # one override file per signature, one entry per problem
    files = sorted(p.name for p in (out / "overrides").glob("*.json"))
    assert files == [f"{s}.json" for s in sigs]
    for s in sigs:
        assert len(load_overrides(out / "overrides" / f"{s}.json").entries) == len(wl.problems)
    # every candidate exactly one row per round; every expanded candidate measured on every signature
    data = rows(out)
    per = collections.Counter((r["device_signature"], r["problem_name"], r["candidate_key"], r["round"]) for r in data)
    assert max(per.values()) == 1
    main = collections.Counter((r["device_signature"], r["problem_name"]) for r in data if r["round"] == "main")
    assert main[(sigs[0], "mm0")] == 101 and main[(sigs[1], "mm0")] == 101  # vendor + 100 gemm configs
    assert main[(sigs[0], "conv")] == 1 + 6  # vendor + the conv sweep (3 x 2; its default is one of the six)
    # the 101-candidate problems were sharded (40), then confirmed together in one stage on one device
    # (which replaces the finalist round: the stage re-measures each session's leaders with the default)
    assert not [r for r in data if r["round"] == "finalist"]
    finals = [r for r in data if r["round"] == "confirm"]
    assert {f"mm{i}" for i in range(5)} <= {r["problem_name"] for r in finals}
    by_problem = collections.defaultdict(set)
    for r in finals:
        by_problem[(r["device_signature"], r["problem_name"])].add(r["session_id"])
    assert all(len(v) == 1 for v in by_problem.values())
    # work was spread over every device, each at the driver's priority (Ray would start them at niceness 15,
    # where anything else on a busy machine starves what they measure)
    assert all(st.candidates > 0 for st in report.statuses)
    assert {w.niceness for w in report.workers} == {os.nice(0)}
    assert report.counts == {"succeeded": len(data)} and report.rows_written == len(data)
    job = json.loads((out / "job.json").read_text())
    run = job["runs"][-1]
    assert run["state"] == "finished" and sorted(run["signatures"]) == sigs and len(run["devices"]) == 8
    assert run["counts"]["succeeded"] == len(data) and job["workload"]["digest"] == wl.digest


def test_crash_and_hang_leave_a_complete_job_with_the_right_failed_rows(tmp_path, local_ray):
    sweep = {"sim.gemm": {"block": [16, 32, 64], "stages": [1, 2]}}
    wl = parse_workload(workload_dict(3, sweep), registry=default_engine_registry())
    hang_problem = wl.problems[1].problem.key
    sim = SimConfig.parse({"devices": [{"name": "Sim A", "count": 2}], "faults": [
        {"kind": "crash", "engine": "sim.gemm", "knobs": {"block": 32, "stages": 2}},
        {"kind": "hang", "engine": "sim.gemm", "knobs": {"block": 16, "stages": 1}, "problem": hang_problem}]})
    out = tmp_path / "run"
    report = run_farm(wl, out, devices=DeviceRequest("sim", 2, sim), options=FarmOptions(candidate_timeout_s=2))
    data = rows(out)
    failed = sorted((r["problem_name"], r["disposition"], r["candidate_key"]) for r in data if r["disposition"] != "succeeded")
    crash_key = next(r["candidate_key"] for r in data if r["disposition"] == "crashed")
    hang_key = next(r["candidate_key"] for r in data if r["disposition"] == "timed_out")
    assert failed == sorted([("mm0", "crashed", crash_key), ("mm1", "crashed", crash_key), ("mm2", "crashed", crash_key),
                             ("mm1", "timed_out", hang_key)])
    assert '"block",32' in crash_key and '"stages",2' in crash_key and '"block",16' in hang_key
    crashed = [r for r in data if r["disposition"] == "crashed"]
    assert all("killed its worker 2 times; quarantined" in r["error"] for r in crashed)
    # every other candidate succeeded exactly once in the main round
    main = collections.Counter((r["problem_name"], r["candidate_key"]) for r in data if r["round"] == "main")
    assert max(main.values()) == 1 and len(main) == report.total
    assert sum(st.restarts for st in report.statuses) >= 3
    for p in wl.problems:  # the job completed: every problem has a winner
        assert load_overrides(next((out / "overrides").glob("*.json"))).match(p.problem) is not None


def test_invalid_workload_is_rejected_before_any_device_time(tmp_path, repo_root):
    (tmp_path / "bad.yaml").write_text("problems: [{op: matmul, tensors: {A: [4, 4], B: [5, 4]}}]\n")
    env = dict(os.environ, PYTHONPATH=repo_root)
    proc = subprocess.run([sys.executable, "-m", "farm", "tune", str(tmp_path / "bad.yaml"), "--devices", "sim:2",
                           "--out", str(tmp_path / "o")], env=env, cwd=repo_root, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "problems[0].tensors.B.dims" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()  # no job was started (no Ray, no device: how long it took is no test's)


def test_device_request_parsing(tmp_path):
    assert DeviceRequest.parse("auto").kind == "auto"
    assert DeviceRequest.parse("cpu:3").count == 3
    assert DeviceRequest.parse("sim:4").sim.device_count == 4
    (tmp_path / "s.yaml").write_text("devices: [{name: X, count: 2}, {name: Y, count: 3}]\n")
    assert DeviceRequest.parse(f"sim:{tmp_path / 's.yaml'}").count == 5
    from farm.errors import InputError

    for bad in ("tpu", "cpu:0", "cpu:x", "gpu:2"):
        with pytest.raises(InputError, match="--devices"):
            DeviceRequest.parse(bad)
    with pytest.raises(InputError, match="not found"):
        DeviceRequest.parse("sim:/nonexistent.yaml")


def test_every_worker_prepares_the_engines_its_tasks_use(monkeypatch):
    """Every worker prepares (starts compile pools) as it starts, before its device opens, and again
    at each task (idempotent); engines learn the worker's device kind."""
    from fakes import FakeEngine, registry_of

    import farm.fleet.on_ray.worker as cluster
    from farm.model.records import AutotuneConfig
    from farm.fleet.on_ray.worker import DeviceWorkerImpl
    from farm.fleet.tasks import Task

    prepared = []

    class Preparing(FakeEngine):
        def prepare(self, device_kind):
            prepared.append((self.name, device_kind))

    registry = registry_of(Preparing("jit"), FakeEngine("plain"))
    wl = parse_workload({"name": "p", "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [8, 4], "B": [4, 6]}}]},
                        registry=registry)
    opened = cluster._open

    def open_after_prepare(*args):
        assert prepared == [("jit", "cpu")], "the device opened before the engines were prepared"
        return opened(*args)

    monkeypatch.setattr(cluster, "_open", open_after_prepare)
    starting = DeviceWorkerImpl("cpu", 0, problems=wl.problems, registry=registry)
    monkeypatch.undo()
    assert prepared == [("jit", "cpu")] and starting.registry is registry
    prepared.clear()
    discovering, other = DeviceWorkerImpl("cpu", 0, registry=registry), DeviceWorkerImpl("cpu", 1, registry=registry)
    assert prepared == []  # no workload given: nothing to prepare
    cands = discovering.expand([(0, wl.problems[0])])[0]
    assert prepared == [("jit", "cpu")]
    task = Task(1, other.device.signature, 0, tuple(c.spec for c in cands))
    items = list(other.run(task, wl.problems[0], cands, AutotuneConfig(strategy="single_shot"), 0, 0.0))
    assert prepared == [("jit", "cpu")] * 2 and items[-1].error == ""
    prepared.clear()
    narrow = parse_workload({"name": "p", "engines": {"include": ["plain"]},
                             "problems": [{"name": "mm", "op": "matmul", "tensors": {"A": [8, 4], "B": [4, 6]}}]},
                            registry=registry)
    other.prepare(narrow.problems)
    assert prepared == []  # an engine the workload does not select is left alone


def test_a_lone_worker_that_dies_with_windows_left_to_discover_loses_no_problem(tmp_path, local_ray):
    """One device, 20 problems (three discovery windows): a candidate of the first kills the worker, perhaps with
    the next window's discovery queued behind its task; that window is asked again once the worker is back."""
    sweep = {"sim.gemm": {"block": [16, 32, 64], "stages": [1, 2]}}
    wl = parse_workload({**workload_dict(20, sweep), "autotune": {"strategy": "fixed_average", "timed_iterations": 2}},
                        registry=default_engine_registry())
    first = wl.problems[0].problem.key
    sim = SimConfig.parse({"devices": [{"name": "Sim A", "count": 1}], "sleep": 0.2, "faults": [
        {"kind": "crash", "engine": "sim.gemm", "knobs": {"block": 32, "stages": 2}, "problem": first}]})
    out = tmp_path / "run"
    report = run_farm(wl, out, devices=DeviceRequest("sim", 1, sim), options=FarmOptions(candidate_timeout_s=30))
    assert report.summary.missing == 0 and len(report.summary.decisions.winners) == len(wl.problems)
    crashed = [r for r in rows(out) if r["disposition"] == "crashed"]
    assert [r["problem_name"] for r in crashed] == ["mm0"]
