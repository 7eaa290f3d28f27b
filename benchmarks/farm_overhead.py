"""Farm overhead per candidate: near-zero-cost simulated candidates through the whole Ray farm.

    python benchmarks/farm_overhead.py                     # 10,000 candidates over 2 simulated devices
    python benchmarks/farm_overhead.py --devices 4 --problems 50

Every candidate goes the full way: scheduled, measured by a device worker (one
timed run of a simulated kernel that costs ~5 us of virtual time and no wall
time), streamed to the driver, written to Parquet. Overhead per candidate is
(wall time - startup) / candidates, where startup is Ray plus the workers
starting. Target on a 2-core machine: <= 1 ms per candidate, Parquet written.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.fleet.options import DeviceRequest, FarmOptions  # noqa: E402
from farm.fleet.on_ray.cluster import run_farm  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402
from farm.store.dataset import ResultsDataset  # noqa: E402
from farm.devices.sim import SimConfig  # noqa: E402
from tests.fakes import SIM_GEMM_SWEEP  # noqa: E402
from farm.model.workload import parse_workload  # noqa: E402


def workload(problems: int, confirm: bool = True):
    return parse_workload({
        "name": "overhead",
        "autotune": {"strategy": "single_shot", "warmup_iterations": 0, "check": "off", "confirm": confirm},
        "engines": {"include": ["sim.gemm"], "sweep": {"sim.gemm": SIM_GEMM_SWEEP}},
        "problems": [{"name": f"p{i}", "op": "matmul", "tensors": {"A": [8, 8 + i], "B": [8 + i, 8]}}
                     for i in range(problems)],
    }, registry=default_engine_registry())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=100, help="100 candidates each (default 100 -> 10,000)")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--no-confirm", action="store_true",
                    help="without the confirmation stage (a task of paired rounds per problem after its candidates)")
    args = ap.parse_args()
    wl = workload(args.problems, confirm=not args.no_confirm)
    sim = SimConfig.parse({"devices": [{"name": "Sim GPU", "count": args.devices}], "noise": 0.0, "sleep": 0.0})
    out = Path(tempfile.mkdtemp(prefix="farm-overhead-")) / "run"
    t0 = time.perf_counter()
    report = run_farm(wl, out, devices=DeviceRequest("sim", args.devices, sim),
                      options=FarmOptions(shard_size=1000, reduce=False))
    wall = time.perf_counter() - t0
    startup = wall - report.tuning_s
    rows = ResultsDataset(out / "results").table(["candidate_key"]).num_rows
    n = report.total
    per = report.tuning_s / n * 1e3
    print(f"{'candidates':>10} {'devices':>7} {'rows in Parquet':>15} {'wall s':>7} {'startup s':>9} "
          f"{'tuning s':>8} {'ms/candidate':>12} {'candidates/s':>12} {'target':>10}")
    print(f"{n:>10,} {args.devices:>7} {rows:>15,} {wall:>7.2f} {startup:>9.2f} {report.tuning_s:>8.2f} "
          f"{per:>12.3f} {n / report.tuning_s:>12,.0f} {'<= 1 ms':>10}")


if __name__ == "__main__":
    main()
