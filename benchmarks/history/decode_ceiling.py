"""How fast can a decode GEMM be here? Reading the weights alone, against the GEMMs (one GPU).

    python benchmarks/history/decode_ceiling.py [--rows 1,16] [--json FILE]

For the LLM decode GEMMs of benchmarks/beat_the_defaults.py (M = 1, 16, 64, 128 against Llama-3-8B projections,
bf16), measured the same way (device time per call from CUDA-graph replays of 100 calls, each on its own copy
of the inputs, rotating over 256 MB so B comes from HBM):
- an empty kernel (what a launch in a graph costs);
- kernels that only read B (K x N), no arithmetic, no output: Triton with pointer loads, Triton with TMA
  tensor descriptors, and CUDA C++ (CuPy, 16-byte streaming loads, several in flight per thread), each over
  a sweep of grid and tile sizes; the fastest of all is the "read B" bound, what no GEMM of that shape can beat;
- torch.matmul (cuBLAS's choice; in the recorded runs of beat_the_defaults.py it was the best of eager and
  Inductor on every 1024- and 4096-wide shape, Inductor beat it by up to 4 % on some 14336-wide ones), the
  split-K Triton GEMM's sweep and, for M <= 16, the CUDA C++ tensor-core decode GEMM (cuda.decode_gemm: its
  default and listed plans).
Prints per shape the HBM floor (bytes of A + B + C over the device-to-device copy bandwidth of the same run),
each time, the share of the floor the read-B bound reaches, and the speed-up over torch.matmul that a GEMM
running at the read-B bound would have: the most any engine could show in beat_the_defaults.py's comparison.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from beat_the_defaults import DECODE, ROTATE_BYTES, SPLITK, copy_bandwidth, per_call_us, splitk_rows  # noqa: E402

CUDA_READ = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ src, long long n, unsigned int* sink) {
    unsigned int acc = 0;
    const long long step = (long long)gridDim.x * blockDim.x * UNROLL;
    for (long long i = (long long)blockIdx.x * blockDim.x * UNROLL + threadIdx.x; i < n; i += step) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {  // all loads issued before any is used
            const long long j = i + (long long)u * blockDim.x;
            v[u] = j < n ? __ldcs(src + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; (almost) never stores
}
"""


