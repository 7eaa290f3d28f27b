"""Split-KV attention for decode (flash-decoding): few queries against a long KV cache, in Triton.

With one query token, attention has batch x heads rows of work: PyTorch's kernels give a program each
(Qwen2.5-7B at batch 1: 28 programs for 132 SMs) and walk the whole cache in it, so the step reads its 8 MB
of cache at a fifth of the HBM's speed (benchmarks/RESULTS.md, issue 54). Here the cache is cut along its
length into ``SPLITS`` chunks, and a program takes one chunk of one key/value head with every query head that
shares it (grouped-query attention reads each K and V row once, not once per query head): an online softmax
over its chunk, an fp32 partial output and its log-sum-exp. A second kernel weighs the chunks' partials by
their log-sum-exps, in chunk order (the same bits every call). The partials are made per call (a few hundred
KB), so a CUDA graph or torch.compile's graphs hold them in their own pool while they run, and no state
outlives a call. Scores are ``Q K^T / sqrt(d)``, plus a mask where the problem has one (transformers passes a 4-D
one on every decode step over a static cache: the cache's unfilled slots, padding, causal order among a few query
tokens, a sliding window): boolean (True attends) or added to the scores, broadcast over the dims it has of size 1.
A row its mask hides whole gives 0, as torch's math backend does. ``causal`` problems (top-left aligned, as
PyTorch's ``is_causal``) are left to the other engines.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

from farm.plugin import Device, Knob, KnobValue, Problem, Support

from ._common import TORCH_DTYPES, GpuEngine, TorchPlan, torch_module, triton_compile_key
from .triton_gemm import CompilePool, direct_launcher

MAX_QUERIES = 16  # query tokens a step: decode and speculative decoding; longer queries are prefill's kernels
MAX_ROWS = 128  # query rows a program holds (query heads of a group x query tokens): its registers
MAX_HEAD_DIM = 256
SPLIT_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)


def _chunk_kernel() -> Any:
    """The kernel factories the compile pool's processes call ("module:function")."""
    return _kernels()[0]


