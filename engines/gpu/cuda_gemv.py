"""A CUDA C++ split-K GEMV for decode GEMMs of a few rows (M <= 8), compiled with NVRTC (cuda-python).

Where it stands: on the H200 a kernel that only reads the weights is fastest with one or a few 16-byte
loads per thread and the grid spread over all of B (benchmarks/decode_ceiling.py: 8 MB in 3.5 us, where
Triton's readers take 5.0); Triton's GEMMs sit at their readers' speed. This kernel reads B that way:
a thread takes 8 columns (16 bytes of a row) of ``KC`` rows per step, ``STEPS`` steps, all of a step's
loads issued before any is used, and multiplies them with A's rows on the CUDA cores (fp32 sums: few
rows of A make little arithmetic). A block is 32 x ``TY`` threads, 256 columns by ``TY * KC * STEPS``
rows of K; the ``TY`` sums are added in shared memory, each block stores its fp32 partial, and the last
block of a column strip to arrive (a counter per strip) sums the strip's partials, each thread a share of
the slices with its loads in flight together, the shares in a fixed order, adds the bias and writes C: one
launch, the same sum every run. Partials and counters are per CUDA stream
(``StreamScratch``, as the split-K Triton GEMM's). Compiled binaries are kept per configuration.

Measured on the H200 (benchmarks/RESULTS.md, fifth round): right, but not yet faster than the split-K Triton
GEMM (7.1 us against 5.9 at 1 x 4096 x 1024; reading B alone takes 3.5).
"""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Sequence

from farm.plugin import Device, Knob, KnobValue, Problem, Support

from ._common import GpuEngine, TorchPlan, current_raw_stream, torch_module
from .library_plans import PlanCache, plan_limit
from .nvrtc import Launcher, bindings, compile_function
from .triton_splitk import StreamScratch

MAX_M = 8  # rows of A: past this the CUDA cores' arithmetic, not the weights' bytes, sets the time
COLUMNS = 256  # a block's columns: 32 threads of 8
STATIC_SHARED = 48 * 1024

