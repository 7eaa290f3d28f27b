"""A fleet that comes and goes, on a real multi-node Ray cluster (ray.cluster_utils.Cluster: a head and worker
nodes with their own raylets and object stores, on this host). Simulated devices live on nodes (a ``sim:<kind>``
resource per node, farm.fleet.on_ray.nodes); the driver runs on the head as ``ray job submit`` runs it; the workers write
their results parts to a shared folder (a ``file://`` URI) as they measure. Each case is checked against an
uninterrupted run: the same rows (none lost, none twice) and the same winners."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from farm.devices.sim import SimConfig  # noqa: E402
from farm.fleet.options import DeviceRequest, FarmOptions  # noqa: E402
from farm.fleet.on_ray.cluster import run_farm  # noqa: E402
from farm.fleet.job import WAITING_EXIT  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402
from farm.model.workload import parse_workload  # noqa: E402
from farm.store.dataset import ResultsDataset  # noqa: E402

pytestmark = pytest.mark.slow  # an end-to-end test of the farm: Ray, a cluster, the docs run whole

PROBLEMS = 12
# three kinds of simulated device; a node carries devices of one kind (its resource says how many)
SIM = SimConfig.parse({"devices": [{"name": "Sim A", "speed": 1.0}, {"name": "Sim B", "speed": 1.6},
                                   {"name": "Sim C", "speed": 0.7}], "noise": 0.0, "sleep": 25})
# fast failure detection for the test (Ray's default notices a dead raylet in about 15-30 s)
FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 300, "health_check_failure_threshold": 3}


def workload():
    return parse_workload({
        "name": "fleet",
        "autotune": {"strategy": "fixed_average", "max_iterations": 3, "warmup_iterations": 1, "check": "off",
                     "confirm": {"sample_ms": 0.02}},
        "engines": {"include": ["sim.gemm"], "sweep": {"sim.gemm": {"block": [32, 64, 128, 256], "stages": [2, 3, 4],
                                                                    "split_k": [1, 2]}}},
        "problems": [{"name": f"p{i}", "op": "matmul", "tensors": {"A": [256 + 32 * i, 512], "B": [512, 256]}}
                     for i in range(PROBLEMS)],
    }, registry=default_engine_registry())


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                     "_system_config": FAST_HEALTH})
    yield c
    if ray.is_initialized():
        ray.shutdown()
    c.shutdown()


def fleet(cluster, *kinds):
    """The cluster's worker nodes become one per kind given (2 devices each), the head carrying none."""
    for node in list(cluster.worker_nodes):
        cluster.remove_node(node, allow_graceful=False)
    nodes = [cluster.add_node(num_cpus=1, resources={f"sim:{k}": 2}) for k in kinds]
    cluster.wait_for_nodes()
    return nodes


def kill_raylet(node):
    """kill -9 of the node's raylet (its workers die with it; the GCS finds the node dead)."""
    from ray._private import ray_constants

    os.kill(node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid, signal.SIGKILL)


def tune(cluster, out, *, when=None, at=40, sim=SIM, **options):
    """run_farm on the cluster into the shared folder ``out``; ``when()`` runs once ``at`` candidates have a result,
    in the driver's loop, which it holds up meanwhile as a busy driver would be (Cluster.add_node sets signal
    handlers: main thread only; and the event surely lands mid-job)."""
    fired = threading.Event()

    def progress(status):
        if when is not None and not fired.is_set() and status.finished >= at:
            fired.set()
            when()

    t0 = time.perf_counter()
    report = run_farm(workload(), f"file://{out}", devices=DeviceRequest("sim", 1, sim), address=cluster.address,
                      options=FarmOptions(node_poll_s=0.25, progress_interval_s=0.05, **options), progress=progress)
    report.wall_s = time.perf_counter() - t0
    assert when is None or fired.is_set(), "the job ended before the event it was to see"
    return report


def rows(out):
    cols = ["device_signature", "problem_name", "candidate_key", "round", "call", "succeeded", "node_id", "session_id"]
    return ResultsDataset(out / "results").table(cols).to_pylist()


def per_signature(table):
    """signature -> (rows, main-round (problem, candidate) pairs, confirm rows)."""
    out = {}
    for sig in {r["device_signature"] for r in table}:
        mine = [r for r in table if r["device_signature"] == sig]
        main = [(r["problem_name"], r["candidate_key"]) for r in mine if r["round"] == "main"]
        out[sig] = (len(mine), collections.Counter(main), sum(r["round"] == "confirm" for r in mine))
    return out