def triton_readers():
    import triton
    import triton.language as tl

    @triton.jit
    def read_ptr(b_ptr, p_ptr, N, K_PER, stride_bk, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.program_id(1) * K_PER + tl.arange(0, BLOCK_K)
        ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :]
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K_PER, BLOCK_K):
            acc += tl.load(ptrs).to(tl.float32)
            ptrs += BLOCK_K * stride_bk
        tl.store(p_ptr + tl.program_id(1) * N + rn, tl.sum(acc, axis=0))

    @triton.jit
    def read_tma(b_desc, p_ptr, N, K_PER, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        off_n = tl.program_id(0) * BLOCK_N
        k0 = tl.program_id(1) * K_PER
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
        for k in range(0, K_PER, BLOCK_K):
            acc += b_desc.load([k0 + k, off_n]).to(tl.float32)
        tl.store(p_ptr + tl.program_id(1) * N + off_n + tl.arange(0, BLOCK_N), tl.sum(acc, axis=0))

    @triton.jit
    def empty(p_ptr):
        if tl.program_id(0) == 0:
            tl.store(p_ptr, 1.0)

    return read_ptr, read_tma, empty


def fastest(torch, candidates, sets):
    """(us, label) of the fastest of (label, fn) candidates; those that fail to compile or run are skipped."""
    best = (math.inf, "-")
    for label, fn in candidates:
        try:
            us = per_call_us(torch, fn, sets, 100, graphed=True)
        except Exception as exc:  # a tile the device cannot hold
            print(f"   skipped {label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
            continue
        best = min(best, (us, label))
    return best


def read_b_bounds(torch, k, n, sets, scratch):
    """Fastest read of B (K x N) by each kind of reader: {kind: (us, label)}."""
    read_ptr, read_tma, _ = triton_readers()
    from triton.tools.tensor_descriptor import TensorDescriptor

    def ptr_reader(bn, bk, sp, nw):
        return lambda a, b: read_ptr[(n // bn, sp)](b, scratch, n, k // sp, b.stride(0), BLOCK_N=bn, BLOCK_K=bk,
                                                  num_warps=nw)

    def tma_reader(bn, bk, sp, st):
        return lambda a, b: read_tma[(n // bn, sp)](TensorDescriptor.from_tensor(b, [bk, bn]), scratch, n, k // sp,
                                                  BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=st)

    ptr = [(f"BLOCK_N={bn} BLOCK_K={bk} split={sp} warps={nw}", ptr_reader(bn, bk, sp, nw))
           for bn, bk, sp, nw in itertools.product((64, 128, 256), (16, 32, 64), (4, 8, 16, 32), (4, 8))
           if n % bn == 0 and k % (sp * bk) == 0]
    tma = [(f"BLOCK_N={bn} BLOCK_K={bk} split={sp} stages={st}", tma_reader(bn, bk, sp, st))
           for bn, bk, sp, st in itertools.product((64, 128), (64, 128), (4, 8, 16, 32), (3, 4))
           if n % bn == 0 and k % (sp * bk) == 0]
    out = {"Triton pointer loads": fastest(torch, ptr, sets), "Triton TMA": fastest(torch, tma, sets)}
    try:
        import cupy
    except ImportError as exc:
        out["CUDA C++"] = (math.inf, f"CuPy missing: {exc}")
        return out
    sink = cupy.zeros(1, dtype=cupy.uint32)
    n16 = k * n * 2 // 16

    def cuda_reader(unroll, threads, blocks):
        kernel = cupy.RawKernel(CUDA_READ, "read_all", options=(f"-DUNROLL={unroll}",))

        def call(a, b):
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                kernel((blocks,), (threads,), (cupy.uint64(b.data_ptr()), cupy.int64(n16), sink))
        return call

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cuda = []
    for unroll, threads in itertools.product((1, 2, 4, 8), (256, 512, 1024)):
        one_pass = -(-n16 // (threads * unroll))
        for blocks in sorted({sms, 2 * sms, 4 * sms, 8 * sms, one_pass}):
            if blocks <= one_pass:
                cuda.append((f"unroll={unroll} threads={threads} blocks={blocks}", cuda_reader(unroll, threads, blocks)))
    out["CUDA C++"] = fastest(torch, cuda, sets)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--rows", help="only the shapes with these M, e.g. 1,16")
    args = parser.parse_args()
    shapes = [s for s in DECODE if not args.rows or s[0] in {int(x) for x in args.rows.split(",")}]
    import torch

    from farm.devices.device import gpu_device
    from farm.model.engine import default_engine_registry
    from farm.model.problem import Problem

    bw = copy_bandwidth(torch)
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}", flush=True)
    scratch = torch.zeros(1 << 22, device="cuda", dtype=torch.float32)
    _, _, empty = triton_readers()
    empty_us = per_call_us(torch, lambda: empty[(132,)](scratch), [()] * 2, 100, graphed=True)
    print(f"empty kernel (132 programs): {empty_us:.2f} us a call", flush=True)
    dev = gpu_device("cuda", 0)
    splitk = default_engine_registry().get("triton.gemm_splitk")
    decode = default_engine_registry().get("cuda.decode_gemm")
    defaults_decode = {kn.name: kn.default for kn in decode.knobs}

    def product(m, n, plan):
        def call(a, b):
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            plan.fn({"A": a, "B": b, "C": c})
            return c
        return call
    bounds: dict[tuple[int, int], dict] = {}
    rows = []
    for m, k, n in shapes:
        nbytes = (m * k + k * n + m * n) * 2
        copies = max(2, min(32, ROTATE_BYTES // nbytes + 1))
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(copies)]
        if (k, n) not in bounds:  # reading B does not depend on M
            bounds[(k, n)] = read_b_bounds(torch, k, n, sets, scratch)
            for kind, (us, label) in bounds[(k, n)].items():
                print(f"   read B {k}x{n}, {kind}: {us:.2f} us ({label})", flush=True)
        read_us, read_by = min((v[0], kind) for kind, v in bounds[(k, n)].items())
        eager = per_call_us(torch, torch.matmul, sets, 100, graphed=True)
        problem = Problem.create("matmul", {"A": [m, k], "B": [k, n]}, dtype="bf16")
        defaults = {kn.name: kn.default for kn in splitk.knobs}
        plans = []
        for values in itertools.product(*SPLITK.values()):
            knobs = {**defaults, **dict(zip(SPLITK, values)), "BLOCK_M": splitk_rows(m)}
            try:
                plan = splitk.compile(problem, knobs, dev)
            except Exception:
                continue
            plans.append((",".join(f"{key}={v}" for key, v in zip(SPLITK, values)), product(m, n, plan)))
        split_us, split_label = fastest(torch, plans, sets)
        decode_us, decode_label = math.inf, "-"
        if decode.applicable(problem, dev):  # M <= 16: the CUDA C++ decode GEMM, its default and listed plans
            calls = []
            for knobs in [defaults_decode, *({**defaults_decode, **p} for p in decode.list_plans(problem, dev))]:
                label = ",".join(f"{key}={v}" for key, v in knobs.items())
                try:
                    calls.append((label, product(m, n, decode.compile(problem, knobs, dev))))
                except Exception as exc:
                    print(f"   cuda.decode_gemm {label} did not build: {type(exc).__name__}: {str(exc)[:300]}",
                          flush=True)
            decode_us, decode_label = fastest(torch, calls, sets)
        floor = nbytes / bw * 1e6
        row = {"m": m, "k": k, "n": n, "floor_us": floor, "empty_us": empty_us, "read_b_us": read_us,
               "read_b_by": read_by, "readers": {kind: v[0] for kind, v in bounds[(k, n)].items()},
               "torch_us": eager, "splitk_us": split_us, "splitk_knobs": split_label, "decode_us": decode_us,
               "decode_knobs": decode_label}
        rows.append(row)
        print(f"{m}x{k}x{n}: floor {floor:.1f}, read B {read_us:.1f} ({read_by}), torch.matmul {eager:.1f}, "
              f"split-K {split_us:.1f} ({split_label}), cuda.decode_gemm {decode_us:.1f} ({decode_label})", flush=True)

    print()
    print(f"Device time per call (us, CUDA-graph replays on rotating inputs); empty kernel {empty_us:.2f} us; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s.")
    print("| shape | HBM floor | read B: Triton ptr | Triton TMA | CUDA C++ | read B % of floor | torch.matmul | "
          "split-K best | cuda.decode_gemm best | ours / torch | ours % of floor | at most (torch / read B) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        rd = r["readers"]
        best_ours = min(r["torch_us"], r["splitk_us"], r["decode_us"])
        decode_cell = f"{r['decode_us']:.1f}" if math.isfinite(r["decode_us"]) else "-"
        print(f"| {r['m']}x{r['k']}x{r['n']} | {r['floor_us']:.1f} | {rd['Triton pointer loads']:.1f} | "
              f"{rd['Triton TMA']:.1f} | {rd['CUDA C++']:.1f} | {100 * r['floor_us'] / r['read_b_us']:.0f} % | "
              f"{r['torch_us']:.1f} | {r['splitk_us']:.1f} | {decode_cell} | {r['torch_us'] / best_ours:.3f} | "
              f"{100 * r['floor_us'] / best_ours:.0f} % | {r['torch_us'] / r['read_b_us']:.3f} |")
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    ours = geo([r["torch_us"] / min(r["torch_us"], r["splitk_us"], r["decode_us"]) for r in rows])
    print(f"\ngeomean over {len(rows)} shapes: best of torch.matmul, split-K and cuda.decode_gemm over "
          f"torch.matmul {ours:.3f}; "
          f"a GEMM at the read-B bound over torch.matmul {geo([r['torch_us'] / r['read_b_us'] for r in rows]):.3f}")
    at75 = [r for r in rows if r["floor_us"] / r["read_b_us"] >= 0.75]
    print(f"shapes where reading B alone reaches 75 % of the HBM floor: {len(at75)} of {len(rows)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"copy_bandwidth_Bps": bw, "empty_kernel_us": empty_us, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
