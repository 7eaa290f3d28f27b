"""A CUDA C++ tensor-core GEMM for decode (A of at most 16 rows), compiled with NVRTC (cuda-python).

The weights B (K x N, row-major) are read the way the fastest kernel that only reads them does on the H200
(benchmarks/decode_ceiling.py): 16-byte loads straight into registers, every load of a step issued before
any is used, the grid spread over all of B. No shared-memory staging: the MMA's B fragment wants pairs of
consecutive k in a register while B is contiguous along n, so columns are permuted instead: in a warp's
64-column strip, n8 tile ``t`` column ``c`` is column ``8c + t``. A lane then owns 8 adjacent columns (one
16-byte load a row) across the 8 tiles, and two loaded rows pack into its fragment with one byte permute.
A's rows are the MMA's M (16 a group, rows past M are zeros), sums in fp32 (``mma.sync`` m16n8k16).

A block's ``WARPS`` warps take consecutive K chunks of ``KS`` x 16 rows of one strip; a step covers
``CL`` blocks' worth, and a thread prefetches its next step's loads before using the current ones. The warps'
sums meet in shared memory; the ``CL`` blocks of a strip along K form a thread-block cluster (sm_90) and sum
each other's results through distributed shared memory, each block a share of the strip's outputs, in a fixed
order: one launch, no workspace, no atomics, the same bits every call. Sizes and strides are compiled in (a kernel
per shape): addresses are a lane's base plus constants.

Measured on the H200 (benchmarks/RESULTS.md, sixth round): the farm's winner at 1 x 4096 x 1024 (5.7 us against
eager's 7.5); level with torch.matmul and the split-K Triton GEMM at M = 1 on wider shapes, behind them at M = 16.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from farm.plugin import Device, Knob, KnobValue, Problem, Support

from ._common import GpuEngine, TorchPlan, current_raw_stream, torch_module
from .library_plans import PlanCache, plan_limit
from .nvrtc import Launcher, bindings, compile_function

MAX_M = 16  # one MMA row group. The kernel takes more groups (right at M = 37 and 64 on the H200) but loses to
# cuBLAS there 2x: each 64-column strip re-reads all of A, as many bytes as B at 64 rows and 1,024 columns. More
# groups would also need limits on KS (registers) and WARPS (48 KB of static shared memory) in knob_support.
STRIP = 64  # columns a warp (and a block) covers

SOURCE = r"""
typedef unsigned short u16;
typedef unsigned int u32;

#define GROUPS ((M_ROWS + 15) / 16)

// the problem's sizes and strides are compiled in (a kernel per shape): addresses are a lane's base plus
// constants, and bounds checks that cannot fail drop out
constexpr int K = K_SIZE, N = N_SIZE;
constexpr long long LDA = LDA_, LDB = LDB_, LDCM = LDCM_, LDCN = LDCN_;
constexpr int ROWS_STEP = CL * WARPS * KS * 16;  // rows of B a cluster reads a step
constexpr int STEPS = (K + ROWS_STEP - 1) / ROWS_STEP;
constexpr bool K_EXACT = K % ROWS_STEP == 0, N_EXACT = N % 64 == 0;

#if CL > 1
#define CLUSTER_DIMS __cluster_dims__(1, CL, 1)
#else
#define CLUSTER_DIMS
#endif

