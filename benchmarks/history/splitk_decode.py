"""Skinny (LLM decode) GEMMs on one GPU: torch.matmul (cuBLAS's choice) vs the split-K Triton GEMM's sweep.

    python benchmarks/history/splitk_decode.py [--json FILE] [--budget-s 300]

For M = 1, 16, 64, 128 rows against Llama-3-8B projection shapes (bf16), times torch.matmul and every
configuration of a split-K sweep (both ``REDUCTION`` schemes: the tile's last program sums, one launch; or a
second kernel) the way benchmarks/beat_the_defaults.py does: device time per call from CUDA-graph replays
of 100 calls, each on its own copy of the inputs (rotating over 256 MB, so weights come from HBM). Every
configuration is checked against an fp32 product first. Prints, per shape, torch.matmul, the best of each
scheme, the best knobs and the share of the HBM floor (bytes of A + B + C over the device-to-device copy
bandwidth of the same run); a Markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from beat_the_defaults import DECODE, ROTATE_BYTES, copy_bandwidth, per_call_us  # noqa: E402


def sweep(m: int) -> list[dict]:
    """The configurations tried for M rows (row tiles of 16 for a few rows, 64 or 128 for more)."""
    block_m = (16,) if m <= 16 else (64,) if m <= 64 else (64, 128)
    grid = {"SPLIT_K": [2, 4, 8, 16, 32], "BLOCK_N": [32, 64, 128], "BLOCK_M": list(block_m), "BLOCK_K": [128],
            "num_stages": [3, 4, 5], "num_warps": [4], "REDUCTION": ["serial", "parallel"]}
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop starting new shapes after this")
    args = parser.parse_args()
    t_start = time.perf_counter()
    import torch

    from farm.devices.device import gpu_device
    from farm.model.engine import default_engine_registry
    from farm.model.problem import Problem

    dev = gpu_device("cuda", 0)
    engine = default_engine_registry().get("triton.gemm_splitk")
    bw = copy_bandwidth(torch)
    rows = []
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s", flush=True)
    table = ["| M | K | N | torch.matmul us | split-K serial us | split-K parallel us | best / torch | best knobs "
             "| % of HBM floor |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for m, k, n in DECODE:
        if time.perf_counter() - t_start > args.budget_s:
            print(f"budget spent: {m}x{k}x{n} and later shapes not run", flush=True)
            break
        nbytes = (m * k + k * n + m * n) * 2
        copies = max(2, min(32, ROTATE_BYTES // nbytes + 1))
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(copies)]
        eager = per_call_us(torch, torch.matmul, sets, 100, graphed=True)
        problem = Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype="bf16")
        ref = (sets[0][0].float() @ sets[0][1].float())
        best: dict[str, tuple[float, dict]] = {}
        failed = 0
        for knobs in sweep(m):
            try:
                plan = engine.compile(problem, {**{kn.name: kn.default for kn in engine.knobs}, **knobs}, dev)

                def call(a, b, plan=plan):
                    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                    plan.fn({"A": a, "B": b, "C": c})
                    return c

                for _ in range(2):  # the second call runs on counters the first one left at zero
                    out = call(*sets[0])
                torch.cuda.synchronize()
                if not torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-1):
                    print(f"wrong result: {m}x{k}x{n} {knobs}", file=sys.stderr, flush=True)
                    failed += 1
                    continue
                us = per_call_us(torch, call, sets, 100, graphed=True)
            except Exception as exc:  # a tile the device cannot hold: shared memory, registers
                failed += 1
                if failed < 3:
                    print(f"  {m}x{k}x{n} {knobs}: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr, flush=True)
                continue
            scheme = knobs["REDUCTION"]
            if scheme not in best or us < best[scheme][0]:
                best[scheme] = (us, knobs)
        top = min(best.values(), key=lambda v: v[0]) if best else None
        floor_us = nbytes / bw * 1e6
        row = {"m": m, "k": k, "n": n, "torch_us": eager, "failed": failed,
               **{f"{s}_us": v[0] for s, v in best.items()}, **{f"{s}_knobs": v[1] for s, v in best.items()}}
        rows.append(row)
        fmt = lambda s: f"{best[s][0]:.1f}" if s in best else "-"  # noqa: E731
        if top is not None:
            knobs = {key: v for key, v in top[1].items() if key != "num_warps"}
            line = (f"| {m} | {k} | {n} | {eager:.1f} | {fmt('serial')} | {fmt('parallel')} | {eager / top[0]:.3f} | "
                    f"{knobs} | {100 * floor_us / top[0]:.0f} % |")
        else:
            line = f"| {m} | {k} | {n} | {eager:.1f} | - | - | - | - | - |"
        table.append(line)
        print(line, flush=True)
    print()
    print("\n".join(table))
    ratios = [r["torch_us"] / min(r.get("serial_us", math.inf), r.get("parallel_us", math.inf)) for r in rows]
    ratios = [x for x in ratios if x > 0]
    if ratios:
        print(f"\ngeomean best split-K / torch.matmul over {len(ratios)} shapes: "
              f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    both = [r for r in rows if "serial_us" in r and "parallel_us" in r]
    if both:
        gain = math.exp(sum(math.log(r["parallel_us"] / r["serial_us"]) for r in both) / len(both))
        print(f"geomean parallel / serial (best of each): {gain:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"copy_bandwidth_Bps": bw, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
