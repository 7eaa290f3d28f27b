"""CPU sdpa_fwd engines: materialised scores, and blocked online softmax (FlashAttention-style).

Causal masking is top-left aligned (query i sees keys 0..i), as in PyTorch's
``scaled_dot_product_attention(is_causal=True)``. An attention mask (the optional
``mask`` tensor, broadcast to [batch, heads, queries, keys]) is boolean (True
attends) or added to the scores; a query row it masks whole gives 0, as PyTorch's
attention does (a left-padded batch's padding rows). Grouped-query attention shares each K/V head
among Hq/Hkv query heads by broadcasting, not copying.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from farm.plugin import Device, Knob, KnobValue, Problem

from ._base import THREADS_KNOB, CpuEngine, FunctionPlan, blas_threads, compute_dtype, nbytes, workspace_view


class _Shape:
    def __init__(self, problem: Problem) -> None:
        self.b, self.hq, self.sq, self.d = problem.tensor("Q").dims
        _, self.hkv, self.skv, _ = problem.tensor("K").dims
        self.dv = problem.tensor("V").dims[3]
        self.rep = self.hq // self.hkv
        self.causal = bool(problem.criteria_dict.get("causal", 0))
        self.scale = 1.0 / math.sqrt(self.d)
        self.mask = problem.tensor("mask") if problem.has_tensor("mask") else None


def _additive_mask(tensors: Mapping[str, Any], s: _Shape, ct: Any) -> np.ndarray | None:
    """The mask as scores to add (0 or -inf for a boolean one), shaped to broadcast over
    [b, hkv, rep, sq, skv]."""
    if s.mask is None:
        return None
    m = tensors["mask"]
    add = np.where(m, ct(0), ct(-np.inf)) if m.dtype == np.bool_ else m.astype(ct, copy=False)
    b, h, q, k = add.shape
    return add.reshape(b, s.hkv, s.rep, q, k) if h == s.hq and s.hq > 1 else add.reshape(b, 1, 1, q, k)

def _grouped(q: np.ndarray, k: np.ndarray, v: np.ndarray, s: _Shape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q as [b, hkv, rep, sq, d]; K and V as [b, hkv, 1, s, d] so heads broadcast."""
    return (q.reshape(s.b, s.hkv, s.rep, s.sq, s.d),
            k.reshape(s.b, s.hkv, 1, s.skv, s.d),
            v.reshape(s.b, s.hkv, 1, s.skv, s.dv))


def _as_compute(arr: np.ndarray, ct: Any) -> np.ndarray:
    return arr if arr.dtype == ct else arr.astype(ct)


class MaterializedSdpa(CpuEngine):
    """S = QK^T scale; softmax(S) in place; O = S V. Workspace holds the whole score matrix."""

    name = "cpu.sdpa.materialized"
    ops = frozenset({"sdpa_fwd"})
    priority = 10
    knobs = (THREADS_KNOB,)

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        s = _Shape(problem)
        ct = compute_dtype(problem)
        return nbytes((s.b, s.hkv, s.rep, s.sq, s.skv), ct) + nbytes((s.b, s.hkv, s.rep, s.sq, s.dv), ct)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        s, ct = _Shape(problem), compute_dtype(problem)
        mask = np.triu(np.ones((s.sq, s.skv), dtype=bool), k=1) if s.causal else None

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            q, k, v = (_as_compute(tensors[t], ct) for t in ("Q", "K", "V"))
            qg, kg, vg = _grouped(q, k, v, s)
            scores = workspace_view(workspace, (s.b, s.hkv, s.rep, s.sq, s.skv), ct)
            out = workspace_view(workspace, (s.b, s.hkv, s.rep, s.sq, s.dv), ct, scores.nbytes)
            np.matmul(qg, np.swapaxes(kg, -1, -2), out=scores)
            scores *= s.scale
            added = _additive_mask(tensors, s, ct)
            if added is not None:
                scores += added
            if mask is not None:
                scores[..., mask] = -np.inf
            peak = scores.max(axis=-1, keepdims=True)
            if added is not None:
                peak[np.isneginf(peak)] = 0  # a row masked whole: exp(-inf - 0) = 0, not NaN
            scores -= peak
            np.exp(scores, out=scores)
            total = scores.sum(axis=-1, keepdims=True)
            if added is not None:
                total[total == 0] = np.inf  # ... and its output 0, as torch's attention gives
            scores /= total
            np.matmul(scores, vg, out=out)
            tensors["O"][...] = out.reshape(s.b, s.hq, s.sq, s.dv)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs), blas_threads(int(knobs["threads"])))


class OnlineSoftmaxSdpa(CpuEngine):
    """Keys and values in blocks of ``block_kv`` with a running max and sum (no full score matrix)."""

    name = "cpu.sdpa.online"
    ops = frozenset({"sdpa_fwd"})
    priority = 20
    knobs = (
        THREADS_KNOB,
        Knob.int("block_kv", 128, choices=(32, 64, 128, 256, 512, 1024), doc="keys per block"),
    )

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        s, ct = _Shape(problem), compute_dtype(problem)
        blk = min(int(knobs["block_kv"]), s.skv)
        rows = (s.b, s.hkv, s.rep, s.sq)
        return (nbytes(rows + (blk,), ct) + nbytes(rows + (s.dv,), ct) * 2 + nbytes(rows + (1,), ct) * 3)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        s, ct = _Shape(problem), compute_dtype(problem)
        blk = min(int(knobs["block_kv"]), s.skv)
        rows = (s.b, s.hkv, s.rep, s.sq)
        qi = np.arange(s.sq)[:, None]

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            q, k, v = (_as_compute(tensors[t], ct) for t in ("Q", "K", "V"))
            qg, kg, vg = _grouped(q, k, v, s)
            added = _additive_mask(tensors, s, ct)
            off = 0
            views = []
            for shape in (rows + (blk,), rows + (s.dv,), rows + (s.dv,), rows + (1,), rows + (1,), rows + (1,)):
                views.append(workspace_view(workspace, shape, ct, off))
                off += views[-1].nbytes
            sc_full, acc, pv_full, m, l, m_new = views
            acc[...] = 0
            m[...] = -np.inf
            l[...] = 0
            for j0 in range(0, s.skv, blk):
                j1 = min(s.skv, j0 + blk)
                sc = sc_full[..., : j1 - j0]
                np.matmul(qg, np.swapaxes(kg[..., j0:j1, :], -1, -2), out=sc)
                sc *= s.scale
                if added is not None:
                    sc += added[..., j0:j1]
                if s.causal:
                    masked = (np.arange(j0, j1)[None, :] > qi)
                    if masked.all():
                        continue
                    sc[..., masked] = -np.inf
                np.maximum(m, sc.max(axis=-1, keepdims=True), out=m_new)
                # a row wholly masked so far has no max yet: shift it by 0 (exp(-inf - 0) = 0, not NaN)
                shift = np.where(np.isneginf(m_new), 0, m_new) if added is not None else m_new
                # rescale what was accumulated under the old max (exp(-inf) = 0 on the first block)
                alpha = np.exp(m - shift)
                sc -= shift
                np.exp(sc, out=sc)
                l *= alpha
                l += sc.sum(axis=-1, keepdims=True)
                acc *= alpha
                np.matmul(sc, vg[..., j0:j1, :], out=pv_full)
                acc += pv_full
                m[...] = m_new
            if added is not None:
                l[l == 0] = np.inf  # a row masked whole: output 0, as torch's attention gives
            acc /= l
            tensors["O"][...] = acc.reshape(s.b, s.hq, s.sq, s.dv)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs), blas_threads(int(knobs["threads"])))