__device__ __forceinline__ float to_float(u16 v) {
#if IN_BF16
    return __uint_as_float(((u32)v) << 16);
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

// A[m][k], A[m][k + 1] packed (k in the low half) from p = &A[m][k]; rows past M and columns past K are zeros
__device__ __forceinline__ u32 a_pair(const u16* __restrict__ p, int m, int k) {
    if (m >= M_ROWS) return 0u;
#if A_PAIRS
    return (K_EXACT || k < K) ? __ldg(reinterpret_cast<const u32*>(p)) : 0u;
#else
    const u32 lo = (K_EXACT || k < K) ? (u32)__ldg(p) : 0u;
    const u32 hi = (K_EXACT || k + 1 < K) ? (u32)__ldg(p + 1) : 0u;
    return lo | (hi << 16);
#endif
}

__device__ __forceinline__ u32 word(const uint4& v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if IN_BF16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
#endif
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct Loads {
    uint4 b[KS][4];         // rows k0 + 2 tig + {0, 1, 8, 9} of each 16-row chunk, this lane's 8 columns
    u32 a[KS][GROUPS][4];   // the A fragment of each chunk and group of 16 rows
};

// One step's loads of a lane: a = &A[g][k], b = &B[k][n0], k its first row (k_first + 2 tig + the step's rows)
__device__ __forceinline__ void load_step(Loads& L, const u16* __restrict__ a, const u16* __restrict__ b, int k,
                                          bool in_n, int g) {
#pragma unroll
    for (int i = 0; i < KS; ++i) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int off = i * 16 + (r & 1) + 8 * (r >> 1);
            const bool ok = (N_EXACT || in_n) && (K_EXACT || k + off < K);
            L.b[i][r] = ok ? __ldcs(reinterpret_cast<const uint4*>(b + off * LDB)) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int gi = 0; gi < GROUPS; ++gi) {
            const u16* p = a + gi * 16 * LDA + i * 16;
            const int m = gi * 16 + g, kk = k + i * 16;
            L.a[i][gi][0] = a_pair(p, m, kk);
            L.a[i][gi][1] = a_pair(p + 8 * LDA, m + 8, kk);
            L.a[i][gi][2] = a_pair(p + 8, m, kk + 8);
            L.a[i][gi][3] = a_pair(p + 8 * LDA + 8, m + 8, kk + 8);
        }
    }
}

__device__ __forceinline__ void multiply(float (&acc)[GROUPS][8][4], const Loads& L) {
#pragma unroll
    for (int i = 0; i < KS; ++i) {
#pragma unroll
        for (int t = 0; t < 8; ++t) {  // n8 tile t: this lane's column t of its 8 (element t of each load)
            const u32 sel = (t & 1) ? 0x7632u : 0x5410u;
            const u32 b0 = __byte_perm(word(L.b[i][0], t >> 1), word(L.b[i][1], t >> 1), sel);
            const u32 b1 = __byte_perm(word(L.b[i][2], t >> 1), word(L.b[i][3], t >> 1), sel);
#pragma unroll
            for (int gi = 0; gi < GROUPS; ++gi) mma(acc[gi][t], L.a[i][gi], b0, b1);
        }
    }
}

__device__ __forceinline__ void cluster_sync() {
#if CL > 1
    asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
#else
    __syncthreads();
#endif
}

__device__ __forceinline__ u32 cluster_rank() {
#if CL > 1
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
#else
    return 0u;
#endif
}

// store v at the address p has in this block's shared memory, in block `rank` of this cluster
__device__ __forceinline__ void store_to(float* p, u32 rank, float v) {
#if CL > 1
    const u32 local = (u32)__cvta_generic_to_shared(p);
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(v) : "memory");
#else
    *p = v;
#endif
}

