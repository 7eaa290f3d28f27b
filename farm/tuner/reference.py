"""Float64 reference implementations, the ground truth for numerical checks."""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from farm.errors import UnknownNameError
from farm.model.op_catalog import norm_eps
from farm.model.problem import Problem

EPS = 1e-5  # the norms' default epsilon (a problem's own: its eps_e12 criterion) and batchnorm's

Arrays = Mapping[str, np.ndarray]


def reference(problem: Problem, inputs: Arrays) -> dict[str, np.ndarray]:
    """Outputs of ``problem`` computed in float64 from host ``inputs``."""
    fn = _REFERENCES.get(problem.op)
    if fn is None:
        raise UnknownNameError(f"no float64 reference for op {problem.op!r}")
    x = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    return fn(problem, x)


def has_reference(op: str) -> bool:
    return op in _REFERENCES


def _matmul(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    c = np.matmul(x["A"], x["B"])
    if "bias" in x:
        c = c + x["bias"].reshape(-1)
    return {"C": c}


def _conv_params(p: Problem) -> tuple[int, int, int, int, int, int, int]:
    c = p.criteria_dict
    return c["pad_h"], c["pad_w"], c["stride_h"], c["stride_w"], c["dilation_h"], c["dilation_w"], c["groups"]


def _window(xp: np.ndarray, r: int, s: int, P: int, Q: int, sh: int, sw: int, dh: int, dw: int) -> np.ndarray:
    """xp[n, c, p*sh + r*dh, q*sw + s*dw] for all p < P, q < Q."""
    return xp[:, :, r * dh: r * dh + (P - 1) * sh + 1: sh, s * dw: s * dw + (Q - 1) * sw + 1: sw]


def conv_fprop_reference(x: np.ndarray, w: np.ndarray, pads: tuple[int, ...], out_hw: tuple[int, int]) -> np.ndarray:
    """Direct convolution in float64; ``pads`` = (pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, groups)."""
    ph, pw, sh, sw, dh, dw, g = pads
    P, Q = out_hw
    n, c, _, _ = x.shape
    k, cg, R, S = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((n, k, P, Q))
    kg = k // g
    for gi in range(g):
        xs = xp[:, gi * cg:(gi + 1) * cg]
        ws = w[gi * kg:(gi + 1) * kg]
        for r in range(R):
            for s in range(S):
                win = _window(xs, r, s, P, Q, sh, sw, dh, dw)
                y[:, gi * kg:(gi + 1) * kg] += np.einsum("ncpq,kc->nkpq", win, ws[:, :, r, s])
    return y


def _conv_fprop(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    y = p.tensor("Y").dims
    return {"Y": conv_fprop_reference(x["X"], x["W"], _conv_params(p), (y[2], y[3]))}


def _conv_dgrad(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    ph, pw, sh, sw, dh, dw, g = _conv_params(p)
    dy, w = x["dY"], x["W"]
    n, c, H, W_ = p.tensor("dX").dims
    k, cg, R, S = w.shape
    P, Q = dy.shape[2], dy.shape[3]
    dxp = np.zeros((n, c, H + 2 * ph, W_ + 2 * pw))
    kg = k // g
    for gi in range(g):
        for r in range(R):
            for s in range(S):
                contrib = np.einsum("nkpq,kc->ncpq", dy[:, gi * kg:(gi + 1) * kg], w[gi * kg:(gi + 1) * kg, :, r, s])
                _window(dxp[:, gi * cg:(gi + 1) * cg], r, s, P, Q, sh, sw, dh, dw)[...] += contrib
    return {"dX": dxp[:, :, ph:ph + H, pw:pw + W_]}


def _conv_wgrad(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    ph, pw, sh, sw, dh, dw, g = _conv_params(p)
    xx, dy = x["X"], x["dY"]
    k, cg, R, S = p.tensor("dW").dims
    P, Q = dy.shape[2], dy.shape[3]
    xp = np.pad(xx, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    dw_ = np.zeros((k, cg, R, S))
    kg = k // g
    for gi in range(g):
        for r in range(R):
            for s in range(S):
                win = _window(xp[:, gi * cg:(gi + 1) * cg], r, s, P, Q, sh, sw, dh, dw)
                dw_[gi * kg:(gi + 1) * kg, :, r, s] = np.einsum("nkpq,ncpq->kc", dy[:, gi * kg:(gi + 1) * kg], win)
    return {"dW": dw_}


def _attention_probs(p: Problem, q: np.ndarray, k: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """softmax(Q K^T / sqrt(d) + mask) per query head, K's heads repeated for grouped-query attention; a boolean
    mask keeps the scores where it is True."""
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask > 0.5, scores, -np.inf) if p.tensor("mask").dtype == "bool" else scores + mask
    if p.criteria_dict.get("causal"):
        sq, skv = scores.shape[-2], scores.shape[-1]
        # top-left aligned (query i sees keys 0..i), as torch's is_causal=True
        mask = np.tril(np.ones((sq, skv), dtype=bool))
        scores = np.where(mask, scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    peak[np.isneginf(peak)] = 0  # a row masked whole: its probabilities 0 (torch's attention outputs 0 there)
    probs = np.exp(scores - peak)
    total = probs.sum(axis=-1, keepdims=True)
    total[total == 0] = np.inf
    return probs / total


def _sdpa_fwd(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    v = np.repeat(x["V"], x["Q"].shape[1] // x["V"].shape[1], axis=1)
    return {"O": np.einsum("bhqk,bhkd->bhqd", _attention_probs(p, x["Q"], x["K"], x.get("mask")), v)}


def _sdpa_bwd(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    """Gradients of sum(O * dO) through sdpa_fwd, with the given O in the softmax term (rowsum(dO * O)),
    as FlashAttention's and cuDNN's backward use it; a key head's gradient sums its query heads'."""
    q, k, v, o, do = x["Q"], x["K"], x["V"], x["O"], x["dO"]
    b, hk, skv, d = k.shape
    rep = q.shape[1] // hk
    scale = 1.0 / np.sqrt(q.shape[-1])
    probs = _attention_probs(p, q, k)
    dp = np.einsum("bhqd,bhkd->bhqk", do, np.repeat(v, rep, axis=1))
    ds = probs * (dp - (do * o).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhqk,bhkd->bhqd", ds, np.repeat(k, rep, axis=1)) * scale
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q).reshape(b, hk, rep, skv, d).sum(axis=2) * scale
    dv = np.einsum("bhqk,bhqd->bhkd", probs, do).reshape(b, hk, rep, skv, v.shape[-1]).sum(axis=2)
    return {"dQ": dq, "dK": dk, "dV": dv}


def _layernorm(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    xx = x["X"]
    mean = xx.mean(axis=-1, keepdims=True)
    var = ((xx - mean) ** 2).mean(axis=-1, keepdims=True)
    return {"Y": (xx - mean) / np.sqrt(var + norm_eps(p.criteria_dict)) * x["scale"] + x["bias"]}


def _rmsnorm(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    xx = x["X"]
    rms = np.sqrt((xx * xx).mean(axis=-1, keepdims=True) + norm_eps(p.criteria_dict))
    return {"Y": xx / rms * (x["scale"] + p.criteria_dict.get("scale_offset", 0))}


def _batchnorm(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    xx = x["X"]
    shape = (1, -1) + (1,) * (xx.ndim - 2)
    inv = 1.0 / np.sqrt(x["var"] + EPS)
    return {"Y": (xx - x["mean"].reshape(shape)) * (inv * x["scale"]).reshape(shape) + x["bias"].reshape(shape)}


def _pointwise(p: Problem, x: Arrays) -> dict[str, np.ndarray]:
    a = x["A"]
    mode = p.criteria_dict["mode"]
    if mode == 0:
        return {"C": a + x["B"]}
    if mode == 1:
        return {"C": a * x["B"]}
    if mode == 2:
        return {"C": np.maximum(a, 0.0)}
    if mode == 3:
        from math import erf, sqrt

        verf = np.vectorize(erf)
        return {"C": 0.5 * a * (1.0 + verf(a / sqrt(2.0)))}
    raise UnknownNameError(f"pointwise mode {mode} has no reference")


_REFERENCES: dict[str, Callable[[Problem, Arrays], dict[str, np.ndarray]]] = {
    "matmul": _matmul,
    "conv_fprop": _conv_fprop,
    "conv_dgrad": _conv_dgrad,
    "conv_wgrad": _conv_wgrad,
    "sdpa_fwd": _sdpa_fwd,
    "sdpa_bwd": _sdpa_bwd,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "batchnorm_inference": _batchnorm,
    "pointwise": _pointwise,
}