def _combine_kernel() -> Any:
    return _kernels()[1]


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def chunk_kernel(q_ptr, k_ptr, v_ptr, m_ptr, po_ptr, pl_ptr, HKV, SKV, SQ, GROUP, CHUNK,
                     sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_h, sm_s, sm_k, qk_scale,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                     HAS_MASK: tl.constexpr, BOOL_MASK: tl.constexpr):
        """One chunk of one key/value head's cache against the query rows of its group: the normalised
        partial output (fp32) and the chunk's log2-sum-exp of each row (-inf for an empty chunk, or one its mask
        hides whole). A boolean mask keeps the scores where it is True; another is added to them."""
        bh = tl.program_id(0)
        chunk = tl.program_id(1)
        b = bh // HKV
        hk = bh % HKV
        rows = GROUP * SQ
        r = tl.arange(0, BLOCK_R)
        in_r = r < rows
        h = hk * GROUP + r // SQ
        s = r % SQ
        d = tl.arange(0, BLOCK_D)
        in_d = d < D
        q = tl.load(q_ptr + b * sq_b + h[:, None] * sq_h + s[:, None] * sq_s + d[None, :],
                    mask=in_r[:, None] & in_d[None, :], other=0.0)
        start = chunk * CHUNK
        end = tl.minimum(start + CHUNK, SKV)
        k_base = k_ptr + b * sk_b + hk * sk_h
        v_base = v_ptr + b * sv_b + hk * sv_h
        m_rows = m_ptr + b * sm_b + h * sm_h + s * sm_s  # the mask's row of each query row (stride 0: broadcast)
        m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            in_n = n < end
            k = tl.load(k_base + n[:, None] * sk_s + d[None, :], mask=in_n[:, None] & in_d[None, :], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * qk_scale  # log2 units: scale * log2(e) folded in
            live = in_n[None, :] & in_r[:, None]
            if HAS_MASK:
                m = tl.load(m_rows[:, None] + n[None, :] * sm_k, mask=live, other=0)
                if BOOL_MASK:
                    live = live & (m != 0)
                else:
                    scores += m.to(tl.float32) * 1.4426950408889634  # added to scores in log2 units too
            scores = tl.where(live, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            # a row masked whole so far has no maximum: shifted by 0, its exp2(-inf) is 0, not NaN
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - shift)
            p = tl.exp2(scores - shift[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + n[:, None] * sv_s + d[None, :], mask=in_n[:, None] & in_d[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        filled = l_i > 0.0
        out = acc / tl.where(filled, l_i, 1.0)[:, None]
        lse = tl.where(filled, m_i + tl.log2(tl.where(filled, l_i, 1.0)), float("-inf"))
        part = bh * tl.num_programs(1) + chunk
        tl.store(po_ptr + (part * BLOCK_R + r)[:, None] * BLOCK_D + d[None, :], out)
        tl.store(pl_ptr + part * BLOCK_R + r, lse)

    @triton.jit
    def combine_kernel(po_ptr, pl_ptr, o_ptr, HKV, SQ, GROUP, so_b, so_h, so_s,
                       SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_R: tl.constexpr):
        """One query row: its chunks' partials weighed by their log2-sum-exps, in chunk order."""
        bh = tl.program_id(0)
        r = tl.program_id(1)
        b = bh // HKV
        h = (bh % HKV) * GROUP + r // SQ
        s = r % SQ
        c = tl.arange(0, BLOCK_S)
        in_c = c < SPLITS
        d = tl.arange(0, BLOCK_D)
        lse = tl.load(pl_ptr + ((bh * SPLITS + c) * BLOCK_R + r), mask=in_c, other=float("-inf"))
        top = tl.max(lse, 0)
        top = tl.where(top == float("-inf"), 0.0, top)  # every chunk empty (a row masked whole): weights 0
        w = tl.where(in_c, tl.exp2(lse - top), 0.0)
        parts = tl.load(po_ptr + ((bh * SPLITS + c) * BLOCK_R + r)[:, None] * BLOCK_D + d[None, :],
                        mask=in_c[:, None], other=0.0)
        total = tl.sum(w, 0)
        out = tl.sum(parts * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)  # 0 there, as torch's math gives
        tl.store(o_ptr + b * so_b + h * so_h + s * so_s + d, out.to(o_ptr.dtype.element_ty), mask=d < D)

    return chunk_kernel, combine_kernel


class TritonDecodeAttention(GpuEngine):
    """sdpa_fwd for few query tokens over a long KV cache: the cache split over programs (flash-decoding)."""

    name = "triton.decode_attention"
    ops = frozenset({"sdpa_fwd"})
    priority = 30
    storage_dtypes = frozenset({"fp16", "bf16"})
    takes_mask = True  # transformers' 4-D masks over a static cache (padding, causal, sliding window), bool or added

    knobs = (
        Knob.int("SPLITS", 16, choices=SPLIT_CHOICES, doc="chunks the cache is cut into along its length, "
                                                          "a program each per key/value head"),
        Knob.int("BLOCK_N", 64, choices=(32, 64, 128), doc="cache rows a program's loop step reads"),
        Knob.int("num_warps", 4, choices=(2, 4, 8), doc="warps of a program"),
        Knob.int("num_stages", 2, choices=(1, 2, 3, 4), doc="software-pipelined loads in flight"),
    )

    def __init__(self, compile_pool: CompilePool | None = None) -> None:
        self._procs = compile_pool or CompilePool()

    def supports(self, problem: Problem, device: Device) -> Support:
        try:
            import triton  # noqa: F401
        except ImportError:
            return Support.no("triton is not installed (pip install 'tunefarm[triton]')")
        q, k, v = (problem.tensor(t) for t in ("Q", "K", "V"))
        if problem.criteria_dict.get("causal"):
            return Support.no("causal masking (top-left aligned) is not decode's: this kernel attends the whole cache")
        if len({t.dtype for t in (q, k, v, problem.tensor("O"))}) != 1:
            return Support.no("Q, K, V and O of one dtype")
        if problem.compute_dtype != "fp32":
            return Support.no(f"sums in fp32, not {problem.compute_dtype}")
        (_, hq, sq, d), hkv = q.dims, k.dims[1]
        if sq > MAX_QUERIES:
            return Support.no(f"{sq} query tokens: decode attention is for at most {MAX_QUERIES}")
        if v.dims[3] != d:
            return Support.no(f"V's head dim {v.dims[3]} differs from Q's {d}")
        if d > MAX_HEAD_DIM or d < 16:
            return Support.no(f"head dim {d}: 16 to {MAX_HEAD_DIM}")
        if (hq // hkv) * sq > MAX_ROWS:
            return Support.no(f"{hq // hkv} query heads a group x {sq} tokens = more than {MAX_ROWS} rows a program")
        if any(t.strides[3] != 1 for t in (q, k, v, problem.tensor("O"))):
            return Support.no("unit stride along the head dim (Q, K, V and O)")
        if problem.has_tensor("mask"):
            m = problem.tensor("mask")
            if m.dtype not in ("bool", q.dtype):
                return Support.no(f"a mask of {m.dtype}: boolean or the tensors' dtype")
            want = (q.dims[0], hq, sq, k.dims[2])
            if len(m.dims) != 4 or any(x not in (1, w) for x, w in zip(m.dims, want)):
                return Support.no(f"a mask of dims {list(m.dims)}: it must broadcast to {list(want)}")
        return Support.yes()

    def knob_support(self, problem: Problem, device: Device, knobs: Mapping[str, KnobValue]) -> Support:
        skv = problem.tensor("K").dims[2]
        splits = int(knobs.get("SPLITS", 16))
        if splits > 1 and -(-skv // splits) < int(knobs.get("BLOCK_N", 64)) // 2:
            return Support.no(f"SPLITS={splits}: chunks of {-(-skv // splits)} of {skv} cache rows, "
                              "under half a loop step")
        return Support.yes()

    def list_plans(self, problem: Problem, device: Device) -> list[dict[str, KnobValue]]:
        """Splits that fill the device (programs nearest one or two per SM first), each with the loop steps
        and warps decode kernels use."""
        b, _, _, _ = problem.tensor("Q").dims
        hkv = problem.tensor("K").dims[1]
        sms = max(1, device.properties.compute_units)
        splits = sorted(SPLIT_CHOICES, key=lambda s: min(abs(math.log2(b * hkv * s / sms)),
                                                           abs(math.log2(b * hkv * s / (2 * sms)))))[:3]
        plans = []
        for s in splits:
            for block_n, warps in ((64, 4), (128, 4), (32, 2), (128, 8)):
                knobs = {"SPLITS": s, "BLOCK_N": block_n, "num_warps": warps, "num_stages": 2}
                if self.knob_support(problem, device, knobs):
                    plans.append(knobs)
        return plans

    @staticmethod
    def _shape(problem: Problem, knobs: Mapping[str, KnobValue]) -> dict[str, int]:
        (b, hq, sq, d), (_, hkv, skv, _) = problem.tensor("Q").dims, problem.tensor("K").dims
        group = hq // hkv
        splits = int(knobs["SPLITS"])
        return {"B": b, "HKV": hkv, "SKV": skv, "SQ": sq, "GROUP": group, "D": d, "SPLITS": splits,
                "CHUNK": -(-skv // splits), "BLOCK_D": max(16, 1 << (d - 1).bit_length()),
                "BLOCK_R": max(16, 1 << (group * sq - 1).bit_length())}

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        s = self._shape(problem, {kn.name: knobs.get(kn.name, kn.default) for kn in self.knobs})
        return s["B"] * s["HKV"] * s["SPLITS"] * s["BLOCK_R"] * (s["BLOCK_D"] + 1) * 4

    def _launches(self, problem: Problem, knobs: Mapping[str, KnobValue]
                  ) -> tuple[tuple[Any, ...], dict[str, Any], tuple[Any, ...], dict[str, Any], dict[str, int]]:
        """(chunk kernel's scalars, its constexprs, combine kernel's scalars, its constexprs, the shape)."""
        s = self._shape(problem, knobs)
        q, k, v, o = (problem.tensor(t).strides for t in ("Q", "K", "V", "O"))
        scale = 1.0 / math.sqrt(s["D"]) * math.log2(math.e)
        mask = problem.tensor("mask") if problem.has_tensor("mask") else None
        # the mask's strides, 0 along the dims it broadcasts over (its dims of size 1)
        m = tuple(0 if mask is None or d == 1 else st for d, st in zip(mask.dims, mask.strides)) if mask else (0,) * 4
        chunk_scalars = (s["HKV"], s["SKV"], s["SQ"], s["GROUP"], s["CHUNK"], q[0], q[1], q[2], k[0], k[1], k[2],
                         v[0], v[1], v[2], *m, scale)
        chunk_meta = {"D": s["D"], "BLOCK_D": s["BLOCK_D"], "BLOCK_R": s["BLOCK_R"], "BLOCK_N": int(knobs["BLOCK_N"]),
                      "HAS_MASK": mask is not None, "BOOL_MASK": mask is not None and mask.dtype == "bool",
                      "num_warps": int(knobs["num_warps"]), "num_stages": int(knobs["num_stages"])}
        combine_scalars = (s["HKV"], s["SQ"], s["GROUP"], o[0], o[1], o[2])
        combine_meta = {"SPLITS": s["SPLITS"], "BLOCK_S": max(2, 1 << (s["SPLITS"] - 1).bit_length()), "D": s["D"],
                        "BLOCK_D": s["BLOCK_D"], "BLOCK_R": s["BLOCK_R"], "num_warps": 4 if s["BLOCK_D"] >= 128 else 2}
        return chunk_scalars, chunk_meta, combine_scalars, combine_meta, s

    def compile_key(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> str:
        """The two kernel binaries in Triton's disk cache (one compile a host)."""
        knobs = {kn.name: knobs.get(kn.name, kn.default) for kn in self.knobs}
        chunk_scalars, chunk_meta, combine_scalars, combine_meta, _ = self._launches(problem, knobs)
        ints = tuple(x for x in (*chunk_scalars, *combine_scalars) if isinstance(x, int))
        dtypes = (problem.dtype, *((problem.tensor("mask").dtype,) if problem.has_tensor("mask") else ()))
        return triton_compile_key("triton.decode_attention", device, dtypes,
                                  {**chunk_meta, **{f"combine_{k}": v for k, v in combine_meta.items()}}, ints)

    def run_jit(self, problem: Problem, knobs: Mapping[str, KnobValue], t: Mapping[str, Any]) -> None:
        """The plan's two launches through Triton's JIT on tensors ``t`` (Q, K, V, mask, O): under
        ``TRITON_INTERPRET=1`` on a CPU, which is how the kernels are tested without a GPU."""
        torch = torch_module()
        chunk, combine = _kernels()
        knobs = {kn.name: knobs.get(kn.name, kn.default) for kn in self.knobs}
        chunk_scalars, chunk_meta, combine_scalars, combine_meta, s = self._launches(problem, knobs)
        grid1 = (s["B"] * s["HKV"], s["SPLITS"], 1)
        grid2 = (s["B"] * s["HKV"], s["GROUP"] * s["SQ"], 1)
        rows = grid1[0] * grid1[1] * s["BLOCK_R"]
        parts = torch.empty((rows, s["BLOCK_D"]), dtype=torch.float32, device=t["Q"].device)
        lse = torch.empty((rows,), dtype=torch.float32, device=t["Q"].device)
        chunk[grid1](t["Q"], t["K"], t["V"], t.get("mask", t["Q"]), parts, lse, *chunk_scalars, **chunk_meta)
        combine[grid2](parts, lse, t["O"], *combine_scalars, **combine_meta)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        chunk, combine = _kernels()
        chunk_scalars, chunk_meta, combine_scalars, combine_meta, s = self._launches(problem, knobs)
        name = TORCH_DTYPES[problem.dtype]
        masked = problem.has_tensor("mask")
        mask_name = TORCH_DTYPES[problem.tensor("mask").dtype] if masked else name
        grid1 = (s["B"] * s["HKV"], s["SPLITS"], 1)
        grid2 = (s["B"] * s["HKV"], s["GROUP"] * s["SQ"], 1)
        compiled = (
            self._procs.compile(f"{__name__}:_chunk_kernel", chunk, (name, name, name, mask_name, "float32",
                                                                     "float32"), chunk_scalars, grid1, chunk_meta),
            self._procs.compile(f"{__name__}:_combine_kernel", combine, ("float32", "float32", name),
                                combine_scalars, grid2, combine_meta))
        launch1 = direct_launcher(chunk, compiled[0], grid1, chunk_meta, device.index)
        launch2 = direct_launcher(combine, compiled[1], grid2, combine_meta, device.index)
        parts_shape = (grid1[0] * grid1[1] * s["BLOCK_R"], s["BLOCK_D"])
        lse_shape = (grid1[0] * grid1[1] * s["BLOCK_R"],)
        cuda = torch.device("cuda", device.index)
        f32 = torch.float32

        def fn(t: Mapping[str, Any]) -> None:
            # made per call: inside a graph being captured they come from its pool; nothing outlives the call
            parts = torch.empty(parts_shape, dtype=f32, device=cuda)
            lse = torch.empty(lse_shape, dtype=f32, device=cuda)
            launch1(t["Q"], t["K"], t["V"], t["mask"] if masked else t["Q"], parts, lse, *chunk_scalars)
            launch2(parts, lse, t["O"], *combine_scalars)

        return TorchPlan(fn, device, self.estimate_workspace(problem, knobs))
