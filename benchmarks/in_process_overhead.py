"""farm tune --in-process's overhead per candidate: near-zero-cost simulated candidates through the in-process
executor (discovery, the scheduler and driver, the worker's task thread, rows to Parquet, the reduce).

    python benchmarks/in_process_overhead.py                  # 2,000 candidates (20 problems x 100)
    python benchmarks/in_process_overhead.py --problems 50

The workload is benchmarks/farm_overhead.py's (each candidate one timed run of a simulated kernel costing ~5 us
of virtual time and no wall time); the figure is the run's wall time over its candidates, the reduce included.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from farm_overhead import workload  # noqa: E402
from farm.devices.open import open_device  # noqa: E402
from farm.devices.sim import SimConfig  # noqa: E402
from farm.fleet.local_run import run_local  # noqa: E402
from farm.model.engine import default_engine_registry  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=20, help="100 candidates each (default 20 -> 2,000)")
    ap.add_argument("--no-confirm", action="store_true", help="without the confirmation stage")
    args = ap.parse_args()
    wl = workload(args.problems, confirm=not args.no_confirm)
    sim = SimConfig.parse({"devices": [{"name": "Sim GPU", "count": 1}], "noise": 0.0, "sleep": 0.0})
    device = open_device("sim", 0, sim=sim)
    out = Path(tempfile.mkdtemp(prefix="farm-in-process-")) / "run"
    t0 = time.perf_counter()
    report = run_local(wl, out, device, default_engine_registry())
    wall = time.perf_counter() - t0
    n = sum(len(o.results) for o in report.outcomes)
    print(f"{'candidates':>10} {'rows written':>12} {'wall s':>7} {'ms/candidate':>12}")
    print(f"{n:>10,} {report.rows_written:>12,} {wall:>7.2f} {wall / n * 1e3:>12.3f}")


if __name__ == "__main__":
    main()
