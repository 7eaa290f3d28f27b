"""A Triton GEMM with the canonical autotuning knobs: BLOCK_M/N/K, GROUP_M, num_warps, num_stages.

Grouped tile order, masked edges (odd sizes), batched over the grid's second
axis (B may be shared by the batch), an optional bias epilogue, fp32
accumulation. Compiling (``JITFunction.warmup``, no launch, no allocation) is
what EXHAUSTIVE mode's priming does before timing; a configuration that needs
more shared memory than the device has fails at compile time with the
compiler's reason, and becomes a failed row.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from farm.plugin import Device, Knob, KnobValue, Problem, Support, contiguous_strides, gil_heavy_section, itemsize

from ._common import (
    TORCH_DTYPES,
    TRITON_COMPILE_LOCK,
    GpuEngine,
    TorchPlan,
    ZeroPaddedAB,
    current_raw_stream,
    gemm_mkn,
    round_up,
    torch_module,
    triton_compile_key,
)
from .library_plans import plan_limit

log = logging.getLogger("farm.engines.gpu")

COMPILE_PROCS_ENV = "FARM_TRITON_COMPILE_PROCS"


def _warmup_in_worker(kernel: str, dtypes: tuple[str, ...], scalars: tuple[int, ...], grid: tuple[int, ...],
                      meta: dict[str, Any]) -> None:
    """Compile one configuration of ``kernel`` ("module:factory") in a pool process: the binary lands in the
    shared Triton disk cache."""
    import importlib

    import torch

    module, factory = kernel.split(":")
    jit_fn = getattr(importlib.import_module(module), factory)()
    jit_fn.warmup(*(getattr(torch, d) for d in dtypes), *scalars, grid=grid, **meta)


def _ready_in_worker() -> None:
    """Import what a compile needs and compile one tiny configuration, so the process's first real
    compile does not pay what every process pays once: Triton's hash of its own library (hundreds of
    MB), the kernel's source hash, the driver's start and the backend's tool checks."""
    import torch

    kernel = _kernel()
    try:
        kernel.warmup(*[torch.float16] * 4, 32, 32, 32, 32, 0, 32, 1, 0, 32, 1, 0, 32, 1, grid=(4, 1, 1),
                      HAS_BIAS=False, TF32=False, EVEN_K=True, CONTIG_N=True, BLOCK_M=16, BLOCK_N=16,
                      BLOCK_K=16, GROUP_M=1, num_warps=1, num_stages=1)
    except Exception:  # a warm-up, not a compile anyone waits for
        pass


POOL_OPT_IN_ENV = "FARM_TRITON_COMPILE_POOL"