def winners(report, sig):
    return {k: w.label for (s, k), w in report.summary.decisions.winners.items() if s == sig}


def signature_of(kind):
    from farm.devices.sim import sim_properties

    return sim_properties(next(g for g in SIM.groups if g.name == kind), 0).signature


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    """The reference: every kind on its own node, nothing lost or added."""
    out = tmp_path_factory.mktemp("reference")
    fleet(cluster, "Sim A", "Sim B", "Sim C")
    report = tune(cluster, out)
    table = per_signature(rows(out))
    assert set(table) == {signature_of(k) for k in ("Sim A", "Sim B", "Sim C")}
    for sig, (n, main, confirm) in table.items():
        assert all(v == 1 for v in main.values()) and len(main) == PROBLEMS * 24 and confirm > 0
        assert len(winners(report, sig)) == PROBLEMS
    return report, table


def test_a_node_removed_mid_job_its_tasks_run_on_the_surviving_node_of_its_kind(cluster, uninterrupted, tmp_path):
    reference, ref_rows = uninterrupted
    a1, a2 = fleet(cluster, "Sim A", "Sim A")
    sig = signature_of("Sim A")
    slower = dataclasses.replace(SIM, sleep=4 * SIM.sleep)  # the loss lands well before the end, even on a busy host
    report = tune(cluster, tmp_path, sim=slower,
                  when=lambda: cluster.remove_node(a1, allow_graceful=False))
    got = per_signature(rows(tmp_path))
    # the same rows as the uninterrupted run: every candidate once, the same confirmation stages, no failure
    assert got[sig] == ref_rows[sig] and report.counts == {"succeeded": ref_rows[sig][0]}
    assert winners(report, sig) == winners(reference, sig)
    assert sum(s.restarts for s in report.statuses) == 0  # a node loss, charged to no candidate (no crash path)
    nodes = {n["node_id"]: n for n in report.nodes}
    assert nodes[a1.node_id]["state"] == "lost" and nodes[a1.node_id]["lost_s"] is not None
    assert nodes[a2.node_id]["state"] == "active" and not report.waiting
    by_node = collections.Counter(r["node_id"] for r in rows(tmp_path))
    assert by_node[a1.node_id] > 0 and by_node[a2.node_id] > by_node[a1.node_id]
    record = json.loads((tmp_path / "job.json").read_text())
    assert record["runs"][-1]["state"] == "finished" and len(record["runs"][-1]["nodes"]) == 2


def test_the_only_node_of_a_kind_killed_the_job_waits_then_ends_and_a_resume_completes_it(cluster, uninterrupted,
                                                                                         tmp_path):
    from farm.analysis.report import build_report

    reference, ref_rows = uninterrupted
    a, b = fleet(cluster, "Sim A", "Sim B")
    sig_a, sig_b = signature_of("Sim A"), signature_of("Sim B")
    report = tune(cluster, tmp_path, when=lambda: kill_raylet(b), at=30, device_wait_s=1.5)  # it ended: bounded
    # Sim A finished whole; Sim B's unfinished problems wait for a device of that kind
    assert set(report.waiting) == {sig_b} and report.waiting[sig_b]
    assert report.summary.exit_code() == WAITING_EXIT
    assert winners(report, sig_a) == winners(reference, sig_a)
    waiting_keys = {wp.problem.key for wp in workload().problems if wp.name in report.waiting[sig_b]}
    assert not waiting_keys & set(winners(report, sig_b))  # nothing decided from a problem's partial rows
    overrides = json.loads((tmp_path / "overrides" / f"{sig_b}.json").read_text()) \
        if (tmp_path / "overrides" / f"{sig_b}.json").exists() else {"engine_overrides": []}
    assert len(overrides.get("engine_overrides", [])) == PROBLEMS - len(report.waiting[sig_b])
    run = json.loads((tmp_path / "job.json").read_text())["runs"][-1]
    assert run["state"] == "waiting" and run["waiting_for_devices"][sig_b]["problems"] == report.waiting[sig_b]
    seen = build_report(tmp_path)
    assert seen.waiting == report.waiting
    assert {n.node_id: n.state for n in seen.nodes} == {a.node_id: "active", b.node_id: "lost"}
    # a node of that kind is back: the same command resumes and measures only what is missing
    cluster.remove_node(b, allow_graceful=False)
    fleet_b = cluster.add_node(num_cpus=1, resources={"sim:Sim B": 2})
    cluster.wait_for_nodes()
    again = tune(cluster, tmp_path)
    assert not again.waiting and again.summary.exit_code() == 0
    got = per_signature(rows(tmp_path))
    assert got == {s: ref_rows[s] for s in (sig_a, sig_b)}  # no row lost, none twice, on either kind
    assert winners(again, sig_b) == winners(reference, sig_b) and winners(again, sig_a) == winners(reference, sig_a)
    assert {n["node_id"] for n in again.nodes} >= {fleet_b.node_id}


