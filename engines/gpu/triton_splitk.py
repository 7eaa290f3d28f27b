"""A split-K Triton GEMM for skinny products (LLM decode: M of 1 to 256 rows against wide weights).

With few rows, an output-tiled GEMM has too few tiles to fill the GPU (M = 16, N = 4096 and 128-wide
tiles: 32 programs for 132 SMs) while every program walks all of K. Here K is cut into ``SPLIT_K``
slices: program (tile, slice) multiplies its slice into an fp32 partial, and a second kernel sums the
partials in a fixed order (deterministic), adds the bias and writes C in its dtype and strides. The
partials are the plan's own buffer (``estimate_workspace`` counts it). Both kernels are compiled when
the plan is (``warmup``, no launch); a configuration the device cannot hold fails there.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from farm.plugin import Device, Knob, KnobValue, Problem, Support, gil_heavy_section

from ._common import TRITON_COMPILE_LOCK, GpuEngine, TorchPlan, torch_dtype, torch_module
from .triton_gemm import direct_launcher, load_binary, triton_dot_support

MAX_M = 256  # above this an output-tiled GEMM has tiles enough: the plain Triton GEMM and cuBLAS apply
MIN_K = 512  # below this there is little K to split


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def partial_kernel(a_ptr, b_ptr, p_ptr, M, N, K, K_PER, stride_am, stride_ak, stride_bk, stride_bn,
                       TF32: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        k0 = pid_k * K_PER
        a_ptrs = a_ptr + rm[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak
        b_ptrs = b_ptr + (k0 + rk)[:, None] * stride_bk + rn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K_PER, BLOCK_K):
            if EVEN_K:  # every slice is whole: only the rows (and, unless even, the columns) are masked
                a = tl.load(a_ptrs, mask=rm[:, None] < M, other=0.0)
                if EVEN_N:
                    b = tl.load(b_ptrs)
                else:
                    b = tl.load(b_ptrs, mask=rn[None, :] < N, other=0.0)
            else:
                kk = k0 + k + rk
                a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
                b = tl.load(b_ptrs, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            if TF32:
                acc = tl.dot(a, b, acc, input_precision="tf32")
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        p_ptrs = p_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :]
        tl.store(p_ptrs, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def reduce_kernel(p_ptr, c_ptr, bias_ptr, M, N, stride_cm, stride_cn,
                      SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < M * N
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLITS):  # a fixed order: the same sum every run
            acc += tl.load(p_ptr + s * M * N + offs, mask=mask, other=0.0)
        m = offs // N
        n = offs % N
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
        tl.store(c_ptr + m * stride_cm + n * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)

    return partial_kernel, reduce_kernel


REDUCE_BLOCK = 1024


class TritonSplitK(GpuEngine):
    """matmul of skinny A (M <= 256) in Triton with K split across programs; fp16 / bf16, or fp32 with tf32."""

    name = "triton.gemm_splitk"
    ops = frozenset({"matmul"})
    priority = 52

    knobs = (
        Knob.int("SPLIT_K", 4, choices=(2, 4, 8, 16, 32), doc="slices of K, each a program per output tile"),
        Knob.int("BLOCK_M", 16, choices=(16, 32, 64, 128)),
        Knob.int("BLOCK_N", 64, choices=(32, 64, 128, 256)),
        Knob.int("BLOCK_K", 128, choices=(32, 64, 128, 256)),
        Knob.int("num_warps", 4, choices=(2, 4, 8)),
        Knob.int("num_stages", 4, choices=(2, 3, 4, 5, 6), doc="software pipeline depth"),
    )

    def supports(self, problem: Problem, device: Device) -> Support:
        base = triton_dot_support(problem)
        if not base:
            return base
        a, b = problem.tensor("A"), problem.tensor("B")
        if len(a.dims) != 2 or len(b.dims) != 2:
            return Support.no("2-D A and B only (a batch has rows enough for a tiled GEMM)")
        m, k = a.dims
        if m > MAX_M:
            return Support.no(f"M={m} rows: split-K is for M <= {MAX_M}")
        if k < MIN_K:
            return Support.no(f"K={k}: split-K needs K >= {MIN_K}")
        return Support.yes()

    @staticmethod
    def _plan_shape(problem: Problem, knobs: Mapping[str, KnobValue]) -> tuple[int, int, int, int, int]:
        """(M, N, K, K per slice, slices): a slice is a whole number of BLOCK_K; the last one may be short."""
        m, k = problem.tensor("A").dims
        n = problem.tensor("B").dims[1]
        block_k = int(knobs["BLOCK_K"])
        per = -(-(-(-k // int(knobs["SPLIT_K"]))) // block_k) * block_k
        return m, n, k, per, -(-k // per)

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        m, n, _, _, splits = self._plan_shape(problem, _defaults(self, knobs))
        return splits * m * n * 4

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        partial, reduce = _kernels()
        m, n, k, per, splits = self._plan_shape(problem, knobs)
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        has_bias = problem.has_tensor("bias")
        bm, bn = int(knobs["BLOCK_M"]), int(knobs["BLOCK_N"])
        grid1 = (-(-m // bm) * -(-n // bn), splits, 1)
        grid2 = (-(-(m * n) // REDUCE_BLOCK), 1, 1)
        scalars1 = (m, n, k, per, a.strides[0], a.strides[1], b.strides[0], b.strides[1])
        meta1 = {"TF32": problem.compute_dtype == "tf32", "EVEN_K": per * splits == k, "EVEN_N": n % bn == 0,
                 "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": int(knobs["BLOCK_K"]),
                 "num_warps": int(knobs["num_warps"]), "num_stages": int(knobs["num_stages"])}
        scalars2 = (m, n, c.strides[0], c.strides[1])
        meta2 = {"SPLITS": splits, "HAS_BIAS": has_bias, "BLOCK": REDUCE_BLOCK, "num_warps": 4}
        f32 = torch.float32
        bias_dtype = torch_dtype(problem.tensor("bias").dtype) if has_bias else torch_dtype(c.dtype)
        with TRITON_COMPILE_LOCK, gil_heavy_section():
            compiled = (partial.warmup(torch_dtype(a.dtype), torch_dtype(b.dtype), f32, *scalars1, grid=grid1, **meta1),
                        reduce.warmup(f32, torch_dtype(c.dtype), bias_dtype, *scalars2, grid=grid2, **meta2))
        for kernel in compiled:
            load_binary(kernel)  # takes the GIL-heavy section itself (it is not reentrant)
        parts = torch.empty((splits, m, n), dtype=f32, device=torch.device("cuda", device.index))
        launch1 = direct_launcher(partial, compiled[0], grid1, meta1, device.index)
        launch2 = direct_launcher(reduce, compiled[1], grid2, meta2, device.index)

        def fn(t: Mapping[str, Any]) -> None:
            launch1(t["A"], t["B"], parts, *scalars1)
            launch2(parts, t["C"], t["bias"] if has_bias else t["C"], *scalars2)

        plan = TorchPlan(fn, device)
        plan.partials = parts  # held as long as the plan
        return plan


def _defaults(engine: TritonSplitK, knobs: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
    """The knobs given, the others at their defaults (estimate_workspace may get a partial mapping)."""
    return {kn.name: knobs.get(kn.name, kn.default) for kn in engine.knobs}
