"""A Triton GEMV for decode in nn.Linear's layout: one row of A times B = W.T, W's rows contiguous along K.

At M = 1 a linear layer is a matrix-vector product: every byte of W is read once and used once, so its time is
W's bytes over the HBM's bandwidth. The GEMM kernels give it a tensor-core tile of 16 rows (15 of them zeros) and
the split-K ones a second pass; measured on the H200 they read the decoder's qkv and o projections (26-33 MB) at
2.6-2.9 TB/s (benchmarks/RESULTS.md, issue 54). Here a program takes ``BLOCK_N`` rows of W and walks K in
``BLOCK_K`` steps with 16-byte loads along each row (W's rows are contiguous: the loads need no transposition),
multiplying by A's slice in fp32 and summing each row once at the end: no tensor cores, no workspace, one launch,
the same bits every call (a fixed summation order). Bias is added before the store.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from farm.plugin import Device, Knob, KnobValue, Problem, Support

from ._common import TORCH_DTYPES, GpuEngine, TorchPlan, triton_compile_key
from .triton_gemm import CompilePool, direct_launcher, triton_dot_support

MAX_TILE = 8192  # BLOCK_N x BLOCK_K fp32 partial sums a program holds: 64 registers a thread at 4 warps
# (BLOCK_N, BLOCK_K, num_warps): rows a program, K a step, warps; listed for every shape (the grid is N / BLOCK_N)
LISTED = ((1, 2048, 4), (2, 1024, 4), (2, 2048, 8), (4, 512, 4), (4, 1024, 4), (4, 2048, 8), (8, 512, 4),
          (8, 1024, 8), (16, 256, 4), (16, 512, 8))


def _gemv_kernel() -> Any:
    """The kernel factory the compile pool's processes call ("module:function")."""
    return _kernel()


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def gemv_kernel(a_ptr, w_ptr, c_ptr, bias_ptr, N, K, s_ak, s_wn, s_cn,
                    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """C[n] = sum_k A[k] W[n, k] (+ bias[n]) for the program's BLOCK_N rows n."""
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        in_n = n < N
        rows = w_ptr + n[:, None] * s_wn
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                x = tl.load(a_ptr + k * s_ak)
                w = tl.load(rows + k[None, :], mask=in_n[:, None], other=0.0)
            else:
                in_k = k < K
                x = tl.load(a_ptr + k * s_ak, mask=in_k, other=0.0)
                w = tl.load(rows + k[None, :], mask=in_n[:, None] & in_k[None, :], other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        out = tl.sum(acc, 1)
        if HAS_BIAS:
            out += tl.load(bias_ptr + n, mask=in_n, other=0.0).to(tl.float32)
        tl.store(c_ptr + n * s_cn, out.to(c_ptr.dtype.element_ty), mask=in_n)

    return gemv_kernel


class TritonGemv(GpuEngine):
    """matmul with one row of A and B = W.T (unit stride along K): a program per BLOCK_N rows of W."""

    name = "triton.gemv"
    ops = frozenset({"matmul"})
    priority = 53
    storage_dtypes = frozenset({"fp16", "bf16"})

    knobs = (
        Knob.int("BLOCK_N", 4, choices=(1, 2, 4, 8, 16), doc="rows of W (outputs) a program sums"),
        Knob.int("BLOCK_K", 1024, choices=(256, 512, 1024, 2048), doc="elements of a row a loop step loads"),
        Knob.int("num_warps", 4, choices=(2, 4, 8), doc="warps of a program"),
    )

    def __init__(self, compile_pool: CompilePool | None = None) -> None:
        self._procs = compile_pool or CompilePool()

    def supports(self, problem: Problem, device: Device) -> Support:
        base = triton_dot_support(problem)  # Triton installed, fp32 sums
        if not base:
            return base
        a, b = problem.tensor("A"), problem.tensor("B")
        if len(a.dims) != 2 or len(b.dims) != 2:
            return Support.no("2-D A and B only")
        if a.dims[0] != 1:
            return Support.no(f"M={a.dims[0]}: a matrix-vector product takes one row of A")
        if len({t.dtype for t in problem.tensors}) != 1:
            return Support.no("A, B, C (and bias) of one dtype")
        if problem.compute_dtype != "fp32":
            return Support.no(f"sums in fp32, not {problem.compute_dtype}")
        k, n = b.dims
        if b.strides[0] != 1 and k > 1:
            return Support.no(f"B's strides {list(b.strides)}: W's rows must be contiguous along K (B = W.T, "
                              "nn.Linear's layout)")
        if b.strides[1] % 8:
            return Support.no(f"W's row stride {b.strides[1]} is not a multiple of 8 (16-byte loads)")
        return Support.yes()

    def knob_support(self, problem: Problem, device: Device, knobs: Mapping[str, KnobValue]) -> Support:
        tile = int(knobs.get("BLOCK_N", 4)) * int(knobs.get("BLOCK_K", 1024))
        if tile > MAX_TILE:
            return Support.no(f"BLOCK_N x BLOCK_K = {tile} partial sums a program: more than {MAX_TILE}")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> list[dict[str, KnobValue]]:
        """The listed tiles whose K step is not much longer than K itself."""
        k = problem.tensor("B").dims[0]
        return [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w} for bn, bk, w in LISTED if bk <= max(256, 2 * k)]

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        return 0

    def _launch(self, problem: Problem, knobs: Mapping[str, KnobValue]
                ) -> tuple[tuple[int, ...], dict[str, Any], tuple[int, int, int]]:
        """(scalars, constexprs, grid)."""
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        k, n = b.dims
        block_n, block_k = int(knobs["BLOCK_N"]), int(knobs["BLOCK_K"])
        meta = {"HAS_BIAS": problem.has_tensor("bias"), "EVEN_K": k % block_k == 0, "BLOCK_N": block_n,
                "BLOCK_K": block_k, "num_warps": int(knobs["num_warps"])}
        return (n, k, a.strides[1], b.strides[1], c.strides[1]), meta, (-(-n // block_n), 1, 1)

    def compile_key(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> str:
        knobs = {kn.name: knobs.get(kn.name, kn.default) for kn in self.knobs}
        scalars, meta, _ = self._launch(problem, knobs)
        return triton_compile_key("triton.gemv", device, (problem.dtype,), meta, scalars)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        support = self.knob_support(problem, device, knobs)
        if not support:
            raise ValueError(support.reason)
        kernel = _kernel()
        scalars, meta, grid = self._launch(problem, knobs)
        name = TORCH_DTYPES[problem.dtype]
        compiled = self._procs.compile(f"{__name__}:_gemv_kernel", kernel, (name,) * 4, scalars, grid, meta)
        launch = direct_launcher(kernel, compiled, grid, meta, device.index)
        has_bias = problem.has_tensor("bias")

        def fn(t: Mapping[str, Any]) -> None:
            launch(t["A"], t["B"], t["C"], t["bias"] if has_bias else t["C"], *scalars)

        return TorchPlan(fn, device)
