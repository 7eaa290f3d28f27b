"""``farm diff`` of two large override files: the wall time a person waits for the table.

    python benchmarks/diff_bench.py [--entries 100000]

Two v2 files of N matmul entries each for this machine's CPU device, every winner changed (the worst case for the
table), then ``farm diff A B`` in a subprocess, its output to a file (``COLUMNS=100``). No target: compare side by
side (``bench-vs.sh REV benchmarks/diff_bench.py``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=100_000)
    args = ap.parse_args()

    from farm.devices.device import cpu_device
    from farm.model.problem import Problem
    from farm.store.overrides.files import write_overrides
    from farm.store.overrides.entries import OverrideEntry

    dev = cpu_device()
    device = {"signature": dev.signature, "properties": dev.properties.to_dict()}
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name, engine, ms in (("a.json", "cpu.matmul.blas", 1.0), ("b.json", "cpu.matmul.einsum", 1.1)):
            meta = {"rank": 0, "median_time_ms": ms, "selection": {"rule": "fastest", "why": ""}}
            entries = [OverrideEntry.for_problem(Problem.create("matmul", {"A": [m, 16 + m % 7], "B": [16 + m % 7, 8]}),
                                                 engine, (), dict(meta, problem_name=f"p{m}"))
                       for m in range(1, args.entries + 1)]
            paths.append(os.path.join(tmp, name))
            write_overrides(paths[-1], entries, device=device, mode="replace")
        size = os.path.getsize(paths[0]) / 2**20
        env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT)), COLUMNS="100")
        with open(os.path.join(tmp, "out.txt"), "w") as out:
            t = time.perf_counter()
            rc = subprocess.run([sys.executable, "-m", "farm", "diff", *paths], env=env, stdout=out,
                                stderr=subprocess.STDOUT).returncode
            wall = time.perf_counter() - t
        lines = sum(1 for _ in open(os.path.join(tmp, "out.txt")))
    print(f"{'entries':>8} {'file MB':>8} {'diff s':>7} {'lines':>7} {'rc':>3}")
    print(f"{args.entries:>8,} {size:>8.1f} {wall:>7.1f} {lines:>7,} {rc:>3}")


if __name__ == "__main__":
    main()
