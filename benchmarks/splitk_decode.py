"""Skinny (LLM decode) GEMMs on one GPU: torch.matmul (cuBLAS's choice) vs the split-K Triton GEMM.

    python benchmarks/splitk_decode.py [--json FILE]

For M = 1, 16, 64, 128 rows against Llama-3-8B projection shapes (bf16), times torch.matmul and every
configuration of a small split-K sweep with triton.testing.do_bench (median), best split-K first, and
the HBM floor: bytes of A + B + C over the device-to-device copy bandwidth measured in the same run.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144)]  # (K, N): o_proj, up/gate, down, qkv (GQA)
ROWS = (1, 16, 64, 128)
SWEEP = {"SPLIT_K": [2, 4, 8, 16], "BLOCK_M": [16, 64], "BLOCK_N": [64, 128], "BLOCK_K": [128], "num_warps": [4]}


def copy_bandwidth(torch, do_bench) -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read + write)."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=5, rep=50)
    return 2 * src.numel() * 2 / (ms * 1e-3)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch
    from triton.testing import do_bench

    from farm.devices.device import gpu_device
    from farm.model.engine import default_engine_registry
    from farm.model.problem import Problem

    dev = gpu_device("cuda", 0)
    engine = default_engine_registry().get("triton.gemm_splitk")
    bw = copy_bandwidth(torch, do_bench)
    rows = []
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s")
    print("| M | K | N | torch.matmul us | split-K us | split-K / torch | best split-K knobs | % of HBM floor (split-K) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for (k, n), m in itertools.product(SHAPES, ROWS):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        eager = do_bench(lambda: torch.matmul(a, b, out=c), warmup=10, rep=100)
        problem = Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype="bf16")
        best = None
        for values in itertools.product(*SWEEP.values()):
            knobs = {**{kn.name: kn.default for kn in engine.knobs}, **dict(zip(SWEEP, values))}
            try:
                plan = engine.compile(problem, knobs, dev)
            except Exception:
                continue
            t = {"A": a, "B": b, "C": c}
            plan.fn(t)
            torch.cuda.synchronize()
            if not torch.allclose(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1):
                print(f"wrong result: {m}x{k}x{n} {knobs}", file=sys.stderr)
                continue
            ms = do_bench(lambda: plan.fn(t), warmup=10, rep=100)
            if best is None or ms < best[0]:
                best = (ms, {k_: knobs[k_] for k_ in SWEEP})
        floor_ms = (m * k + k * n + m * n) * 2 / bw * 1e3
        ratio = eager / best[0] if best else float("nan")
        rows.append({"m": m, "k": k, "n": n, "torch_us": eager * 1e3, "splitk_us": best[0] * 1e3 if best else None,
                     "speedup": ratio, "knobs": best[1] if best else None,
                     "floor_pct": 100 * floor_ms / best[0] if best else None})
        print(f"| {m} | {k} | {n} | {eager * 1e3:.1f} | {best[0] * 1e3:.1f} | {ratio:.3f} | {best[1]} | "
              f"{100 * floor_ms / best[0]:.0f} % |" if best else f"| {m} | {k} | {n} | {eager * 1e3:.1f} | - | - | - | - |")
    import math

    ok = [r["speedup"] for r in rows if r["speedup"] == r["speedup"]]
    print(f"\ngeomean split-K / torch.matmul over {len(ok)} shapes: {math.exp(sum(map(math.log, ok)) / len(ok)):.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"copy_bandwidth_Bps": bw, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
