"""The simulated fleet across the nodes of a real multi-node Ray cluster (ray.cluster_utils.Cluster on this host).

    python benchmarks/fleet_nodes.py [--nodes 4] [--per-node 4] [--problems 48] [--sleep 200]

Each node carries ``--per-node`` simulated devices (a ``sim:<kind>`` resource, farm.fleet.on_ray.nodes); the driver runs
on the head, as ``ray job submit`` runs it. Side by side in one run, on the same workload:

* 1 device; 1 node x per-node devices; the same devices on one node; nodes x per-node devices: tuning time,
  speed-up and efficiency against 1 device (t1 / (N x tN)), so the cost of spreading over nodes shows beside the
  one-node figure;
* 1 node, a second joining when half the candidates have a result: wall time against the node alone (ideal:
  25 % less: the second half on twice the devices);
* 2 nodes, one removed when half the candidates have a result: wall time against the uninterrupted run;

every run's winners compared with the 1-device run's. Simulated devices sleep their simulated kernel time times
``--sleep``; what is left to measure is the farm: scheduling, streaming, Parquet, and here Ray across raylets.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from farm.devices.sim import SimConfig  # noqa: E402
from farm.fleet.options import DeviceRequest, FarmOptions  # noqa: E402
from farm.fleet.on_ray.cluster import run_farm  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from farm_sim_scaling import winners, workload  # noqa: E402

FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--per-node", type=int, default=4)
    ap.add_argument("--problems", type=int, default=48)
    ap.add_argument("--sleep", type=float, default=200.0, help="wall seconds slept per simulated second")
    args = ap.parse_args()
    wl = workload(args.problems)
    sim = SimConfig.parse({"devices": [{"name": "Sim GPU", "count": 1}], "noise": 0.0, "sleep": args.sleep})
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                           "_system_config": FAST_HEALTH})
    rows, base, base_winners = [], None, None

    def fleet(*sizes: int) -> list:
        for node in list(cluster.worker_nodes):
            cluster.remove_node(node, allow_graceful=False)
        nodes = [cluster.add_node(num_cpus=1, resources={"sim:Sim GPU": n}) for n in sizes]
        cluster.wait_for_nodes()
        return nodes

    def run(label: str, devices: int, event=None):
        fired = threading.Event()

        def progress(status) -> None:
            if event is not None and not fired.is_set() and status.total and status.finished >= status.total // 2:
                fired.set()
                event()  # in the driver's loop: Cluster.add_node sets signal handlers (main thread only)

        out = Path(tempfile.mkdtemp(prefix="fleet-nodes-")) / "run"
        t0 = time.perf_counter()
        report = run_farm(wl, f"file://{out}", devices=DeviceRequest("sim", 1, sim), address=cluster.address,
                          options=FarmOptions(reduce=False, keep_results=True, node_poll_s=0.5,
                                              progress_interval_s=0.1), progress=progress)
        wall = time.perf_counter() - t0
        nonlocal base, base_winners
        w = winners(report)
        if base is None:
            base, base_winners = report.tuning_s, w
        same = sum(w.get(k) == v for k, v in base_winners.items())
        nodes = len(report.nodes)
        lost = sum(n["state"] == "lost" for n in report.nodes)
        joined = sum(n["joined_s"] is not None for n in report.nodes)
        rows.append((label, devices, nodes, joined, lost, wall, report.tuning_s, report.total, report.rows_written,
                     f"{same}/{len(base_winners)}"))
        print(f"{label}: wall {wall:.1f} s, tuning {report.tuning_s:.1f} s", file=sys.stderr, flush=True)
        return wall, report.tuning_s

    n, k = args.nodes, args.per_node
    try:
        fleet(1)
        run("1 device", 1)
        fleet(k)
        alone = run(f"1 node x {k}", k)
        fleet(n * k)
        run(f"1 node x {n * k}", n * k)
        fleet(*[k] * n)
        run(f"{n} nodes x {k}", n * k)
        fleet(k)
        joined = run(f"1 node x {k}, a 2nd joins at 50 %", 2 * k,
                     lambda: cluster.add_node(num_cpus=1, resources={"sim:Sim GPU": k}, wait=False))
        fleet(k, k)
        both = run(f"2 nodes x {k}", 2 * k)
        first = list(cluster.worker_nodes)[0]
        lost = run(f"2 nodes x {k}, one removed at 50 %", 2 * k,
                   lambda: threading.Thread(target=cluster.remove_node, args=(first,),
                                            kwargs={"allow_graceful": False}, daemon=True).start())
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    print(f"{args.problems} problems, {rows[0][7]} candidates, sleep x{args.sleep:g}; a Ray Cluster on one host "
          f"({os.cpu_count()} CPUs): a head and worker nodes with their own raylets and object stores")
    print("| run | devices | nodes | joined | lost | wall s | tuning s | speed-up | efficiency | rows | winners as 1 "
          "device |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, devices, nodes, jn, ls, wall, t, _, rows_written, same in rows:
        print(f"| {label} | {devices} | {nodes} | {jn} | {ls} | {wall:.1f} | {t:.2f} | {base / t:.2f} | "
              f"{base / (devices * t):.2f} | {rows_written} | {same} |")
    print()
    print(f"a second node joining halfway: tuning {joined[1]:.1f} s against {alone[1]:.1f} s alone "
          f"({100 * (1 - joined[1] / alone[1]):.0f} % less; ideal 25 %: the second half on twice the devices, with no "
          f"start-up), wall {joined[0]:.1f} s against {alone[0]:.1f} s ({100 * (1 - joined[0] / alone[0]):.0f} % less)")
    print(f"a node removed halfway: tuning {lost[1]:.1f} s against {both[1]:.1f} s uninterrupted "
          f"({100 * (lost[1] / both[1] - 1):+.0f} %; ideal +50 %: the second half on half the devices), wall "
          f"{lost[0]:.1f} s against {both[0]:.1f} s ({100 * (lost[0] / both[0] - 1):+.0f} %)")


if __name__ == "__main__":
    main()
