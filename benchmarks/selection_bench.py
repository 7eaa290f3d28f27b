"""Selection latency: the policy loop (Config, then StaticOrdering) against a 10,000-entry override file.

    python benchmarks/selection_bench.py [--entries 10000] [--calls 20000]

Two override files for this machine's CPU device, each with N matmul entries:
an exact one (every tensor's dims, strides and dtype given) and a wildcard one
(M is -1 and strides are absent, so entries are scanned in order). Four cases
each: a hit (on the last entry written, the worst place for a scan) and a miss
(Config declines, StaticOrdering answers). "steady" repeats one problem (what a
production process does after its first call); "first" is the first selection
of each of 1,000 new shapes (problem bytes built, decoded and matched once).
Target: steady <= 20 us per selection.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_US = 20.0


def _files(n: int, tmp: Path, device) -> tuple[Path, Path]:
    from farm.store.overrides.entries import OverrideEntry, TensorRule
    from farm.store.overrides.files import write_overrides
    from farm.model.problem import Problem

    dev = {"signature": device.signature, "properties": device.properties.to_dict()}
    exact, wild = [], []
    for i in range(n):
        k, m = 64 + i % 100, 16 + i // 100
        p = Problem.create("matmul", {"A": {"dims": [m, k]}, "B": {"dims": [k, 256]}})
        exact.append(OverrideEntry.for_problem(p, "cpu.matmul.blocked", (("block_k", 128),), {"rank": 0}))
        wild.append(OverrideEntry("matmul", "cpu.matmul.blocked",
                                  (TensorRule("A", (-1, k), (), "fp32"), TensorRule("B", (k, 256 + i // 100), (), "fp32"),
                                   TensorRule("C", (-1, 256 + i // 100), (), "fp32")),
                                  knobs=(("block_k", 128),), compute_data_type="fp32", metadata={"rank": 0}))
    paths = tmp / "exact.json", tmp / "wildcard.json"
    write_overrides(paths[0], exact, device=dev, mode="replace")
    write_overrides(paths[1], wild, device=dev, mode="replace")
    return paths


def _time(fn, calls: int) -> float:
    for _ in range(min(calls, 1000)):
        fn()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        best.append((time.perf_counter() - t0) / (calls // 5) * 1e6)
    return statistics.median(best)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=20_000)
    args = ap.parse_args()

    from farm.devices.device import cpu_device
    from farm.model.engine import default_engine_registry
    from farm.model.problem import Problem
    from farm.replay.selection import Selector

    device = cpu_device()
    tmp = Path(tempfile.mkdtemp(prefix="selection-bench-"))
    exact_path, wild_path = _files(args.entries, tmp, device)
    last = args.entries - 1
    k_last, m_last = 64 + last % 100, 16 + last // 100
    cases = {
        "exact": (exact_path, {"hit": (m_last, k_last, 256), "miss": (7, 7, 7)}),
        "wildcard": (wild_path, {"hit": (12345, k_last, 256 + last // 100), "miss": (7, 7, 7)}),
    }
    registry = default_engine_registry()

    def matmul(m: int, k: int, n: int) -> Problem:
        return Problem.create("matmul", {"A": {"dims": [m, k]}, "B": {"dims": [k, n]}})

    candidates = [c.engine_id for c in registry.discover(matmul(8, 8, 8), device)]
    rows = []
    for kind, (path, probes) in cases.items():
        os.environ["FARM_HEUR_CONFIG_PATH"] = str(path)
        selector = Selector(device.properties)
        for outcome, (m, k, n) in probes.items():
            problem = matmul(m, k, n)
            sel = selector.select(problem, candidates)
            expected = "SelectionHeuristic::Config" if outcome == "hit" else "SelectionHeuristic::StaticOrdering"
            if sel.policy != expected:
                raise SystemExit(f"{kind} {outcome}: answered by {sel.policy}, expected {expected}")
            steady = _time(lambda: selector.select(problem, candidates), args.calls)
            fresh = [matmul(m + 100_000 + i, k, n) if outcome == "hit" else matmul(7 + i, 7, 7) for i in range(1000)]
            t0 = time.perf_counter()
            for p in fresh:
                selector.select(p, candidates)
            first = (time.perf_counter() - t0) / len(fresh) * 1e6
            rows.append((kind, outcome, sel.policy, steady, first))

    print(f"{args.entries:,}-entry override files; CPU device {device.signature}; candidates {len(candidates)}")
    print(f"{'file':9s} {'case':5s} {'answered by':36s} {'steady us':>10s} {'first us':>9s}  target")
    for kind, outcome, policy, steady, first in rows:
        ok = "ok" if steady <= TARGET_US else "OVER"
        print(f"{kind:9s} {outcome:5s} {policy:36s} {steady:10.2f} {first:9.1f}  <= {TARGET_US:.0f} us steady: {ok}")


if __name__ == "__main__":
    main()
