"""A Triton kernel that copies A and B into wider, zero-padded buffers in one launch, and can
compute the last columns of C on the way (the tail of a split GEMM).

torch's ``copy_`` into a strided slice of the buffer took 9.7 us for a 4095x511 fp16
matrix on the H200 (benchmarks/odd_gemm_probe.py): with odd rows it moves one element
at a time. This kernel writes whole rows of the aligned buffers, the padding columns'
zeros included, so its stores are vector stores; rows past the source's (K padding)
are never written and stay zero from allocation.

Programs ``[0, A_PROGRAMS)`` copy row blocks of A; the rest copy tiles of B. For a split
GEMM (``torch.matmul_padded`` with ``output=split``) the library writes C's columns
``[0, N0)`` and each A program also computes C's columns ``[N0, N)`` for its rows, from the
A rows it has just loaded and the source B: no launch of its own for the tail.
"""

from __future__ import annotations

import functools
from typing import Any

from farm.plugin import Problem

BLOCK_R, BLOCK_C = 16, 128


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def pad_ab_kernel(a, a_dst, b, b_dst, c, bias,
                      M, K, s_ab, s_am, s_ak, KP, d_ab,
                      N, s_bb, s_bk, s_bn, NP, d_bb, B_BATCH,
                      N0, s_cb, s_cm, s_cn,
                      A_PROGRAMS, B_COL_BLOCKS,
                      TAIL: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        pid = tl.program_id(0)
        batch = tl.program_id(1)
        if pid < A_PROGRAMS:
            r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
            rows = r[:, None] < M
            src = a + batch * s_ab + r[:, None] * s_am
            dst = a_dst + batch * d_ab + r[:, None] * KP
            if TAIL > 0:
                j = N0 + tl.arange(0, TAIL)
                acc = tl.zeros((BLOCK_R, TAIL), dtype=tl.float32)
            for k0 in range(0, KP, BLOCK_C):
                cc = k0 + tl.arange(0, BLOCK_C)
                x = tl.load(src + cc[None, :] * s_ak, mask=rows & (cc[None, :] < K), other=0.0)
                tl.store(dst + cc[None, :], x, mask=rows & (cc[None, :] < KP))
                if TAIL > 0:
                    bt = tl.load(b + batch * s_bb + cc[:, None] * s_bk + j[None, :] * s_bn,
                                 mask=(cc[:, None] < K) & (j[None, :] < N), other=0.0)
                    acc = tl.dot(x, bt, acc, input_precision=PRECISION)
            if TAIL > 0:
                if HAS_BIAS:
                    acc += tl.load(bias + j, mask=j < N, other=0.0).to(tl.float32)[None, :]
                tl.store(c + batch * s_cb + r[:, None] * s_cm + j[None, :] * s_cn, acc.to(c.dtype.element_ty),
                         mask=rows & (j[None, :] < N))
        elif batch < B_BATCH:
            q = pid - A_PROGRAMS
            r = (q // B_COL_BLOCKS) * BLOCK_R + tl.arange(0, BLOCK_R)
            cc = (q % B_COL_BLOCKS) * BLOCK_C + tl.arange(0, BLOCK_C)
            rows = r[:, None] < K
            x = tl.load(b + batch * s_bb + r[:, None] * s_bk + cc[None, :] * s_bn,
                        mask=rows & (cc[None, :] < N) & (cc[None, :] < NP), other=0.0)
            tl.store(b_dst + batch * d_bb + r[:, None] * NP + cc[None, :], x, mask=rows & (cc[None, :] < NP))

    return pad_ab_kernel


def _tail_width(columns: int) -> int:
    """The tail tile's width: 0 for no tail, else a power of two, at least 16 (tl.dot's smallest)."""
    if columns <= 0:
        return 0
    width = 16
    while width < columns:
        width *= 2
    return width


class PadAB:
    """Copies ``problem``'s A and B (as laid out there) into the top-left corners of destination buffers
    of ``a_shape`` and ``b_shape``: contiguous, zero-filled, with as many batch entries (B's may be
    shared) and at least as many rows; B's may be narrower than B for a split GEMM. The destinations
    are given each call (a stream's own). With ``tail_from``, also writes C's columns ``[tail_from, N)``
    (plus bias) for a split GEMM."""

    def __init__(self, problem: Problem, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                 tail_from: int | None = None) -> None:
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        m, k, n = a.dims[-2], a.dims[-1], c.dims[-1]
        batch = a_shape[0] if len(a_shape) == 3 else 1
        b_batch = b_shape[0] if len(b_shape) == 3 else 1
        n0 = n if tail_from is None else tail_from
        if not 0 < n0 <= n:
            raise ValueError(f"tail_from={tail_from}: must lie in (0, {n}]")
        batch_stride = lambda t, dims: t.strides[0] if len(dims) == 3 else 0  # noqa: E731
        s_c = c.strides if len(c.dims) == 3 else (0, *c.strides)
        a_programs = -(-m // BLOCK_R)
        b_col_blocks = -(-b_shape[-1] // BLOCK_C)
        self._scalars = (m, k, batch_stride(a, a.dims), a.strides[-2], a.strides[-1], a_shape[-1],
                         a_shape[-2] * a_shape[-1] if len(a_shape) == 3 else 0,
                         n, batch_stride(b, b.dims), b.strides[-2], b.strides[-1], b_shape[-1],
                         b_shape[-2] * b_shape[-1] if len(b_shape) == 3 else 0, b_batch,
                         n0, *s_c, a_programs, b_col_blocks)
        self._grid = (a_programs + -(-k // BLOCK_R) * b_col_blocks, batch)
        self._meta = dict(TAIL=_tail_width(n - n0), HAS_BIAS=problem.has_tensor("bias") and n0 < n,
                          PRECISION="ieee" if a.dtype == "fp32" and problem.compute_dtype != "tf32" else "tf32",
                          BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C)
        self._launch: Any = None

    def compile(self, a_dtype: Any, b_dtype: Any, c_dtype: Any) -> None:
        """Compile now (the caller holds the Triton compile lock): never inside a timed run."""
        _kernel().warmup(a_dtype, a_dtype, b_dtype, b_dtype, c_dtype, c_dtype, *self._scalars, grid=self._grid,
                         **self._meta)
        self._launch = _kernel()[self._grid]

    def __call__(self, a: Any, a_dst: Any, b: Any, b_dst: Any, c: Any, bias: Any | None) -> None:
        self._launch(a, a_dst, b, b_dst, c, c if bias is None else bias, *self._scalars, **self._meta)
