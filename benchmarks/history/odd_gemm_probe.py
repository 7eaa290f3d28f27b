"""Where the time goes in an odd-sized GEMM (4095x511 @ 511x4097 fp16 by default), piece by piece.

    python benchmarks/history/odd_gemm_probe.py --out DIR [--m 4095 --k 511 --n 4097]

Times, with the suite's ``bench`` (device events, L2 flushed, median of 100):
the default path, each step of torch.matmul_padded (copies in, aligned GEMM,
copy out), and the Triton GEMM engines (triton.gemm on the operands as they are,
triton.gemm_padded on aligned copies) over a few tile configurations. A
diagnostic, not a target check: gpu_suite.py checks the targets. Last, the same
GEMM into a C whose row stride is aligned (Inductor's padded layout), where
torch.matmul_padded's split output writes C's aligned columns with cuBLAS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this probe lives in benchmarks/history)
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_suite import bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", type=int, default=4095)
    ap.add_argument("--k", type=int, default=511)
    ap.add_argument("--n", type=int, default=4097)
    ap.add_argument("--multiple", type=int, default=64)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    from farm.devices.device import gpu_device

    dev = gpu_device("cuda", 0)
    m, k, n, mult = args.m, args.k, args.n, args.multiple
    up = lambda v: -(-v // mult) * mult  # noqa: E731
    mp, kp, np_ = up(m), up(k), up(n)
    g = torch.Generator(device="cuda").manual_seed(0)
    f16 = dict(dtype=torch.float16, device="cuda")
    a = torch.randn(m, k, generator=g, **f16)
    b = torch.randn(k, n, generator=g, **f16)
    c = torch.empty(m, n, **f16)
    a_p = torch.zeros(mp, kp, **f16)
    b_p = torch.zeros(kp, np_, **f16)
    c_p = torch.empty(mp, np_, **f16)
    c_flat = torch.empty(m * n, **f16)
    a_p[:m, :k].copy_(a)
    b_p[:k, :n].copy_(b)
    ref = (a.double() @ b.double()).half()
    flops = 2.0 * m * n * k
    rows = []

    def timed(label, fn, check=None):
        ms = bench(torch, dev, fn)
        err = None
        if check is not None:
            torch.cuda.synchronize()
            err = float((check().double() - ref.double()).abs().max())
        rows.append({"step": label, "ms": ms, "tflops": flops / ms / 1e9, "max_err": err})
        print(f"{label:58s} {ms * 1000:9.1f} us  {flops / ms / 1e9:7.1f} TFLOP/s  err {err}", flush=True)

    timed("default torch.matmul(a, b, out=c)", lambda: torch.matmul(a, b, out=c), lambda: c)
    timed("copy A into padded A", lambda: a_p[:m, :k].copy_(a))
    timed("copy B into padded B", lambda: b_p[:k, :n].copy_(b))
    timed("F.pad(A) (a new padded tensor)", lambda: torch.nn.functional.pad(a, (0, kp - k, 0, mp - m)))
    timed(f"aligned mm {mp}x{kp} @ {kp}x{np_} into padded C", lambda: torch.matmul(a_p, b_p, out=c_p),
          lambda: c_p[:m, :n])
    timed("copy padded C into C (strided, odd rows)", lambda: c.copy_(c_p[:m, :n]))
    timed("contiguous copy of the same bytes", lambda: c.view(-1).copy_(c_flat))
    timed("mm padded A, B[:, :n] into C (ldc odd)", lambda: torch.matmul(a_p[:m], b_p[:, :n], out=c), lambda: c)

    def padded_engine():
        a_p[:m, :k].copy_(a)
        b_p[:k, :n].copy_(b)
        torch.matmul(a_p, b_p, out=c_p)
        c.copy_(c_p[:m, :n])

    timed("whole matmul_padded, output=padded", padded_engine, lambda: c)

    from farm.model.engine import default_engine_registry, settings_to_resolved
    from farm.model.problem import Problem

    registry = default_engine_registry()
    problem = Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype="fp16")
    tensors = {"A": a, "B": b, "C": c}
    configs = [dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st, GROUP_M=8)
               for bm, bn, bk, w, st in [(128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 3),
                                         (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 32, 4, 4)]]
    t0 = time.perf_counter()
    for cfg in configs:
        for name in ("triton.gemm", "triton.gemm_padded"):
            engine = registry.get(name)
            try:
                plan = engine.compile(problem, settings_to_resolved(engine, tuple(cfg.items())), dev)
            except Exception as exc:  # out of resources: the tuner would record a failed row
                print(f"{name} {cfg}: {type(exc).__name__}", flush=True)
                continue
            label = f"{name} {cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} w{cfg['num_warps']} s{cfg['num_stages']}"
            timed(label, lambda: plan.run(tensors, None, dev.stream), lambda: c)
    print(f"Triton configurations took {time.perf_counter() - t0:.1f} s", flush=True)

    # C with an aligned row stride (the layout Inductor's padded a @ b returns): the split output
    ldc = -(-n // 8) * 8
    c_ldc = torch.empty(m, ldc, **f16)[:, :n]
    n_main = n - n % mult
    timed(f"mm padded A, B[:, :{n_main}] into C[:, :{n_main}] (ldc {ldc})",
          lambda: torch.matmul(a_p[:m], b_p[:, :n_main], out=c_ldc[:, :n_main]))
    ldc_problem = Problem.create("matmul", {"A": [m, k], "B": [k, n], "C": {"dims": [m, n], "strides": [ldc, 1]}},
                                 dtype="fp16")
    ldc_tensors = {"A": a, "B": b, "C": c_ldc}
    for name, knobs in [("torch.matmul_padded", dict(multiple=mult, output="split")),
                        ("torch.matmul_padded", dict(multiple=8, output="split")),
                        ("torch.matmul_padded", dict(multiple=mult, output="direct")),
                        ("torch.matmul_padded", dict(multiple=8, output="padded")),
                        ("triton.gemm_padded", dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=64, num_warps=4, num_stages=4,
                                                    GROUP_M=8))]:
        engine = registry.get(name)
        plan = engine.compile(ldc_problem, settings_to_resolved(engine, tuple(knobs.items())), dev)
        timed(f"C ldc {ldc}: {name} {knobs}", lambda: plan.run(ldc_tensors, None, dev.stream), lambda: c_ldc)
    (args.out / "probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