SOURCE = r"""
typedef unsigned short u16;

__device__ __forceinline__ float to_float(u16 v) {
#if IN_BF16
    return __uint_as_float(((unsigned int)v) << 16);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
#endif
}

__device__ __forceinline__ u16 from_float(float f) {
    u16 h;
#if IN_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
    return h;
}

extern "C" __global__ void __launch_bounds__(32 * TY)
gemv_splitk(const u16* __restrict__ A, const u16* __restrict__ B, u16* __restrict__ C, const u16* __restrict__ bias,
            float* __restrict__ partials, unsigned int* __restrict__ counters, int N, int K,
            long long lda, long long ldb, long long ldcm, long long ldcn) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int n0 = blockIdx.x * 256 + tx * 8;
    const bool in_n = n0 < N;  // N is a multiple of 8: a thread's 8 columns are all in or all out
    const int kblocks = gridDim.y;
    const int k_base = blockIdx.y * (TY * KC * STEPS);
    float acc[M_ROWS][8];
#pragma unroll
    for (int m = 0; m < M_ROWS; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][j] = 0.f;

#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
        uint4 v[KC];
#pragma unroll
        for (int i = 0; i < KC; ++i) {  // every load of the step in flight before the first is used
            const int k = k_base + (s * KC + i) * TY + ty;
            v[i] = (in_n && k < K) ? __ldcs(reinterpret_cast<const uint4*>(B + k * ldb + n0)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < KC; ++i) {
            const int k = k_base + (s * KC + i) * TY + ty;
            if (k < K) {
                const u16* b16 = reinterpret_cast<const u16*>(&v[i]);
                float b[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) b[j] = to_float(b16[j]);
#pragma unroll
                for (int m = 0; m < M_ROWS; ++m) {
                    const float a = to_float(__ldg(A + m * lda + k));
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[m][j] = fmaf(a, b[j], acc[m][j]);
                }
            }
        }
    }

#if TY > 1
    __shared__ float others[TY - 1][M_ROWS][256];
    if (ty > 0) {
#pragma unroll
        for (int m = 0; m < M_ROWS; ++m)
#pragma unroll
            for (int j = 0; j < 8; ++j) others[ty - 1][m][tx * 8 + j] = acc[m][j];
    }
    __syncthreads();
    if (ty == 0) {
        for (int t = 0; t < TY - 1; ++t)  // a fixed order: the same sum every run
#pragma unroll
            for (int m = 0; m < M_ROWS; ++m)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[m][j] += others[t][m][tx * 8 + j];
    }
#endif
    if (ty == 0 && in_n) {
#pragma unroll
        for (int m = 0; m < M_ROWS; ++m) {
            float4* p = reinterpret_cast<float4*>(partials + ((long long)blockIdx.y * M_ROWS + m) * N + n0);
            p[0] = make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
            p[1] = make_float4(acc[m][4], acc[m][5], acc[m][6], acc[m][7]);
        }
    }
    // The last block of this column strip to arrive sums the strip (CUDA's threadFenceReduction pattern):
    // the partial is visible device-wide before the block counts itself in.
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    if (tx == 0 && ty == 0) last = atomicAdd(counters + blockIdx.x, 1u) == (unsigned int)(kblocks - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Every thread of the last block sums its 8 columns over slices ty, ty + TY, ... (loads of several slices
    // in flight at once), then the TY sums are added in ty order: the same sum every run.
#pragma unroll
    for (int m = 0; m < M_ROWS; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][j] = 0.f;
    if (in_n) {
#pragma unroll 4
        for (int kb = ty; kb < kblocks; kb += TY) {
#pragma unroll
            for (int m = 0; m < M_ROWS; ++m) {
                const float4* p = reinterpret_cast<const float4*>(partials + ((long long)kb * M_ROWS + m) * N + n0);
                const float4 lo = __ldcg(p), hi = __ldcg(p + 1);
                acc[m][0] += lo.x; acc[m][1] += lo.y; acc[m][2] += lo.z; acc[m][3] += lo.w;
                acc[m][4] += hi.x; acc[m][5] += hi.y; acc[m][6] += hi.z; acc[m][7] += hi.w;
            }
        }
    }
#if TY > 1
    // `others` is free again: ty 0 read it before this block's partial was stored, two barriers ago
    if (ty > 0) {
#pragma unroll
        for (int m = 0; m < M_ROWS; ++m)
#pragma unroll
            for (int j = 0; j < 8; ++j) others[ty - 1][m][tx * 8 + j] = acc[m][j];
    }
    __syncthreads();
    if (ty == 0) {
        for (int t = 0; t < TY - 1; ++t)
#pragma unroll
            for (int m = 0; m < M_ROWS; ++m)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[m][j] += others[t][m][tx * 8 + j];
    }
#endif
    if (ty == 0 && in_n) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#if HAS_BIAS
            const float b = to_float(bias[n0 + j]);
#else
            const float b = 0.f;
#endif
#pragma unroll
            for (int m = 0; m < M_ROWS; ++m) C[m * ldcm + (n0 + j) * ldcn] = from_float(acc[m][j] + b);
        }
    }
    if (tx == 0 && ty == 0) counters[blockIdx.x] = 0;  // left at zero for the stream's next call
}
"""


