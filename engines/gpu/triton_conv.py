"""A Triton implicit-GEMM convolution (forward): output pixels x output channels, reduced over the filter.

The product is Y[pixel, k] = sum over (r, s, c) of X[n, c, p*stride - pad + r*dil, q*stride - pad + s*dil]
* W[k, c, r, s], read in place in any strides (channels-last is what makes the loads vector loads). How the
reduction walks is the ``K_LOOP`` knob: ``taps`` takes one filter tap at a time and BLOCK_K channels of it
per step (Inductor's convolution template; for C >= 16), ``flat`` treats (r, s, c) as one axis of R*S*C
and gathers BLOCK_K of it per step, which keeps the tensor cores busy when C is small (the RGB stem: C = 3,
where a tap at a time would multiply 13 of every 16 channels by zero). ``PAD_C`` runs the walk on
zero-filled channels-last copies of X and W with 4 or 8 channels and X's border padding in place, made every
call (one Triton launch): aligned pixels and no bounds masks, so the loads vectorize. On those copies
``rows`` takes a filter row a step: its taps and channels are one contiguous span of X per output pixel (taps
added with zero weights up to a power-of-two span), a vector load and an address add per pixel where the flat
walk splits each element's index (the stem: 117 us as stored, 82 us flat on copies, 58 us rows;
benchmarks/RESULTS.md). The engine lists the tile configurations worth trying for the shape
(``list_plans``), as Triton's autotuners list their configs. Each configuration is compiled when its plan is built (``warmup``, no launch; in triton.gemm's compile pool
where a tuning process started it); one that needs more shared memory than the device has fails there,
with the compiler's reason.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, Sequence

from farm.plugin import Device, Knob, KnobValue, Problem, Support, itemsize

from ._common import TORCH_DTYPES, GpuEngine, PerStream, TorchPlan, torch_dtype, torch_module, triton_compile_key
from .library_plans import plan_limit
from .triton_gemm import CompilePool, cap_tile, direct_launcher, pipeline_bytes, shared_memory_bytes, triton_dot_support

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): tiles of output pixels x output channels; Inductor's list
# for its convolution template (torch/_inductor/template_heuristics), its one 16-wide tile last
TAP_CONFIGS = (
    (64, 256, 16, 2, 4), (256, 64, 16, 2, 4), (128, 128, 32, 2, 8), (64, 64, 32, 2, 4), (64, 256, 32, 2, 8),
    (256, 64, 32, 2, 8), (128, 128, 64, 3, 8), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (256, 128, 64, 2, 8),
    (128, 256, 64, 2, 8), (128, 128, 128, 2, 8), (128, 128, 128, 3, 8), (64, 128, 128, 4, 4), (256, 128, 128, 2, 8),
    (128, 256, 128, 2, 8), (1024, 16, 16, 1, 8),
)
FLAT_CONFIGS = (
    (128, 64, 16, 3, 4), (128, 64, 32, 3, 4), (256, 64, 32, 3, 8), (64, 64, 32, 3, 4), (128, 64, 64, 3, 4),
    (256, 64, 64, 3, 8),
)
# the rows walk's tiles (BLOCK_K is the span of a filter row on the padded copy; its loop over the filter rows
# is unrolled, so there is no software pipeline to deepen: num_stages 1)
ROWS_CONFIGS = (
    (128, 64, 0, 1, 4), (256, 64, 0, 1, 8), (128, 64, 0, 1, 8), (64, 64, 0, 1, 4), (128, 128, 0, 1, 8),
    (256, 64, 0, 1, 4),
)
FLAT_BELOW_C = 32  # the flat walk is listed for fewer channels than this (a tap's channels fill no 32-wide step)


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    import triton
    import triton.language as tl

    # Sizes and strides are compile-time constants (as in Inductor's template): the pixel index splits into
    # (n, p, q) and the loop's trip count by constants, a kernel per shape (the tuner compiles per shape anyway)
    @triton.jit
    def conv_fprop_kernel(x_ptr, w_ptr, y_ptr, BATCH: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
                          W: tl.constexpr, K: tl.constexpr, P: tl.constexpr, Q: tl.constexpr,
                          sxn: tl.constexpr, sxc: tl.constexpr, sxh: tl.constexpr, sxw: tl.constexpr,
                          swk: tl.constexpr, swc: tl.constexpr, swr: tl.constexpr, sws: tl.constexpr,
                          syn: tl.constexpr, syk: tl.constexpr, syp: tl.constexpr, syq: tl.constexpr,
                          R: tl.constexpr, S: tl.constexpr, STRIDE_H: tl.constexpr, STRIDE_W: tl.constexpr,
                          PAD_H: tl.constexpr, PAD_W: tl.constexpr, DIL_H: tl.constexpr, DIL_W: tl.constexpr,
                          FLAT: tl.constexpr, ROWS: tl.constexpr, LIVE_K: tl.constexpr, EVEN_C: tl.constexpr,
                          WIDE_INDEX: tl.constexpr, TF32: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pixels = BATCH * P * Q
        num_m = tl.cdiv(pixels, BLOCK_M)
        num_n = tl.cdiv(K, BLOCK_N)
        # grouped order: GROUP_M row tiles share the filter tiles they read while those are in L2
        pid = tl.program_id(0)
        in_group = GROUP_M * num_n
        first_m = (pid // in_group) * GROUP_M
        rows = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % rows
        pid_n = (pid % in_group) // rows

        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if WIDE_INDEX:  # offsets past 2**31 elements
            rm = rm.to(tl.int64)
            rn = rn.to(tl.int64)
        q = rm % Q
        p = (rm // Q) % P
        n = rm // (P * Q)
        m_ok = rm < pixels
        n_ok = rn < K
        ih0 = p * STRIDE_H - PAD_H
        iw0 = q * STRIDE_W - PAD_W
        x_rows = x_ptr + n * sxn
        w_cols = w_ptr + rn * swk
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if FLAT:
            RSC: tl.constexpr = R * S * C
            for k0 in range(0, RSC, BLOCK_K):
                kk = k0 + rk
                c = kk % C
                r = kk // (S * C)
                s = (kk // C) % S
                ih = ih0[:, None] + (r * DIL_H)[None, :]
                iw = iw0[:, None] + (s * DIL_W)[None, :]
                k_ok = kk < RSC
                if PAD_H + PAD_W > 0:
                    a_ok = m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                else:  # unpadded (or a padded copy): every tap of a real output pixel is inside the input
                    a_ok = m_ok[:, None] & k_ok[None, :]
                a = tl.load(x_rows[:, None] + ih * sxh + iw * sxw + (c * sxc)[None, :], mask=a_ok, other=0.0)
                b = tl.load(w_cols[None, :] + (c * swc + r * swr + s * sws)[:, None],
                            mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                if TF32:
                    acc = tl.dot(a, b, acc, input_precision="tf32")
                else:
                    acc = tl.dot(a, b, acc)
        elif ROWS:
            # on a padded copy (no padding left, channels innermost, S * C a power of two): a filter row's taps
            # and channels are one contiguous span of X per output pixel, so a step is a vector load per pixel
            # and an address add, where the flat walk splits every element's index into (r, s, c)
            a_rows = x_rows + ih0 * sxh + iw0 * sxw
            for r in tl.static_range(R):  # unrolled: every row's loads in flight at once (51 us, 64 as a loop)
                a = tl.load(a_rows[:, None] + (r * DIL_H * sxh + rk)[None, :], mask=m_ok[:, None], other=0.0)
                if LIVE_K < BLOCK_K:  # the span's taps past the filter's own meet zero weights: zero their data
                    a = tl.where((rk < LIVE_K)[None, :], a, 0.0)  # too (0 * inf is NaN), after the vector load
                b = tl.load(w_cols[None, :] + (r * swr + rk)[:, None], mask=n_ok[None, :], other=0.0)
                if TF32:
                    acc = tl.dot(a, b, acc, input_precision="tf32")
                else:
                    acc = tl.dot(a, b, acc)
        else:
            chunks = tl.cdiv(C, BLOCK_K)
            for step in range(0, R * S * chunks):  # one loop over taps and channel chunks: it pipelines across taps
                tap = step // chunks
                c = (step - tap * chunks) * BLOCK_K + rk
                r = tap // S
                s = tap - r * S
                ih = ih0 + r * DIL_H
                iw = iw0 + s * DIL_W
                if PAD_H + PAD_W > 0:
                    row_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                else:  # unpadded: every tap of a real output pixel is inside the input
                    row_ok = m_ok
                a_ptrs = x_rows[:, None] + (ih * sxh + iw * sxw)[:, None] + (c * sxc)[None, :]
                b_ptrs = w_cols[None, :] + (c * swc + r * swr + s * sws)[:, None]
                if EVEN_C:
                    a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
                    b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
                else:
                    a = tl.load(a_ptrs, mask=row_ok[:, None] & (c < C)[None, :], other=0.0)
                    b = tl.load(b_ptrs, mask=(c < C)[:, None] & n_ok[None, :], other=0.0)
                if TF32:
                    acc = tl.dot(a, b, acc, input_precision="tf32")
                else:
                    acc = tl.dot(a, b, acc)
        y_ptrs = y_ptr + (n * syn + p * syp + q * syq)[:, None] + (rn * syk)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    return conv_fprop_kernel


@functools.lru_cache(maxsize=1)
def _pad_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def pad_copy_kernel(x_ptr, xp_ptr, w_ptr, wp_ptr, N: tl.constexpr, C: tl.constexpr, H: tl.constexpr,
                        COLS: tl.constexpr, sxn: tl.constexpr, sxc: tl.constexpr, sxh: tl.constexpr,
                        sxw: tl.constexpr, HP: tl.constexpr, WP: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                        K: tl.constexpr, R: tl.constexpr, S: tl.constexpr, swk: tl.constexpr, swc: tl.constexpr,
                        swr: tl.constexpr, sws: tl.constexpr, SPAN: tl.constexpr, PC: tl.constexpr,
                        X_PROGRAMS: tl.constexpr, WIDE_INDEX: tl.constexpr, BLOCK: tl.constexpr):
        # every pixel of the padded X and every tap of the padded W, a whole PC-channel pixel a store: X's
        # values (its first COLS columns) and W's first S taps, zeros around them (the border, the extra
        # channels and taps), so the buffers need no zeroing of their own; one launch for both
        pid = tl.program_id(0)
        c = tl.arange(0, PC)
        if pid < X_PROGRAMS:
            pix = pid * BLOCK + tl.arange(0, BLOCK)
            if WIDE_INDEX:
                pix = pix.to(tl.int64)
            w = pix % WP - PW
            h = (pix // WP) % HP - PH
            n = pix // (WP * HP)
            ok = pix < N * HP * WP
            inside = ok & (h >= 0) & (h < H) & (w >= 0) & (w < COLS)
            v = tl.load(x_ptr + (n * sxn + h * sxh + w * sxw)[:, None] + (c * sxc)[None, :],
                        mask=inside[:, None] & (c < C)[None, :], other=0.0)
            tl.store(xp_ptr + (pix * PC)[:, None] + c[None, :], v, mask=ok[:, None])
        else:
            tap = (pid - X_PROGRAMS) * BLOCK + tl.arange(0, BLOCK)
            s = tap % SPAN
            r = (tap // SPAN) % R
            k = tap // (SPAN * R)
            ok = tap < K * R * SPAN
            v = tl.load(w_ptr + (k * swk + r * swr + s * sws)[:, None] + (c * swc)[None, :],
                        mask=(ok & (s < S))[:, None] & (c < C)[None, :], other=0.0)
            tl.store(wp_ptr + (tap * PC)[:, None] + c[None, :], v, mask=ok[:, None])

    return pad_copy_kernel


def _max_offset(dims: Sequence[int], strides: Sequence[int]) -> int:
    return sum((d - 1) * s for d, s in zip(dims, strides))


class TritonConv(GpuEngine):
    """2-D forward convolution (groups = 1) as a Triton implicit GEMM; fp16 / bf16, or fp32 data with tf32."""

    name = "triton.conv"
    ops = frozenset({"conv_fprop"})
    priority = 45
    knobs = (
        Knob.int("BLOCK_M", 128, choices=(32, 64, 128, 256, 512, 1024), doc="output pixels per tile"),
        Knob.int("BLOCK_N", 64, choices=(16, 32, 64, 128, 256), doc="output channels per tile"),
        Knob.int("BLOCK_K", 32, choices=(16, 32, 64, 128), doc="reduction elements per step"),
        Knob.int("GROUP_M", 8, choices=(1, 4, 8, 16), doc="pixel tiles per group (L2 reuse of the filter)"),
        Knob.int("num_warps", 4, choices=(2, 4, 8)),
        Knob.int("num_stages", 3, choices=(1, 2, 3, 4, 5), doc="software pipeline depth"),
        Knob.str("K_LOOP", "taps", choices=("taps", "flat", "rows"),
                 doc="taps: a filter tap at a time, BLOCK_K channels a step; flat: (r, s, c) as one gathered axis; "
                     "rows: a filter row a step, one contiguous span per pixel of the padded copy (PAD_C)"),
        Knob.int("PAD_C", 0, choices=(0, 4, 8),
                 doc="the flat or rows walk over zero-padded channels-last copies of X and W made every call "
                     "(channels to PAD_C, X's border padding in place): aligned pixels, vector loads; 0: the "
                     "tensors as stored"),
    )

    def __init__(self, compile_pool: CompilePool | None = None) -> None:
        self._procs = compile_pool or CompilePool()

    def prepare(self, device_kind: str) -> None:
        """Start the Triton compile pool in the background (a farm GPU worker, as for triton.gemm)."""
        import importlib.util

        if device_kind == "gpu" and importlib.util.find_spec("triton") is not None:
            self._procs.start()

    def supports(self, problem: Problem, device: Device) -> Support:
        base = triton_dot_support(problem)
        if not base:
            return base
        for t in problem.tensors:
            if len(t.dims) != 4:
                return Support.no(f"tensor {t.id} has {len(t.dims)} dims: 2-D convolutions only")
        groups = problem.criteria_dict["groups"]
        if groups != 1:
            return Support.no(f"groups={groups}: grouped and depthwise convolutions are left to cuDNN")
        return Support.yes()

    def knob_support(self, problem: Problem, device: Device, knobs: Mapping[str, KnobValue]) -> Support:
        pad_c = int(knobs.get("PAD_C", 0))
        walk = knobs.get("K_LOOP", "taps")
        if pad_c and walk == "taps":
            return Support.no("PAD_C pads the channels for the flat and rows walks only (K_LOOP=flat or rows)")
        c = problem.tensor("X").dims[1]
        if pad_c and c > pad_c:
            return Support.no(f"PAD_C={pad_c} is fewer than the input's C={c} channels")
        if walk == "rows":
            if not pad_c:
                return Support.no("K_LOOP=rows walks the padded copies: it needs PAD_C")
            dilation = problem.criteria_dict["dilation_w"]
            if dilation != 1:
                return Support.no(f"K_LOOP=rows reads a filter row as one span: dilation_w={dilation}, not 1")
            s = problem.tensor("W").dims[3]
            span = row_span(s, pad_c) * pad_c
            block_k = int(knobs.get("BLOCK_K", 32))
            if block_k != span:
                return Support.no(f"K_LOOP=rows steps a filter row: BLOCK_K={block_k}, but {s} taps of "
                                  f"PAD_C={pad_c} channels take BLOCK_K={span}")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> Sequence[Mapping[str, KnobValue]]:
        """The tile configurations worth timing for this shape (the first FARM_LIBRARY_PLANS): tiles no wider
        than the channels need, the flat walk where a tap has few channels; duplicates after that clamping
        dropped."""
        _, c, _, _ = problem.tensor("X").dims
        k = problem.tensor("W").dims[0]
        item_bytes = max(itemsize(problem.tensor(t).dtype) for t in ("X", "W"))
        shared_memory = shared_memory_bytes(device)
        plans: list[dict[str, KnobValue]] = []
        s = problem.tensor("W").dims[3]
        walks = [("taps", TAP_CONFIGS, 0)] if c >= 16 else []
        if c <= max(PAD_CHANNELS):
            pad_c = min(v for v in PAD_CHANNELS if v >= c)
            if problem.criteria_dict["dilation_w"] == 1 and row_span(s, pad_c) * pad_c <= MAX_ROW_SPAN:
                walks.insert(0, ("rows", ROWS_CONFIGS, pad_c))
        if c < FLAT_BELOW_C:
            walks.append(("flat", FLAT_CONFIGS, 0))
        if c <= max(PAD_CHANNELS):
            walks.append(("flat", FLAT_CONFIGS, pad_c))
        for walk, configs, pad_c in walks:
            for bm, bn, bk, stages, warps in configs:
                bn = cap_tile(bn, k)
                if walk == "taps":
                    bk = cap_tile(bk, c)
                elif walk == "rows":
                    bk = row_span(s, pad_c) * pad_c
                if shared_memory is not None and pipeline_bytes(bm, bn, bk, stages, item_bytes) > shared_memory:
                    continue
                plan = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "num_warps": warps,
                        "num_stages": stages, "K_LOOP": walk, "PAD_C": pad_c}
                if plan not in plans:
                    plans.append(plan)
        return plans[:plan_limit()]

    def launch_args(self, problem: Problem, knobs: Mapping[str, KnobValue]
                    ) -> tuple[tuple[int, int, int], dict[str, Any], tuple[int, ...]]:
        """(grid, compile-time arguments, run-time integer arguments: none) of a configuration; with PAD_C,
        of the padded copies it runs on."""
        pad_c = int(knobs.get("PAD_C", 0))
        live_k = problem.tensor("W").dims[3] * pad_c  # the rows walk: a span's elements that are real taps
        if pad_c:
            problem = channel_padded(problem, pad_c, rows=knobs["K_LOOP"] == "rows")
        x, w, y = problem.tensor("X"), problem.tensor("W"), problem.tensor("Y")
        batch, c, h, wd = x.dims
        k, _, r, s = w.dims
        _, _, p, q = y.dims
        crit = problem.criteria_dict
        bm, bn, bk = int(knobs["BLOCK_M"]), int(knobs["BLOCK_N"]), int(knobs["BLOCK_K"])
        grid = (-(-(batch * p * q) // bm) * -(-k // bn), 1, 1)
        wide = max(_max_offset(t.dims, t.strides) for t in (x, w, y)) >= 2**31 or batch * p * q * bn >= 2**31
        meta = {"R": r, "S": s, "STRIDE_H": crit["stride_h"], "STRIDE_W": crit["stride_w"], "PAD_H": crit["pad_h"],
                "PAD_W": crit["pad_w"], "DIL_H": crit["dilation_h"], "DIL_W": crit["dilation_w"],
                "FLAT": knobs["K_LOOP"] == "flat", "ROWS": knobs["K_LOOP"] == "rows", "LIVE_K": live_k,
                "EVEN_C": c % bk == 0, "WIDE_INDEX": wide,
                "TF32": problem.compute_dtype == "tf32", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                "GROUP_M": int(knobs["GROUP_M"]), "num_warps": int(knobs["num_warps"]),
                "num_stages": int(knobs["num_stages"])}
        names = ("BATCH", "C", "H", "W", "K", "P", "Q", "sxn", "sxc", "sxh", "sxw", "swk", "swc", "swr", "sws",
                 "syn", "syk", "syp", "syq")
        meta.update(zip(names, (batch, c, h, wd, k, p, q, *x.strides, *w.strides, *y.strides)))
        return grid, meta, ()

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        pad_c = int(knobs.get("PAD_C", 0))
        if not pad_c:
            return 0
        padded = channel_padded(problem, pad_c, rows=knobs.get("K_LOOP") == "rows")
        return sum(math.prod(padded.tensor(t).dims) * itemsize(padded.tensor(t).dtype) for t in ("X", "W"))

    def compile_key(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> str:
        """The kernel binary in Triton's disk cache (farm.tuner.compile_claims: one compile a host)."""
        _, meta, scalars = self.launch_args(problem, knobs)
        dtypes = tuple(TORCH_DTYPES[problem.tensor(t).dtype] for t in ("X", "W", "Y"))
        return triton_compile_key("triton.conv", device, dtypes, meta, scalars)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        kernel = _kernel()
        pad_c = int(knobs.get("PAD_C", 0))
        support = self.knob_support(problem, device, knobs)
        if not support:
            raise ValueError(f"triton.conv: {support.reason}")
        grid, meta, scalars = self.launch_args(problem, knobs)
        dtypes = tuple(TORCH_DTYPES[problem.tensor(t).dtype] for t in ("X", "W", "Y"))
        compiled = self._procs.compile(f"{__name__}:_kernel", kernel, dtypes, scalars, grid, meta)
        launch = direct_launcher(kernel, compiled, grid, meta, device.index)
        if not pad_c:
            def fn(t: Mapping[str, Any]) -> None:
                launch(t["X"], t["W"], t["Y"])

            return TorchPlan(fn, device)

        copies = PaddedCopies(problem, channel_padded(problem, pad_c, rows=knobs["K_LOOP"] == "rows"), device,
                              self._procs)

        def fn_padded(t: Mapping[str, Any]) -> None:
            launch(*copies.copy_in(t), t["Y"])

        return TorchPlan(fn_padded, device)


