"""Reading and appending to a large override file: what a production reader pays to load it, and what a reduce or
a runtime tuner pays to add one entry to it.

    python benchmarks/override_file_bench.py [--entries 10000] [--repeats 5]

One v2 file of N matmul entries (every tensor's dims, strides and dtype given, hipDNN-style metadata). "load" is
``load_overrides(strict=False)`` (the Config policy's and the replay runtime's read), "append" a
``write_overrides`` of one new entry (the file read, the entry added, the file written to a temp file and renamed).
Min of the repeats, in ms. No target: compare side by side (``bench-vs.sh REV benchmarks/override_file_bench.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    from farm.model.problem import Problem
    from farm.store.overrides.parsing import load_overrides
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    meta = {"rank": 0, "min_time_ms": 0.041, "avg_time_ms": 0.043, "stddev_ms": 0.001, "iterations_run": 37,
            "mode": "standard", "strategy": "run_until_stable", "workspace_size": 0, "converged": True,
            "timestamp": "2026-12-02T00:00:00Z"}
    entries = [OverrideEntry.for_problem(Problem.create("matmul", {"A": [m, 64], "B": [64, 32]}), "cpu.matmul.blas",
                                         (), meta) for m in range(1, args.entries + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "overrides.json")
        write_overrides(path, entries, device=None, mode="replace")
        size_mb = os.path.getsize(path) / 2**20
        loads, appends = [], []
        for i in range(args.repeats):
            t = time.perf_counter()
            f = load_overrides(path, strict=False)
            loads.append(time.perf_counter() - t)
            new = OverrideEntry.for_problem(Problem.create("matmul", {"A": [7, 64], "B": [64, 33 + i]}),
                                            "cpu.matmul.blas", (), meta)
            t = time.perf_counter()
            write_overrides(path, [new], device=None)
            appends.append(time.perf_counter() - t)
        assert len(f.entries) >= args.entries
    print(f"{'entries':>8} {'file MB':>8} {'load ms':>8} {'append ms':>10}")
    print(f"{args.entries:>8,} {size_mb:>8.1f} {min(loads) * 1e3:>8.0f} {min(appends) * 1e3:>10.0f}")


if __name__ == "__main__":
    main()
