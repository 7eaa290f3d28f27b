"""A split-K Triton GEMM for skinny products (LLM decode: M of 1 to 256 rows against wide weights).

With few rows, an output-tiled GEMM has too few tiles to fill the GPU (M = 16, N = 4096 and 128-wide
tiles: 32 programs for 132 SMs) while every program walks all of K. Here K is cut into ``SPLIT_K``
slices: program (tile, slice) multiplies its slice into an fp32 partial, and the partials of a tile are
summed in a fixed order (deterministic), the bias added and C written in its dtype and strides. Who sums
is the ``REDUCTION`` knob, CUTLASS's two split-K schemes: ``serial``, the tile's last program to finish
(one launch; a counter per tile, left at zero for the next call), or ``parallel``, a second kernel. The
partials (and counters) are the plan's own buffers (``estimate_workspace`` counts them). The kernels
are compiled when the plan is (``warmup``, no launch); a configuration the device cannot hold fails there.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from farm.plugin import Device, Knob, KnobValue, Problem, Support

from ._common import TORCH_DTYPES, GpuEngine, PerStream, TorchPlan, torch_module, triton_compile_key
from .triton_gemm import CompilePool, direct_launcher, triton_dot_support

MAX_M = 256  # above this an output-tiled GEMM has tiles enough: the plain Triton GEMM and cuBLAS apply
MIN_K = 512  # below this there is little K to split


def _partial_kernel() -> Any:
    return _kernels()[0]


def _reduce_kernel() -> Any:
    return _kernels()[1]


def _serial_kernel() -> Any:
    """The kernel factories the compile pool's processes call ("module:function")."""
    return _kernels()[2]


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def slice_product(a_ptr, b_ptr, M, N, K, K_PER, stride_am, stride_ak, stride_bk, stride_bn, rm, rn,
                      TF32: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """This program's slice of K times its tile of B, in fp32."""
        rk = tl.arange(0, BLOCK_K)
        k0 = tl.program_id(1) * K_PER
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
        return acc

    @triton.jit
    def partial_kernel(a_ptr, b_ptr, p_ptr, M, N, K, K_PER, stride_am, stride_ak, stride_bk, stride_bn,
                       TF32: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        num_pid_n = tl.cdiv(N, BLOCK_N)
        rm = (tl.program_id(0) // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tl.program_id(0) % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = slice_product(a_ptr, b_ptr, M, N, K, K_PER, stride_am, stride_ak, stride_bk, stride_bn, rm, rn,
                            TF32, EVEN_K, EVEN_N, BLOCK_M, BLOCK_N, BLOCK_K)
        p_ptrs = p_ptr + tl.program_id(1) * M * N + rm[:, None] * N + rn[None, :]
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

    @triton.jit
    def serial_kernel(a_ptr, b_ptr, p_ptr, c_ptr, bias_ptr, count_ptr, M, N, K, K_PER, stride_am, stride_ak,
                      stride_bk, stride_bn, stride_cm, stride_cn,
                      SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, TF32: tl.constexpr, EVEN_K: tl.constexpr,
                      EVEN_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        # One launch: every program stores its slice's partial; the tile's last one to arrive (a counter per
        # tile) sums the tile's partials in slice order (the same sum as the reduce kernel's, every run),
        # writes C and sets the counter back to 0 for the next call.
        tile = tl.program_id(0)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        rm = (tile // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (tile % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = slice_product(a_ptr, b_ptr, M, N, K, K_PER, stride_am, stride_ak, stride_bk, stride_bn, rm, rn,
                            TF32, EVEN_K, EVEN_N, BLOCK_M, BLOCK_N, BLOCK_K)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        offs = rm[:, None] * N + rn[None, :]
        tl.store(p_ptr + tl.program_id(1) * M * N + offs, acc, mask=mask)
        tl.debug_barrier()  # the whole program's stores precede its arrival (released by the atomic)
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLITS):
                # .cg: read from L2, never from this SM's L1 (it may hold an earlier call's partials)
                total += tl.load(p_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
            tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, total.to(c_ptr.dtype.element_ty),
                     mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")

    return partial_kernel, reduce_kernel, serial_kernel


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
        Knob.str("REDUCTION", "serial", choices=("serial", "parallel"),
                 doc="who sums a tile's slices: its last program (one launch) or a second kernel"),
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
        knobs = _defaults(self, knobs)
        m, n, _, _, splits = self._plan_shape(problem, knobs)
        counters = _tiles(m, n, knobs) * 4 if knobs["REDUCTION"] == "serial" else 0
        return splits * m * n * 4 + counters

    def __init__(self, compile_pool: CompilePool | None = None) -> None:
        self._procs = compile_pool or CompilePool()

    def prepare(self, device_kind: str) -> None:
        """Start the Triton compile pool in the background (a farm GPU worker, as for triton.gemm)."""
        import importlib.util

        if device_kind == "gpu" and importlib.util.find_spec("triton") is not None:
            self._procs.start()

    def _launch_args(self, problem: Problem, knobs: Mapping[str, KnobValue]
                     ) -> tuple[tuple[int, ...], dict[str, Any], int]:
        """(the product's integer arguments, the tiling constexprs, slices of K)."""
        m, n, k, per, splits = self._plan_shape(problem, knobs)
        a, b = problem.tensor("A"), problem.tensor("B")
        bn = int(knobs["BLOCK_N"])
        product = (m, n, k, per, a.strides[0], a.strides[1], b.strides[0], b.strides[1])
        tiling = {"TF32": problem.compute_dtype == "tf32", "EVEN_K": per * splits == k, "EVEN_N": n % bn == 0,
                  "BLOCK_M": int(knobs["BLOCK_M"]), "BLOCK_N": bn, "BLOCK_K": int(knobs["BLOCK_K"]),
                  "num_warps": int(knobs["num_warps"]), "num_stages": int(knobs["num_stages"])}
        return product, tiling, splits

    def compile_key(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> str:
        """The kernel binaries in Triton's disk cache (farm.tuner.compile_claims: one compile a host)."""
        knobs = _defaults(self, knobs)
        product, tiling, splits = self._launch_args(problem, knobs)
        c = problem.tensor("C")
        dtypes = tuple(problem.tensor(t).dtype for t in ("A", "B", "C", "bias") if problem.has_tensor(t))
        meta = {"SPLITS": splits, "REDUCTION": knobs["REDUCTION"], **tiling}
        return triton_compile_key("triton.gemm_splitk", device, dtypes, meta, (*product, *c.strides))

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        partial, reduce, serial = _kernels()
        m, n, k, per, splits = self._plan_shape(problem, knobs)
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        has_bias = problem.has_tensor("bias")
        grid1 = (_tiles(m, n, knobs), splits, 1)
        product, tiling, _ = self._launch_args(problem, knobs)
        serial_sum = knobs["REDUCTION"] == "serial"
        scratch = StreamScratch(torch, device.index, (splits, m, n), grid1[0] if serial_sum else 0)
        names = [TORCH_DTYPES[t.dtype] for t in (a, b, c)]
        bias_name = TORCH_DTYPES[problem.tensor("bias").dtype] if has_bias else names[2]
        # compiled in the Triton compile pool's processes where it is up (in parallel, and without holding this
        # process's GIL while the device measures), else here; the binary is loaded here either way
        if serial_sum:
            meta = {"SPLITS": splits, "HAS_BIAS": has_bias, **tiling}
            scalars = (*product, c.strides[0], c.strides[1])
            compiled = self._procs.compile(f"{__name__}:_serial_kernel", serial,
                                           (names[0], names[1], "float32", names[2], bias_name, "int32"), scalars,
                                           grid1, meta)
            launch = direct_launcher(serial, compiled, grid1, meta, device.index)

            def fn(t: Mapping[str, Any]) -> None:
                parts, counters = scratch.get()
                launch(t["A"], t["B"], parts, t["C"], t["bias"] if has_bias else t["C"], counters, *scalars)
        else:
            grid2 = (-(-(m * n) // REDUCE_BLOCK), 1, 1)
            summing = (m, n, c.strides[0], c.strides[1])
            meta2 = {"SPLITS": splits, "HAS_BIAS": has_bias, "BLOCK": REDUCE_BLOCK, "num_warps": 4}
            compiled = (self._procs.compile(f"{__name__}:_partial_kernel", partial,
                                            (names[0], names[1], "float32"), product, grid1, tiling),
                        self._procs.compile(f"{__name__}:_reduce_kernel", reduce, ("float32", names[2], bias_name),
                                            summing, grid2, meta2))
            launch1 = direct_launcher(partial, compiled[0], grid1, tiling, device.index)
            launch2 = direct_launcher(reduce, compiled[1], grid2, meta2, device.index)

            def fn(t: Mapping[str, Any]) -> None:
                parts, _ = scratch.get()
                launch1(t["A"], t["B"], parts, *product)
                launch2(parts, t["C"], t["bias"] if has_bias else t["C"], *summing)

        plan = TorchPlan(fn, device)
        plan.scratch = scratch  # held as long as the plan
        return plan


class StreamScratch:
    """A plan's partials (and, for the serial sum, tile counters) per CUDA stream (``PerStream``).

    Calls on two streams at once must not share them (torch keeps cuBLAS's workspace per stream for the
    same reason): a shared counter would be counted twice over and never return to zero. Both are made on the
    calling stream at its first call, the counters zeroed there (the serial sum leaves them at zero again). Inside
    a CUDA graph's pool (a capture, torch.compile's graphs warming up or recording) they are made for the call
    alone, the zeroing captured with it, so nothing the call made outlives it in the graph's pool.
    """

    def __init__(self, torch: Any, device_index: int, partial_shape: tuple[int, int, int], tiles: int) -> None:
        self._torch = torch
        self._device = torch.device("cuda", device_index)
        self._shape = partial_shape
        self._tiles = tiles
        self._by_stream = PerStream(self._make, device_index)

    def get(self) -> tuple[Any, Any]:
        """(partials, counters or None) of the caller's current stream."""
        return self._by_stream.get()

    def per_stream(self) -> list[tuple[Any, Any]]:
        """(partials, counters or None) of every stream that called so far."""
        return self._by_stream.made()

    def _make(self) -> tuple[Any, Any]:
        torch = self._torch
        counters = torch.zeros(self._tiles, dtype=torch.int32, device=self._device) if self._tiles else None
        return torch.empty(self._shape, dtype=torch.float32, device=self._device), counters


def _tiles(m: int, n: int, knobs: Mapping[str, KnobValue]) -> int:
    """Output tiles of BLOCK_M x BLOCK_N (the first grid dimension)."""
    return -(-m // int(knobs["BLOCK_M"])) * -(-n // int(knobs["BLOCK_N"]))


def _defaults(engine: TritonSplitK, knobs: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
    """The knobs given, the others at their defaults (estimate_workspace may get a partial mapping)."""
    return {kn.name: knobs.get(kn.name, kn.default) for kn in engine.knobs}