class CudaGemv(GpuEngine):
    """matmul of A with at most 8 rows against a row-major B, in CUDA C++ (NVRTC); fp16 / bf16, fp32 sums."""

    name = "cuda.gemv"
    ops = frozenset({"matmul"})
    priority = 53
    storage_dtypes = frozenset({"fp16", "bf16"})

    knobs = (
        Knob.int("KC", 8, choices=(1, 2, 4, 8), doc="rows of B a thread loads at once (16 bytes each)"),
        Knob.int("TY", 4, choices=(1, 2, 4, 8), doc="threads of a block along K (32 along N)"),
        Knob.int("STEPS", 1, choices=(1, 2, 4, 8), doc="loads of KC rows a thread makes one after another"),
    )

    def __init__(self) -> None:
        self._functions: PlanCache[Any] = PlanCache()

    def supports(self, problem: Problem, device: Device) -> Support:
        if device.vendor != "nvidia":
            return Support.no("CUDA C++ compiled with NVRTC: NVIDIA GPUs only")
        found, why = bindings()
        if found is None:
            return Support.no(why)
        arch = device.properties.arch
        if not arch.startswith("sm_") or not arch[3:].isdigit() or int(arch[3:-1]) < 8:  # sm_<major><minor>
            return Support.no(f"needs sm_80 or newer (bf16 conversions), not {arch}")
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        if len(a.dims) != 2 or len(b.dims) != 2:
            return Support.no("2-D A and B only")
        if len({t.dtype for t in problem.tensors}) != 1:
            return Support.no("A, B, C (and bias) of one dtype")
        if problem.compute_dtype != "fp32":
            return Support.no(f"sums in fp32, not {problem.compute_dtype}")
        m, k = a.dims
        n = b.dims[1]
        if m > MAX_M:
            return Support.no(f"M={m} rows: the CUDA-core GEMV is for M <= {MAX_M}")
        if a.strides[1] != 1 or b.strides[1] != 1:
            return Support.no("A and B row-major (unit stride along K for A, along N for B)")
        if n % 8 or b.strides[0] % 8:
            return Support.no(f"N={n} and B's row stride {b.strides[0]} must be multiples of 8 (16-byte loads)")
        if c.dims != (m, n):
            return Support.no("C is M x N")
        return Support.yes()

    def knob_support(self, problem: Problem, device: Device, knobs: Mapping[str, KnobValue]) -> Support:
        m = problem.tensor("A").dims[0]
        ty = int(knobs.get("TY", 4))
        need = (ty - 1) * m * COLUMNS * 4
        if need > STATIC_SHARED:
            return Support.no(f"TY={ty} with M={m} needs {need} bytes of shared memory (at most {STATIC_SHARED})")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> Sequence[Mapping[str, KnobValue]]:
        """Blocks of the most threads along K that shared memory allows, 4 or 8 rows in flight a thread, 1-4
        steps: those that split K into 16 to 256 slices (the H200's fastest were all among them)."""
        k = problem.tensor("A").dims[1]
        ty = next((t for t in (8, 4, 2) if self.knob_support(problem, device, {"TY": t})), 1)
        plans = []
        for kc in (8, 4):
            for steps in (1, 2, 4):
                if 16 <= -(-k // (kc * ty * steps)) <= 256:
                    plans.append({"KC": kc, "TY": ty, "STEPS": steps})
        return plans[:plan_limit()]

    @staticmethod
    def _grid(problem: Problem, knobs: Mapping[str, KnobValue]) -> tuple[int, int]:
        """(column strips, K slices)."""
        k = problem.tensor("A").dims[1]
        n = problem.tensor("B").dims[1]
        rows = int(knobs["KC"]) * int(knobs["TY"]) * int(knobs["STEPS"])
        return -(-n // COLUMNS), -(-k // rows)

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        knobs = {kn.name: knobs.get(kn.name, kn.default) for kn in self.knobs}
        strips, slices = self._grid(problem, knobs)
        m = problem.tensor("A").dims[0]
        return slices * m * problem.tensor("B").dims[1] * 4 + StreamScratch.SLOTS * strips * 4

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        m, k = a.dims
        n = b.dims[1]
        has_bias = problem.has_tensor("bias")
        key = (device.properties.arch, device.index, m, a.dtype, has_bias, int(knobs["KC"]), int(knobs["TY"]),
               int(knobs["STEPS"]))
        function = self._functions.get(key, lambda: _compile(key))
        strips, slices = self._grid(problem, knobs)
        scratch = StreamScratch(torch, device.index, (slices, m, n), strips, owner=self.name)
        ty = int(knobs["TY"])
        scalars = ((n, ctypes.c_int), (k, ctypes.c_int), (a.strides[0], ctypes.c_longlong),
                   (b.strides[0], ctypes.c_longlong), (c.strides[0], ctypes.c_longlong),
                   (c.strides[1], ctypes.c_longlong))
        launch = Launcher(function, 6, scalars, current_raw_stream(torch), device.index, self.name)

        def fn(t: Mapping[str, Any]) -> None:
            A, B, C = t["A"], t["B"], t["C"]
            if B.data_ptr() % 16:  # a view that starts mid-row: 16-byte loads would fault
                torch.matmul(A, B, out=C)
                if has_bias:
                    C.add_(t["bias"])
                return
            parts, counters = scratch.get()
            bias = t["bias"].data_ptr() if has_bias else 0
            launch((strips, slices, 1), (32, ty, 1),
                   (A.data_ptr(), B.data_ptr(), C.data_ptr(), bias, parts.data_ptr(), counters.data_ptr()))

        plan = TorchPlan(fn, device)
        plan.scratch = scratch  # held as long as the plan
        return plan


def _compile(key: tuple) -> Any:
    """The kernel compiled for one configuration and loaded into the device's primary context."""
    arch, index, m, dtype, has_bias, kc, ty, steps = key
    defines = {"M_ROWS": m, "IN_BF16": int(dtype == "bf16"), "HAS_BIAS": int(has_bias), "KC": kc, "TY": ty,
               "STEPS": steps}
    return compile_function(SOURCE, "gemv_splitk", arch, index, defines)