extern "C" __global__ void __launch_bounds__(32 * WARPS, 1) CLUSTER_DIMS
decode_gemm(const u16* __restrict__ A, const u16* __restrict__ B, u16* __restrict__ C, const u16* __restrict__ bias) {
    constexpr int SHARE = (M_ROWS * 64 + CL - 1) / CL;  // outputs of the strip each block of the cluster writes
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int strip = blockIdx.x * 64;
    const int n0 = strip + 8 * g;
    const bool in_n = n0 < N;  // N is a multiple of 8: a lane's 8 columns are all in or all out
    const u32 rank = cluster_rank();
    const int k_lane = ((int)rank * WARPS + warp) * KS * 16 + 2 * tig;  // this lane's first row of B
    const u16* a_lane = A + g * LDA + k_lane;
    const u16* b_lane = B + k_lane * LDB + n0;

    float acc[GROUPS][8][4];
#pragma unroll
    for (int gi = 0; gi < GROUPS; ++gi)
#pragma unroll
        for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[gi][t][j] = 0.f;

    Loads cur;
    load_step(cur, a_lane, b_lane, k_lane, in_n, g);
#pragma unroll 1
    for (int s = 0; s < STEPS; ++s) {
        Loads next;
        if (s + 1 < STEPS)  // the next step's loads in flight while this one's are used
            load_step(next, a_lane + (s + 1) * ROWS_STEP, b_lane + (s + 1) * ROWS_STEP * LDB,
                      k_lane + (s + 1) * ROWS_STEP, in_n, g);
        multiply(acc, cur);
        cur = next;
    }

    // Fragment element j of tile t of lane l: row (token) 16 gi + l / 4 + 8 (j / 2), MMA column
    // c = 2 (l % 4) + j % 2, which is column 8 c + t of the strip. The warps' sums meet in `part` (one group of
    // 16 rows at a time); each block sends its sums of the strip's outputs to the block of the cluster that
    // writes them (`inbox`, by distributed shared memory), which adds the cluster's blocks in rank order.
    __shared__ float part[WARPS][1024];
    __shared__ float inbox[CL][SHARE];
#pragma unroll
    for (int gi = 0; gi < GROUPS; ++gi) {
        if (gi > 0) __syncthreads();  // the last group's parts are read
#pragma unroll
        for (int t = 0; t < 8; ++t)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (gi * 16 + g + 8 * (j >> 1) < M_ROWS) part[warp][(t * 4 + j) * 32 + lane] = acc[gi][t][j];
        __syncthreads();
        for (int f = threadIdx.x; f < 1024; f += 32 * WARPS) {
            const int l = f & 31, j = (f >> 5) & 3, t = f >> 7;
            const int row = gi * 16 + (l >> 2) + 8 * (j >> 1);
            if (row < M_ROWS) {
                float s = 0.f;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) s += part[w][f];  // warps in K order: a fixed sum
                const int o = row * 64 + 8 * (2 * (l & 3) + (j & 1)) + t;
                store_to(&inbox[rank][o % SHARE], (u32)(o / SHARE), s);
            }
        }
    }
    __syncwarp();
    cluster_sync();  // every block's sums are in their inboxes (a block barrier when CL is 1)
    for (int i = threadIdx.x; i < SHARE; i += 32 * WARPS) {
        const int o = (int)rank * SHARE + i;
        const int m = o >> 6, n = strip + (o & 63);
        if (m < M_ROWS && n < N) {
            float s = 0.f;
#pragma unroll
            for (int q = 0; q < CL; ++q) s += inbox[q][i];
#if HAS_BIAS
            s += to_float(bias[n]);
#endif
            C[m * LDCM + n * LDCN] = from_float(s);
        }
    }
}
"""


class CudaDecodeGemm(GpuEngine):
    """matmul of A with at most 16 rows against a row-major B on tensor cores, in CUDA C++ (NVRTC); fp16 / bf16."""

    name = "cuda.decode_gemm"
    ops = frozenset({"matmul"})
    priority = 54
    storage_dtypes = frozenset({"fp16", "bf16"})

    knobs = (
        Knob.int("KS", 2, choices=(1, 2, 4), doc="16-row chunks of B a warp loads at once (4 x 16 bytes each)"),
        Knob.int("WARPS", 8, choices=(4, 8), doc="warps of a block, each a K chunk of the same 64 columns"),
        Knob.int("CL", 8, choices=(1, 2, 4, 8), doc="blocks of a cluster along K (sm_90), summed through "
                                                    "distributed shared memory"),
    )

    def __init__(self) -> None:
        self._functions: PlanCache[Any] = PlanCache()

    def supports(self, problem: Problem, device: Device) -> Support:
        if device.vendor != "nvidia":
            return Support.no("CUDA C++ compiled with NVRTC: NVIDIA GPUs only")
        found, why = bindings()
        if found is None:
            return Support.no(why)
        if _sm(device) < 80:
            return Support.no(f"needs sm_80 or newer (bf16 tensor-core MMA), not {device.properties.arch}")
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        if len(a.dims) != 2 or len(b.dims) != 2:
            return Support.no("2-D A and B only")
        if len({t.dtype for t in problem.tensors}) != 1:
            return Support.no("A, B, C (and bias) of one dtype")
        if problem.compute_dtype != "fp32":
            return Support.no(f"sums in fp32, not {problem.compute_dtype}")
        m = a.dims[0]
        n = b.dims[1]
        if m > MAX_M:
            return Support.no(f"M={m} rows: this decode GEMM is for M <= {MAX_M}")
        if a.strides[1] != 1 or b.strides[1] != 1:
            return Support.no("A and B row-major (unit stride along K for A, along N for B)")
        if n % 8 or b.strides[0] % 8:
            return Support.no(f"N={n} and B's row stride {b.strides[0]} must be multiples of 8 (16-byte loads)")
        if c.dims != (m, n):
            return Support.no("C is M x N")
        return Support.yes()

    def knob_support(self, problem: Problem, device: Device, knobs: Mapping[str, KnobValue]) -> Support:
        cl = int(knobs.get("CL", 8))
        if cl > 1 and _sm(device) < 90:
            return Support.no(f"CL={cl}: thread-block clusters need sm_90, not {device.properties.arch}")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> Sequence[Mapping[str, KnobValue]]:
        """The block shapes the device holds, those whose grid is nearest one block per SM first (the H200's
        winners had 64-224 blocks of 8 warps, or 512 of 4), then the most rows in flight a warp."""
        strips = self._grid(problem, {"CL": 1})[0]
        sms = max(1, device.properties.compute_units)
        scored = []
        for ks in (4, 2, 1):
            for warps in (8, 4):
                for cl in (8, 4, 2, 1):
                    knobs = {"KS": ks, "WARPS": warps, "CL": cl}
                    if self.knob_support(problem, device, knobs):
                        blocks = strips * cl * warps / 8  # in blocks of 8 warps
                        scored.append(((abs(math.log2(blocks / sms)), -ks), knobs))
        scored.sort(key=lambda s: s[0])
        return [knobs for _, knobs in scored][:plan_limit()]

    @staticmethod
    def _grid(problem: Problem, knobs: Mapping[str, KnobValue]) -> tuple[int, int]:
        """(column strips, blocks along K)."""
        return -(-problem.tensor("B").dims[1] // STRIP), int(knobs["CL"])

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        return 0

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        a, b, c = problem.tensor("A"), problem.tensor("B"), problem.tensor("C")
        m, k = a.dims
        n = b.dims[1]
        has_bias = problem.has_tensor("bias")
        a_pairs = k % 2 == 0 and a.strides[0] % 2 == 0  # A's k pairs are aligned 4-byte words
        ks, warps, cl = (int(knobs[kn.name]) for kn in self.knobs)
        shape = (m, k, n, a.strides[0], b.strides[0], c.strides[0], c.strides[1])
        key = (device.properties.arch, device.index, shape, a.dtype, has_bias, a_pairs, ks, warps, cl)
        function = self._functions.get(key, lambda: _compile(key))
        launch = Launcher(function, current_raw_stream(torch), device.index, self.name)
        grid = (self._grid(problem, knobs)[0], cl, 1)
        block = (32 * warps, 1, 1)
        align_a = 4 if a_pairs else 2

        def fn(t: Mapping[str, Any]) -> None:
            A, B, C = t["A"], t["B"], t["C"]
            if B.data_ptr() % 16 or A.data_ptr() % align_a:  # views starting mid-row: wide loads would fault
                torch.matmul(A, B, out=C)
                if has_bias:
                    C.add_(t["bias"])
                return
            bias = t["bias"].data_ptr() if has_bias else 0
            launch(grid, block, (A.data_ptr(), B.data_ptr(), C.data_ptr(), bias))

        return TorchPlan(fn, device)


def _sm(device: Device) -> int:
    """The compute capability as a number (sm_90 -> 90), 0 when the arch is not an sm_ name."""
    arch = device.properties.arch
    return int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0


def _compile(key: tuple) -> Any:
    """The kernel compiled for one configuration and shape, loaded into the device's primary context."""
    arch, index, (m, k, n, lda, ldb, ldcm, ldcn), dtype, has_bias, a_pairs, ks, warps, cl = key
    defines = {"M_ROWS": m, "K_SIZE": k, "N_SIZE": n, "LDA_": lda, "LDB_": ldb, "LDCM_": ldcm, "LDCN_": ldcn,
               "IN_BF16": int(dtype == "bf16"), "HAS_BIAS": int(has_bias), "A_PAIRS": int(a_pairs), "KS": ks,
               "WARPS": warps, "CL": cl}
    return compile_function(SOURCE, "decode_gemm", arch, index, defines)