class CompilePool:
    """Worker processes that compile Triton configurations in parallel (as Inductor's compile workers do).

    Triton's compiler holds the GIL for most of its work, so threads would compile one at a time.
    The pool starts only where tuning asks for it: a farm GPU worker as it starts, ``farm tune
    --in-process`` on a GPU, ``Autotuner.autotune()`` on a GPU (all through TritonGemm.prepare), or a process
    that sets
    FARM_TRITON_COMPILE_POOL=1, at its first slow (cold-cache) compile. A replay process (farm.ops)
    never gets processes it did not ask for: it compiles in-process. Compiles go to the pool once
    its processes have imported torch and Triton; until then they stay in-process, so a pool that
    is still starting never delays anything. FARM_TRITON_COMPILE_PROCS sets the size (default 4;
    0 compiles in-process only).
    """

    COLD_S = 0.25  # an in-process compile slower than this means the disk cache is cold

    def __init__(self) -> None:
        self._pool: Any = None
        self._lock = threading.Lock()
        self._broken = False
        self._starting = False
        self._ready = threading.Event()

    @staticmethod
    def size() -> int:
        import os

        return int(os.environ.get(COMPILE_PROCS_ENV, "4") or 0)

    def start(self) -> None:
        """Start the pool now, in the background (a farm worker that will compile for a while)."""
        with self._lock:
            if self._starting or self._broken or self.size() <= 0:
                return
            self._starting = True
        threading.Thread(target=self._start, daemon=True, name="triton-compile-pool").start()

    def saw_compile(self, seconds: float) -> None:
        """Record an in-process compile's duration; a slow one starts the pool where the process opted in."""
        import os

        if seconds > self.COLD_S and os.environ.get(POOL_OPT_IN_ENV, "").strip() in ("1", "true", "yes", "on"):
            self.start()

    def _start(self) -> None:
        with self._lock:
            if self._pool is not None or self._broken:
                return
            import concurrent.futures
            import multiprocessing

            try:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    self.size(), mp_context=multiprocessing.get_context("spawn"))
                warm = [self._pool.submit(_ready_in_worker) for _ in range(self.size())]
            except Exception:
                self._broken = True
                return
        try:
            warm[0].result()
            self._ready.set()
        except Exception:
            self._broken = True

    def submit(self, *args: Any) -> Any:
        """A future compiling in a pool process, or None (compile in-process): no pool, or not ready yet."""
        if not self._ready.is_set() or self._broken:
            return None
        try:
            return self._pool.submit(_warmup_in_worker, *args)
        except Exception:  # a broken pool costs parallelism, never correctness
            self._broken = True
            return None

    def compile(self, kernel: str, jit_fn: Any, dtype_names: tuple[str, ...], scalars: tuple[int, ...],
                grid: tuple[int, int, int], meta: Mapping[str, Any]) -> Any:
        """The compiled configuration, its binary loaded: built in a pool process when the pool is up (then
        loaded here from Triton's disk cache), else in this process. ``kernel`` names ``jit_fn``'s factory
        ("module:function") for the pool's processes."""
        dtypes = tuple(getattr(torch_module(), n) for n in dtype_names)
        compiled, done = None, False
        while not done:
            future = self.submit(kernel, dtype_names, scalars, grid, dict(meta))
            if future is not None:
                try:
                    future.result()
                except Exception:
                    pass  # the in-process compile below reports the real error
                # a cache hit now; Triton's in-process compile is not thread-safe
                with TRITON_COMPILE_LOCK, gil_heavy_section():
                    compiled, done = jit_fn.warmup(*dtypes, *scalars, grid=grid, **meta), True
            elif TRITON_COMPILE_LOCK.acquire(timeout=0.05):  # wake up now and then: the pool may have become ready
                try:
                    with gil_heavy_section():
                        t0 = time.perf_counter()
                        compiled, done = jit_fn.warmup(*dtypes, *scalars, grid=grid, **meta), True
                        self.saw_compile(time.perf_counter() - t0)
                finally:
                    TRITON_COMPILE_LOCK.release()
        load_binary(compiled)
        return compiled


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def gemm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, NB,
                    stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn,
                    stride_cb, stride_cm, stride_cn,
                    HAS_BIAS: tl.constexpr, TF32: tl.constexpr, EVEN_K: tl.constexpr, CONTIG_N: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        batch = tl.program_id(1)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        in_group = GROUP_M * num_pid_n
        first_m = (pid // in_group) * GROUP_M
        group_m = min(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((pid % in_group) % group_m)
        pid_n = (pid % in_group) // group_m
        rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # wrapped rows load valid memory; masked at the store
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % NB  # NB >= N: B's columns a tile may read
        if CONTIG_N:  # BLOCK_N divides NB: each tile reads one aligned run of B's row (vector loads)
            rn = tl.max_contiguous(tl.multiple_of(rn, BLOCK_N), BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + batch * stride_ab + rm[:, None] * stride_am + rk[None, :] * stride_ak
        b_ptrs = b_ptr + batch * stride_bb + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                k_left = K - k * BLOCK_K
                a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
                b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
            if TF32:
                acc = tl.dot(a, b, acc, input_precision="tf32")
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if HAS_BIAS:
            bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
            acc += bias[None, :]
        om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + batch * stride_cb + om[:, None] * stride_cm + on[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(om[:, None] < M) & (on[None, :] < N))

    return gemm_kernel


def triton_dot_support(problem: Problem) -> Support:
    """What a Triton GEMM needs of any problem: Triton installed, and a dtype its fp32-accumulating dot serves."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return Support.no("triton is not installed (pip install 'tunefarm[triton]')")
    if problem.dtype == "fp32" and problem.compute_dtype != "tf32":
        return Support.no("Triton's fp32 dot is TF32; strict fp32 problems are left to cuBLAS")
    if problem.compute_dtype not in ("fp32", "tf32"):
        return Support.no(f"accumulates in fp32, not {problem.compute_dtype}")
    return Support.yes()


def load_binary(compiled: Any) -> None:
    """Load a compiled kernel's binary: too much shared memory or too many registers raise here, at compile time.
    Call it outside gil_heavy_section(), which it enters (the section is not reentrant)."""
    init = getattr(compiled, "_init_handles", None)
    if callable(init):
        with gil_heavy_section():
            init()


def _hook_set(hook: Any) -> bool:
    """A launch hook is in force: a function, or a chain of them (Triton 3.6 keeps an empty ``HookChain`` there
    always, which a None test took for a hook: every launch went through the JIT)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def direct_launcher(jit_fn: Any, compiled: Any, grid: tuple[int, int, int], meta: Mapping[str, Any],
                    device_index: int) -> Callable[..., None]:
    """``launch(*args)``: the compiled kernel launched straight through its launcher on the caller's stream,
    without the JIT's per-call argument binding and cache lookup (a few microseconds a launch, which a
    replayed skinny GEMM notices). ``args`` are the non-constexpr arguments; the compile-time ones come
    from ``meta``. Falls back to ``jit_fn[grid]`` where this Triton's objects differ or a launch hook is
    set (a profiler's)."""
    names = list(getattr(jit_fn, "arg_names", ()))
    given = [n for n in names if n not in meta]
    tail = tuple(meta[n] for n in names[len(given):]) if names[:len(given)] == given else None
    run, function, packed = (getattr(compiled, a, None) for a in ("run", "function", "packed_metadata"))
    try:
        from triton import knobs as triton_knobs

        hooked = _hook_set(triton_knobs.runtime.launch_enter_hook) or _hook_set(triton_knobs.runtime.launch_exit_hook)
    except (ImportError, AttributeError):
        hooked = True
    raw_stream = current_raw_stream(torch_module())
    if tail is None or run is None or function is None or packed is None or hooked:
        why = "a launch hook is set" if hooked else "this Triton's compiled kernels differ from what it knows"
        log.info("autotune: %s launches through Triton's JIT (%s): some microseconds more a call",
                 getattr(jit_fn, "__name__", jit_fn), why)
        slow = jit_fn[grid]
        return lambda *args: slow(*args, **meta)
    g0, g1, g2 = grid

    def launch(*args: Any) -> None:
        run(g0, g1, g2, raw_stream(device_index), function, packed, None, None, None, *args, *tail)

    return launch


def _strides(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int, int]:
    """(batch, row, column) strides; batch 0 for a 2-D (shared) operand."""
    return (strides[0] if len(dims) == 3 else 0, strides[-2], strides[-1])


@dataclass(frozen=True)
class GemmLayout:
    """What the kernel reads and writes: sizes, (batch, row, column) strides, and ``n_b``, the
    columns of B a tile may read (N, or the width of a padded copy; C gets N columns)."""

    m: int
    n: int
    k: int
    batch: int
    a: tuple[int, int, int]
    b: tuple[int, int, int]
    c: tuple[int, int, int]
    n_b: int = 0  # 0: N

    @classmethod
    def of(cls, problem: Problem) -> "GemmLayout":
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        return cls(a.dims[-2], c.dims[-1], a.dims[-1], a.dims[0] if len(a.dims) == 3 else 1,
                   _strides(a.dims, a.strides), _strides(b.dims, b.strides), _strides(c.dims, c.strides))

    def contig_n(self, block_n: int) -> bool:
        """Whether a tile's B column indices may be declared one contiguous, aligned run (vector loads):
        B's rows are unit-stride and no tile wraps around (BLOCK_N divides the columns read)."""
        return self.b[2] == 1 and (self.n_b or self.n) % block_n == 0

    def scalars(self) -> tuple[int, ...]:
        return (self.m, self.n, self.k, self.n_b or self.n, *self.a, *self.b, *self.c)


# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps): the configurations Inductor's max-autotune times for a
# GEMM (torch/_inductor/template_heuristics), its five smallest tiles last (a FARM_LIBRARY_PLANS cut drops those)
LISTED_CONFIGS = (
    (64, 64, 16, 2, 4), (64, 64, 32, 2, 4), (64, 64, 64, 3, 8), (64, 64, 128, 5, 4), (64, 128, 32, 3, 4),
    (64, 128, 32, 4, 8), (64, 128, 64, 3, 4), (64, 128, 128, 4, 4), (128, 64, 32, 3, 4), (128, 64, 32, 4, 8),
    (128, 128, 32, 2, 8), (128, 128, 32, 3, 4), (128, 128, 64, 3, 4), (128, 128, 64, 5, 8), (128, 128, 128, 4, 8),
    (128, 256, 64, 4, 8),
    (32, 32, 16, 1, 2), (32, 32, 128, 2, 4), (32, 64, 32, 5, 8), (64, 32, 32, 5, 8), (64, 32, 128, 5, 4),
)


def cap_tile(block: int, size: int) -> int:
    """A tile side no longer than ``size`` needs: its power of two, at least 16."""
    return min(block, max(16, 1 << max(0, size - 1).bit_length()))


def pipeline_bytes(block_m: int, block_n: int, block_k: int, stages: int, itemsize: int) -> int:
    """Shared memory a pipelined dot loop holds: ``stages`` copies of an A and a B tile (what Triton asks for)."""
    return stages * (block_m * block_k + block_k * block_n) * itemsize


@functools.lru_cache(maxsize=None)
def _shared_memory_of(index: int) -> int | None:
    try:
        from triton.runtime import driver

        return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # no Triton driver here: nothing is left out, a tile too large fails at compile
        return None


def shared_memory_bytes(device: Device | None) -> int | None:
    """The shared memory a kernel may use on ``device`` (Triton's driver says), or None where unknown."""
    return None if device is None else _shared_memory_of(device.index)


def listed_tiles(m: int, n: int, k: int, item_bytes: int = 2, shared_memory: int | None = None
                 ) -> list[dict[str, KnobValue]]:
    """LISTED_CONFIGS for an M x N x K product: each tile side cut to the size's power of two (at least 16),
    warps cut to one per 256 tile elements (at least 2), those whose pipeline does not fit ``shared_memory``
    left out, duplicates dropped; order kept."""
    plans: list[dict[str, KnobValue]] = []
    for bm, bn, bk, stages, warps in LISTED_CONFIGS:
        bm, bn, bk = cap_tile(bm, m), cap_tile(bn, n), cap_tile(bk, k)
        if shared_memory is not None and pipeline_bytes(bm, bn, bk, stages, item_bytes) > shared_memory:
            continue
        plan = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                "num_warps": max(2, min(warps, bm * bn // 256)), "num_stages": stages}
        if plan not in plans:
            plans.append(plan)
    return plans


class TritonGemm(GpuEngine):
    """matmul (plain, batched, +bias) in Triton; fp16 / bf16, or fp32 data with tf32 compute."""

    name = "triton.gemm"
    ops = frozenset({"matmul"})
    priority = 50
    supports_exhaustive = True

    def __init__(self, compile_pool: CompilePool | None = None) -> None:
        self._procs = compile_pool or CompilePool()

    @property
    def compile_pool(self) -> CompilePool:
        return self._procs

    knobs = (
        Knob.int("BLOCK_M", 128, choices=(16, 32, 64, 128, 256)),
        Knob.int("BLOCK_N", 128, choices=(16, 32, 64, 128, 256)),
        Knob.int("BLOCK_K", 64, choices=(16, 32, 64, 128)),
        Knob.int("GROUP_M", 8, choices=(1, 4, 8, 16), doc="tile rows per group (L2 reuse)"),
        Knob.int("num_warps", 4, choices=(2, 4, 8, 16)),
        Knob.int("num_stages", 3, choices=(1, 2, 3, 4, 5, 6), doc="software pipeline depth"),
    )

    def supports(self, problem: Problem, device: Device) -> Support:
        base = triton_dot_support(problem)
        if not base:
            return base
        a, b = problem.tensor("A"), problem.tensor("B")
        if len(a.dims) > 3 or len(b.dims) > 3:
            return Support.no("at most one batch dimension")
        for t in (a, b, problem.tensor("C")):
            if 1 not in t.strides[-2:]:
                return Support.no(f"tensor {t.id} has no unit-stride dimension among its last two")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> Sequence[Mapping[str, KnobValue]]:
        """The tile configurations an autotuner times for this size (``listed_tiles``; the first
        FARM_LIBRARY_PLANS of them), beside the default."""
        m, k, n = gemm_mkn(problem)
        item_bytes = max(itemsize(problem.tensor(t).dtype) for t in ("A", "B"))
        return listed_tiles(m, n, k, item_bytes, shared_memory_bytes(device))[:plan_limit()]

    def layout(self, problem: Problem) -> GemmLayout:
        """The operands the kernel sees: the problem's own tensors."""
        return GemmLayout.of(problem)

    def _call(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> tuple[tuple[int, ...], dict[str, Any], Any]:
        lay = self.layout(problem)
        block_n, block_k = int(knobs["BLOCK_N"]), int(knobs["BLOCK_K"])
        grid = (-(-lay.m // int(knobs["BLOCK_M"])) * -(-lay.n // block_n), lay.batch, 1)
        meta = {"HAS_BIAS": problem.has_tensor("bias"), "TF32": problem.compute_dtype == "tf32",
                "EVEN_K": lay.k % block_k == 0, "CONTIG_N": lay.contig_n(block_n),
                "BLOCK_M": int(knobs["BLOCK_M"]), "BLOCK_N": block_n, "BLOCK_K": block_k,
                "GROUP_M": int(knobs["GROUP_M"]), "num_warps": int(knobs["num_warps"]),
                "num_stages": int(knobs["num_stages"])}
        return grid, meta, lay.scalars()

    def prepare(self, device_kind: str) -> None:
        """Start the compile pool in the background: a farm GPU worker whose workload selects this
        engine calls this as it starts (``device_kind`` is the worker's kind: gpu, cpu or sim)."""
        import importlib.util

        if device_kind == "gpu" and importlib.util.find_spec("triton") is not None:
            self._procs.start()

    def compile_key(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> str:
        """Names the kernel binary in Triton's disk cache: dtypes, constexprs, and the integer
        arguments' specialisation (==1, divisible by 16), not the shape itself."""
        _, meta, scalars = self._call(problem, knobs)
        # "triton.gemm" for both engines: the padded one launches the same kernel binary
        return triton_compile_key("triton.gemm", device, self._dtype_names(problem), meta, scalars)

    @staticmethod
    def _dtype_names(problem: Problem) -> tuple[str, ...]:
        bias = problem.tensor("bias").dtype if problem.has_tensor("bias") else problem.dtype
        return tuple(TORCH_DTYPES[d] for d in (problem.tensor("A").dtype, problem.tensor("B").dtype,
                                               problem.tensor("C").dtype, bias))

    def _launcher(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> Any:
        """Compile the configuration (pool or in-process) and return ``launch(A, B, C, bias)``."""
        kernel = _kernel()
        grid, meta, scalars = self._call(problem, knobs)
        compiled = self._procs.compile(f"{__name__}:_kernel", kernel, self._dtype_names(problem), scalars, grid, meta)
        launch = direct_launcher(kernel, compiled, grid, meta, device.index)

        def run(a: Any, b: Any, c: Any, bias: Any) -> None:
            launch(a, b, c, bias, *scalars)

        return run

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        launch = self._launcher(problem, knobs, device)
        has_bias = problem.has_tensor("bias")

        def fn(t: Mapping[str, Any]) -> None:
            launch(t["A"], t["B"], t["C"], t["bias"] if has_bias else t["C"])

        return TorchPlan(fn, device)


def _vector_loads(strides: tuple[int, int, int]) -> bool:
    """A 2-D operand's (batch, row, column) strides allow 16-element vector loads: one of its two strides is 1
    and the other (its leading dimension) a multiple of 16."""
    _, rows, cols = strides
    return (cols == 1 and rows % 16 == 0) or (rows == 1 and cols % 16 == 0)


class TritonGemmPadded(TritonGemm):
    """The Triton GEMM on zero-padded copies of A and B, writing C in place (Inductor's pad_mm, fused
    with the GEMM's own masked store instead of a copy out).

    Where K or N is not a multiple of 16, or A's or B's rows do not start 16-element aligned, the
    plain kernel cannot use vector loads. This engine copies A and B into buffers with K padded to
    a multiple of 128 (the largest BLOCK_K: no K masks) and N to a multiple of 256 (the largest
    BLOCK_N), with one launch of a Triton copy kernel (``triton_pad``); C is written where the
    problem puts it. The copies are part of every run, measured with the GEMM; the buffers are held by the plan,
    a set per stream (``estimate_workspace`` counts one).
    """

    name = "triton.gemm_padded"
    priority = 55
    PAD_K, PAD_N = 128, 256

    def supports(self, problem: Problem, device: Device) -> Support:
        base = super().supports(problem, device)
        if not base:
            return base
        lay = GemmLayout.of(problem)
        if lay.k % 16 == 0 and lay.n % 16 == 0 and _vector_loads(lay.a) and _vector_loads(lay.b):
            # a transposed operand (nn.Linear's weight as B = W.T) with an aligned leading dimension loads as
            # vectors along its unit stride too: a padded copy would only add a copy of it (3-5x slower for a
            # decode GEMM, measured on the H200)
            return Support.no(f"K={lay.k} and N={lay.n} are multiples of 16 and A's and B's leading dimensions are "
                              "aligned: nothing to align")
        return Support.yes()

    def _shapes(self, problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...]]:
        m, k, n = gemm_mkn(problem)
        kp, np_ = round_up(k, self.PAD_K), round_up(n, self.PAD_N)
        return (*problem.tensor("A").dims[:-2], m, kp), (*problem.tensor("B").dims[:-2], kp, np_)

    def layout(self, problem: Problem) -> GemmLayout:
        a_shape, b_shape = self._shapes(problem)
        own = GemmLayout.of(problem)
        a_strides = contiguous_strides(a_shape)
        b_strides = contiguous_strides(b_shape)
        return GemmLayout(own.m, own.n, a_shape[-1], own.batch, _strides(a_shape, a_strides),
                          _strides(b_shape, b_strides), own.c, n_b=b_shape[-1])

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        return ZeroPaddedAB.nbytes(problem, *self._shapes(problem))

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        launch = self._launcher(problem, knobs, device)
        ab = ZeroPaddedAB(problem, device, *self._shapes(problem))
        ab.use_pad_kernel()
        has_bias = problem.has_tensor("bias")

        def fn(t: Mapping[str, Any]) -> None:
            a, b = ab.copy_in(t)
            launch(a, b, t["C"], t["bias"] if has_bias else t["C"])

        return TorchPlan(fn, device)