def test_a_node_that_joins_midway_takes_work_at_once(cluster, uninterrupted, tmp_path):
    """The late node measures candidates of the running job, no row is lost or repeated, the winners are the
    uninterrupted run's. How much sooner the job ends is a figure of benchmarks/fleet_nodes.py, not asserted here:
    a wall time depends on the machine's load (issue 64)."""
    reference, ref_rows = uninterrupted
    sig = signature_of("Sim A")
    fleet(cluster, "Sim A")
    slower = dataclasses.replace(SIM, sleep=30 * SIM.sleep)  # long enough for a node's start to pay off
    joined = []
    report = tune(cluster, tmp_path / "joined", at=30, sim=slower,
                  when=lambda: joined.append(cluster.add_node(num_cpus=1, resources={"sim:Sim A": 2}, wait=False)))
    late = joined[0].node_id
    by_node = collections.Counter(r["node_id"] for r in rows(tmp_path / "joined"))
    assert by_node[late] > 0 and len(by_node) == 2  # it measured candidates, beside the first node
    assert [n["joined_s"] is not None for n in report.nodes if n["node_id"] == late] == [True]
    assert per_signature(rows(tmp_path / "joined"))[sig] == ref_rows[sig]
    assert winners(report, sig) == winners(reference, sig)


def test_two_kinds_on_two_nodes_and_a_third_kind_joining_midway_gets_its_whole_workload(cluster, uninterrupted,
                                                                                         tmp_path):
    reference, ref_rows = uninterrupted
    fleet(cluster, "Sim A", "Sim B")
    report = tune(cluster, tmp_path, at=30,
                  when=lambda: cluster.add_node(num_cpus=1, resources={"sim:Sim C": 2}))
    sigs = {signature_of(k) for k in ("Sim A", "Sim B", "Sim C")}
    assert per_signature(rows(tmp_path)) == {s: ref_rows[s] for s in sigs}
    for sig in sigs:
        assert winners(report, sig) == winners(reference, sig)
        entries = json.loads((tmp_path / "overrides" / f"{sig}.json").read_text())["engine_overrides"]
        assert len(entries) == PROBLEMS  # one override file per kind, every problem in it
    assert report.summary.exit_code() == 0


def test_max_devices_caps_the_workers_now_and_as_nodes_join(cluster, tmp_path):
    fleet(cluster, "Sim A", "Sim A")
    report = tune(cluster, tmp_path, max_devices=3)
    assert len(report.workers) == 3 and sum(len(n["workers"]) for n in report.nodes) == 3
    # devices no node declares (sim:N, cpu:N) are capped too: the first N of them
    unplaced = SimConfig.parse({"devices": [{"name": "Sim Z", "count": 4}], "noise": 0.0, "sleep": 0})
    report = tune(cluster, tmp_path / "unplaced", sim=unplaced, max_devices=2)
    assert [w.name for w in report.workers] == ["sim:0", "sim:1"]


def test_a_candidate_that_crashes_its_node_pinned_worker_is_quarantined_and_the_node_stays(cluster, tmp_path):
    # a crash is not a node loss: the worker restarts on its node (it answers again), the loss is charged to the
    # candidate (twice: a crashed row), and the node keeps working
    key = workload().problems[0].problem.key
    crashing = SimConfig.parse({"devices": [{"name": "Sim A"}], "noise": 0.02, "sleep": 25, "faults": [
        {"kind": "crash", "engine": "sim.gemm", "knobs": {"block": 64, "stages": 3, "split_k": 2}, "problem": key}]})
    (node,) = fleet(cluster, "Sim A")
    report = tune(cluster, tmp_path, sim=crashing, node_grace_s=60)
    table = rows(tmp_path)
    failed = [(r["problem_name"], r["candidate_key"]) for r in table if not r["succeeded"]]
    assert len(failed) == 1 and failed[0][0] == "p0" and report.counts.get("crashed") == 1
    main = collections.Counter((r["problem_name"], r["candidate_key"]) for r in table if r["round"] == "main")
    assert len(main) == PROBLEMS * 24 and set(main.values()) == {1}
    assert [n["state"] for n in report.nodes] == ["active"] and report.summary.exit_code() == 0
    assert sum(s.restarts for s in report.statuses) >= 2