PAD_CHANNELS = (4, 8)  # PAD_C's non-zero choices: 8 and 16 bytes a pixel in fp16 / bf16
MAX_ROW_SPAN = 64  # the rows walk is listed where a filter row's span on the copy is at most this many elements


def row_span(s: int, pad_c: int) -> int:
    """Taps a filter row of S taps takes in the rows walk: the fewest >= S whose span of PAD_C channels each
    is a power of two of at least 16 elements (a tensor-core step); the extra taps have zero weights."""
    span = max(s, -(-16 // pad_c))
    while (span * pad_c) & (span * pad_c - 1):
        span += 1
    return span


def channel_padded(problem: Problem, pad_c: int, rows: bool = False) -> Problem:
    """The problem the kernel runs for PAD_C: X as [N, pad_c, H + 2 pad_h, W'] and W as [K, pad_c, R, S'],
    both channels-last and dense, no padding left to do; Y as the problem's. For the flat walk S' = S and
    W' = W + 2 pad_w; for the rows walk S' = ``row_span`` (zero taps added) and W' the columns those spans
    reach, even where that keeps Y's width (4-channel fp16 rows then start 16-byte aligned)."""
    n, _, h, w = problem.tensor("X").dims
    k, _, r, s = problem.tensor("W").dims
    crit = problem.criteria_dict
    y = problem.tensor("Y")
    hp, wp = h + 2 * crit["pad_h"], w + 2 * crit["pad_w"]
    if rows:
        if crit["dilation_w"] != 1:
            raise ValueError(f"the rows walk needs dilation_w = 1, not {crit['dilation_w']}")
        s = row_span(s, pad_c)
        wp = (y.dims[3] - 1) * crit["stride_w"] + s
        if wp % 2 and crit["stride_w"] > 1:
            wp += 1
    return Problem.create(
        "conv_fprop",
        {"X": {"dims": [n, pad_c, hp, wp], "strides": [hp * wp * pad_c, 1, wp * pad_c, pad_c]},
         "W": {"dims": [k, pad_c, r, s], "strides": [r * s * pad_c, 1, s * pad_c, pad_c]},
         "Y": {"dims": list(y.dims), "strides": list(y.strides)}},
        dtype=problem.dtype, compute_dtype=problem.compute_dtype,
        criteria={**crit, "pad_h": 0, "pad_w": 0})


class PaddedCopies:
    """The channels-last copies PAD_C runs on, written whole every call by one Triton launch (X's values and
    W's taps with zeros around them; 9 us for the stem's X where torch's strided copy took 17): a set per
    CUDA stream (``PerStream``), so calls on two streams at once do not share them. X's columns past the
    copy's width (no output reads them) are left out."""

    COPY_BLOCK = 256  # pixels a program

    def __init__(self, problem: Problem, padded: Problem, device: Device, procs: CompilePool) -> None:
        torch = torch_module()
        where = torch.device("cuda", device.index)
        x, w = problem.tensor("X"), problem.tensor("W")
        n, pad_c, hp, wp = padded.tensor("X").dims
        k, _, r, span = padded.tensor("W").dims
        _, c, h, wd = x.dims
        ph, pw = problem.criteria_dict["pad_h"], problem.criteria_dict["pad_w"]
        x_dtype, w_dtype = torch_dtype(x.dtype), torch_dtype(w.dtype)
        self._buffers = PerStream(lambda: (torch.empty((n, hp, wp, pad_c), dtype=x_dtype, device=where),
                                           torch.empty((k, r, span, pad_c), dtype=w_dtype, device=where)),
                                  device.index)
        block = self.COPY_BLOCK
        x_programs = -(-(n * hp * wp) // block)
        grid = (x_programs + -(-(k * r * span) // block), 1, 1)
        wide = max(_max_offset(x.dims, x.strides), n * hp * wp * pad_c + block * pad_c) >= 2**31
        meta = {"N": n, "C": c, "H": h, "COLS": max(0, min(wd, wp - pw)), "sxn": x.strides[0], "sxc": x.strides[1],
                "sxh": x.strides[2], "sxw": x.strides[3], "HP": hp, "WP": wp, "PH": ph, "PW": pw, "K": k, "R": r,
                "S": w.dims[3], "swk": w.strides[0], "swc": w.strides[1], "swr": w.strides[2], "sws": w.strides[3],
                "SPAN": span, "PC": pad_c, "X_PROGRAMS": x_programs, "WIDE_INDEX": wide, "BLOCK": block,
                "num_warps": 4}
        dtypes = (TORCH_DTYPES[x.dtype],) * 2 + (TORCH_DTYPES[w.dtype],) * 2
        kernel = _pad_kernel()
        compiled = procs.compile(f"{__name__}:_pad_kernel", kernel, dtypes, (), grid, meta)
        self._launch = direct_launcher(kernel, compiled, grid, meta, device.index)

    def copy_in(self, tensors: Mapping[str, Any]) -> tuple[Any, Any]:
        """X and W into this stream's copies; returns them (NHWC and KRSC: the kernel takes their data)."""
        x, w = self._buffers.get()
        self._launch(tensors["X"], x, tensors["W"], w)
        return x, w
