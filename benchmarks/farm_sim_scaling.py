"""The scheduler's own scaling: the same workload on 1, 2, 4, 8, 16 simulated devices through the Ray farm.

    python benchmarks/farm_sim_scaling.py [--devices 1,2,4,8,16] [--problems 48] [--sleep 20]
    python benchmarks/farm_sim_scaling.py --compile-ms 40 --build-ms 5 --setup-ms 20 [--cache host|worker]

Simulated devices compute nothing: each timed run sleeps its simulated kernel
time times --sleep, so a device is "busy" for a known wall time without using a
CPU core, and a 2-core machine can host 16 of them. What is left to measure is
the farm itself: scheduling, streaming results, writing Parquet. Reported per
device count: tuning time (workers ready to last result), candidates per
second, efficiency against 1 device (t1 / (N * tN)), the mean and lowest busy
fraction of the workers, and whether the winners match the 1-device run.

With ``--compile-ms`` each JIT kernel (a knob setting of sim.gemm; shared by every shape of a dtype, as
Triton's kernels are) costs that much wall time to compile, ``--build-ms`` each plan built (every candidate,
as cuDNN's plans), and ``--setup-ms`` each problem a worker builds plans for the first time: the work a
second device can repeat. ``--cache host`` shares compiled kernels
between the workers of the host (Triton's cache directory), ``worker`` gives each its own. The device time
of every run is split by phase (farm.tuner.phases) and printed below the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.fleet.options import DeviceRequest, FarmOptions  # noqa: E402
from farm.fleet.on_ray.cluster import run_farm  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402
from farm.devices.sim import SimConfig  # noqa: E402
from farm.model.workload import parse_workload  # noqa: E402
from farm.tuner.phases import PHASES  # noqa: E402


def workload(problems: int):
    return parse_workload({
        "name": "sim-scaling",
        # the stage's eager samples last 20 us of simulated time (4 ms slept at x200): 1 ms, a GPU's default, would
        # be 200 ms of wall time a sample here, so the stage would outweigh the main round 100 to 1, as it does
        # not on a GPU
        "autotune": {"strategy": "fixed_average", "max_iterations": 3, "warmup_iterations": 1, "check": "off",
                     "confirm": {"sample_ms": 0.02}},
        "engines": {"include": ["sim.gemm"], "sweep": {"sim.gemm": {"block": [32, 64, 128, 256], "stages": [2, 3, 4],
                                                                    "split_k": [1, 2]}}},
        "problems": [{"name": f"p{i}", "op": "matmul", "tensors": {"A": [256 + 32 * i, 512], "B": [512, 256]}}
                     for i in range(problems)],
    }, registry=default_engine_registry())


def winners(report) -> dict[str, str]:
    out = {}
    for (_, name), rs in report.results.items():
        ok = [r for r in rs if r.succeeded]
        if ok:
            best = min(ok, key=lambda r: r.median_ms)
            out[name] = f"{best.engine_name}{dict(best.knobs)}"
    return out


def cpu_ticks() -> tuple[float, float]:
    """(busy, total) jiffies of the host's CPUs so far (Linux /proc/stat; zeros elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default="1,2,4,8,16")
    ap.add_argument("--problems", type=int, default=48)
    ap.add_argument("--sleep", type=float, default=200.0, help="wall seconds slept per simulated second")
    ap.add_argument("--compile-ms", type=float, default=0.0, help="wall ms to compile one JIT kernel")
    ap.add_argument("--setup-ms", type=float, default=0.0, help="wall ms to set up a problem's plans, per worker")
    ap.add_argument("--build-ms", type=float, default=0.0, help="wall ms to build each candidate's plan")
    ap.add_argument("--cache", choices=("host", "worker"), default="host", help="who shares compiled kernels")
    args = ap.parse_args()
    wl = workload(args.problems)
    rows, base, base_winners, splits = [], None, None, []
    for n in (int(x) for x in args.devices.split(",")):
        sim = SimConfig.parse({"devices": [{"name": "Sim GPU", "count": n}], "noise": 0.0, "sleep": args.sleep,
                               "compile": {"ms": args.compile_ms, "build_ms": args.build_ms, "setup_ms": args.setup_ms,
                                           "cache": args.cache}})
        out = Path(tempfile.mkdtemp(prefix=f"sim-scaling-{n}-")) / "run"
        t0, (busy0, all0) = time.perf_counter(), cpu_ticks()
        report = run_farm(wl, out, devices=DeviceRequest("sim", n, sim), options=FarmOptions(reduce=False, keep_results=True))
        wall = time.perf_counter() - t0
        busy1, all1 = cpu_ticks()
        host_cpu = (busy1 - busy0) / (all1 - all0) if all1 > all0 else float("nan")
        busy = [s.busy_s / report.tuning_s for s in report.statuses]
        w = winners(report)
        if base is None:
            base, base_winners = report.tuning_s, w
        same = sum(w.get(k) == v for k, v in base_winners.items())
        rows.append((n, wall, report.tuning_s, report.total, base / (n * report.tuning_s), statistics.fmean(busy),
                     min(busy), f"{same}/{len(base_winners)}", host_cpu))
        splits.append((n, report.phases))
        print(f"{n} devices: tuning {report.tuning_s:.1f} s", file=sys.stderr, flush=True)
    print(f"{args.problems} problems, {rows[0][3]} candidates, sleep x{args.sleep:g}, compile {args.compile_ms:g} ms "
          f"a kernel, build {args.build_ms:g} ms a plan, setup {args.setup_ms:g} ms a problem, cache per {args.cache}")
    print(f"host: {os.cpu_count()} CPU(s); host CPU is the share of all of them busy during the run (the driver, "
          "Ray and every worker: a simulated device sleeps, its worker's Python does not)")
    print("| devices | wall s | tuning s | candidates/s | speed-up | efficiency | busy mean | busy min | host CPU "
          "| winners as 1 device |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, wall, t, total, eff, bmean, bmin, same, cpu in rows:
        print(f"| {n} | {wall:.1f} | {t:.2f} | {total / t:.0f} | {base / t:.2f} | {eff:.2f} | {100 * bmean:.0f} % | "
              f"{100 * bmin:.0f} % | {100 * cpu:.0f} % | {same} |")
    print()
    print("Device time by phase, all workers summed (s, and share):")
    print("| devices | " + " | ".join(PHASES) + " |")
    print("| --- |" + " --- |" * len(PHASES))
    for n, split in splits:
        whole = split.total or 1.0
        print(f"| {n} | " + " | ".join(f"{split.get(p):.1f} ({100 * split.get(p) / whole:.0f} %)" for p in PHASES) + " |")


if __name__ == "__main__":
    main()
