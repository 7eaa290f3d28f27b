"""CPU conv_fprop engines (NCHW input, KCRS filter): im2col+GEMM, FFT, direct sliding window."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from farm.plugin import Device, Knob, KnobValue, Problem, Support

from ._base import THREADS_KNOB, CpuEngine, FunctionPlan, blas_threads, chunks, compute_dtype, nbytes, workspace_view


class _Geometry:
    """Sizes of one conv_fprop problem."""

    def __init__(self, problem: Problem) -> None:
        c = problem.criteria_dict
        self.n, self.c, self.h, self.w = problem.tensor("X").dims
        self.k, self.cg, self.r, self.s = problem.tensor("W").dims
        _, _, self.p, self.q = problem.tensor("Y").dims
        self.ph, self.pw = c["pad_h"], c["pad_w"]
        self.sh, self.sw = c["stride_h"], c["stride_w"]
        self.dh, self.dw = c["dilation_h"], c["dilation_w"]
        self.g = c["groups"]
        self.kg = self.k // self.g
        self.hp, self.wp = self.h + 2 * self.ph, self.w + 2 * self.pw


def _padded_input(g: _Geometry, x: np.ndarray, workspace: Any, ct: Any, n0: int, n1: int, offset: int) -> tuple[np.ndarray, int]:
    """X[n0:n1] zero-padded, in the compute dtype, carved from the workspace."""
    xp = workspace_view(workspace, (n1 - n0, g.c, g.hp, g.wp), ct, offset)
    if g.ph or g.pw:
        xp[...] = 0
    xp[:, :, g.ph:g.ph + g.h, g.pw:g.pw + g.w] = x[n0:n1]
    return xp, offset + xp.nbytes


def _window(xp: np.ndarray, g: _Geometry, r: int, s: int) -> np.ndarray:
    """xp[n, c, p*sh + r*dh, q*sw + s*dw] for every output position (a strided view)."""
    return xp[:, :, r * g.dh: r * g.dh + (g.p - 1) * g.sh + 1: g.sh, s * g.dw: s * g.dw + (g.q - 1) * g.sw + 1: g.sw]


class Im2colConv(CpuEngine):
    """Unfold input patches into a matrix and multiply by the filter (one GEMM per group)."""

    name = "cpu.conv.im2col"
    ops = frozenset({"conv_fprop"})
    priority = 10
    knobs = (
        THREADS_KNOB,
        Knob.int("batch_chunk", 0, choices=(0, 1, 2, 4, 8, 16, 32),
                 doc="images unfolded per GEMM (0 = the whole batch); bounds the column buffer"),
    )

    def _chunk(self, g: _Geometry, knobs: Mapping[str, KnobValue]) -> int:
        b = int(knobs["batch_chunk"])
        return g.n if b <= 0 else min(b, g.n)

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        g, ct = _Geometry(problem), compute_dtype(problem)
        b = self._chunk(g, knobs)
        return (nbytes((b, g.c, g.hp, g.wp), ct)
                + nbytes((b * g.p * g.q, g.cg * g.r * g.s), ct)
                + nbytes((b * g.p * g.q, g.kg), ct)
                + nbytes((g.k, g.cg * g.r * g.s), ct))

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        g, ct = _Geometry(problem), compute_dtype(problem)
        b = self._chunk(g, knobs)
        crs = g.cg * g.r * g.s

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            x, w, y = tensors["X"], tensors["W"], tensors["Y"]
            off = 0
            wmat = workspace_view(workspace, (g.k, crs), ct, off)
            off += wmat.nbytes
            np.copyto(wmat, w.reshape(g.k, crs) if w.flags.c_contiguous else np.ascontiguousarray(w).reshape(g.k, crs),
                      casting="unsafe")
            for n0, n1 in chunks(g.n, b):
                nb = n1 - n0
                xp, o2 = _padded_input(g, x, workspace, ct, n0, n1, off)
                cols = workspace_view(workspace, (nb, g.p, g.q, g.cg, g.r, g.s), ct, o2)
                prod = workspace_view(workspace, (nb * g.p * g.q, g.kg), ct, o2 + cols.nbytes)
                for gi in range(g.g):
                    xs = xp[:, gi * g.cg:(gi + 1) * g.cg]
                    for r in range(g.r):
                        for s in range(g.s):
                            cols[:, :, :, :, r, s] = _window(xs, g, r, s).transpose(0, 2, 3, 1)
                    np.matmul(cols.reshape(nb * g.p * g.q, crs), wmat[gi * g.kg:(gi + 1) * g.kg].T, out=prod)
                    y[n0:n1, gi * g.kg:(gi + 1) * g.kg] = prod.reshape(nb, g.p, g.q, g.kg).transpose(0, 3, 1, 2)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs), blas_threads(int(knobs["threads"])))


def _next_fast_len(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= n (sizes pocketfft handles fastest)."""
    best = 1 << (n - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


class FftConv(CpuEngine):
    """Cross-correlation as a product in the frequency domain (rfft2), strides by subsampling."""

    name = "cpu.conv.fft"
    ops = frozenset({"conv_fprop"})
    priority = 40
    knobs = (
        Knob.str("fft_size", "fast", choices=("exact", "fast", "pow2"),
                 doc="transform size: the padded input size, the next 2^a3^b5^c, or the next power of two"),
    )

    def supports(self, problem: Problem) -> Support:
        c = problem.criteria_dict
        if c["groups"] != 1:
            return Support.no("grouped convolution is not implemented by the FFT engine")
        if c["dilation_h"] != 1 or c["dilation_w"] != 1:
            return Support.no("dilated filters are not implemented by the FFT engine")
        return Support.yes()

    def _sizes(self, g: _Geometry, knobs: Mapping[str, KnobValue]) -> tuple[int, int]:
        mode = knobs["fft_size"]
        if mode == "exact":
            return g.hp, g.wp
        if mode == "pow2":
            return 1 << (g.hp - 1).bit_length(), 1 << (g.wp - 1).bit_length()
        return _next_fast_len(g.hp), _next_fast_len(g.wp)

    def _complex(self, problem: Problem) -> Any:
        return np.complex128 if problem.compute_dtype == "fp64" else np.complex64

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        g, ct, cx = _Geometry(problem), compute_dtype(problem), self._complex(problem)
        lh, lw = self._sizes(g, knobs)
        fw = lw // 2 + 1
        return (nbytes((g.n, g.c, lh, lw), ct) + nbytes((g.k, g.c, lh, lw), ct)
                + nbytes((lh, fw, g.n, g.c), cx) + nbytes((lh, fw, g.c, g.k), cx)
                + nbytes((lh, fw, g.n, g.k), cx) + nbytes((lh, lw, g.n, g.k), ct))

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        g, ct, cx = _Geometry(problem), compute_dtype(problem), self._complex(problem)
        lh, lw = self._sizes(g, knobs)
        fw = lw // 2 + 1

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            x, w, y = tensors["X"], tensors["W"], tensors["Y"]
            # zero-padded to the transform size here: rfft2(s=..., out=...) rejects padding
            xp = workspace_view(workspace, (g.n, g.c, lh, lw), ct)
            xp[...] = 0
            xp[:, :, g.ph:g.ph + g.h, g.pw:g.pw + g.w] = x
            off = xp.nbytes
            wc = workspace_view(workspace, (g.k, g.c, lh, lw), ct, off)
            off += wc.nbytes
            wc[...] = 0
            np.copyto(wc[:, :, : g.r, : g.s], w, casting="unsafe")
            xf = workspace_view(workspace, (lh, fw, g.n, g.c), cx, off)
            off += xf.nbytes
            wf = workspace_view(workspace, (lh, fw, g.c, g.k), cx, off)
            off += wf.nbytes
            yf = workspace_view(workspace, (lh, fw, g.n, g.k), cx, off)
            off += yf.nbytes
            yt = workspace_view(workspace, (lh, lw, g.n, g.k), ct, off)
            # (h, w) last for the transforms, then frequencies first for the per-frequency GEMM
            np.fft.rfft2(xp, out=xf.transpose(2, 3, 0, 1))
            # correlation = convolution with the conjugate spectrum of the filter
            np.fft.rfft2(wc, out=wf.transpose(3, 2, 0, 1))
            np.conjugate(wf, out=wf)
            np.matmul(xf, wf, out=yf)
            # inverse in two steps: irfft2(out=...) does not fill a given output in numpy 2.x
            np.fft.ifft(yf, axis=0, out=yf)
            np.fft.irfft(yf, n=lw, axis=1, out=yt)
            y[...] = yt[: (g.p - 1) * g.sh + 1: g.sh, : (g.q - 1) * g.sw + 1: g.sw].transpose(2, 3, 0, 1)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs))


class DirectConv(CpuEngine):
    """Sliding window: for each filter tap (r, s), a GEMM of the shifted input with W[:, :, r, s]."""

    name = "cpu.conv.direct"
    ops = frozenset({"conv_fprop"})
    priority = 50
    knobs = (
        THREADS_KNOB,
        Knob.int("channel_block", 0, choices=(0, 8, 16, 32, 64, 128),
                 doc="input channels per GEMM (0 = all of a group's channels)"),
    )

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        g, ct = _Geometry(problem), compute_dtype(problem)
        cb = self._block(g, knobs)
        return (nbytes((g.n, g.c, g.hp, g.wp), ct) + nbytes((g.n, g.p, g.q, g.k), ct)
                + nbytes((g.n, g.p, g.q, cb), ct) + nbytes((g.n, g.p, g.q, g.kg), ct) + nbytes((cb, g.kg), ct))

    def _block(self, g: _Geometry, knobs: Mapping[str, KnobValue]) -> int:
        cb = int(knobs["channel_block"])
        return g.cg if cb <= 0 else min(cb, g.cg)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        g, ct = _Geometry(problem), compute_dtype(problem)
        cb = self._block(g, knobs)

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            x, w, y = tensors["X"], tensors["W"], tensors["Y"]
            xp, off = _padded_input(g, x, workspace, ct, 0, g.n, 0)
            acc = workspace_view(workspace, (g.n, g.p, g.q, g.k), ct, off)
            off += acc.nbytes
            acc[...] = 0
            patch_full = workspace_view(workspace, (g.n, g.p, g.q, cb), ct, off)
            off += patch_full.nbytes
            prod = workspace_view(workspace, (g.n, g.p, g.q, g.kg), ct, off)
            off += prod.nbytes
            tap_full = workspace_view(workspace, (cb, g.kg), ct, off)
            for gi in range(g.g):
                xs = xp[:, gi * g.cg:(gi + 1) * g.cg]
                wg = w[gi * g.kg:(gi + 1) * g.kg]
                for c0 in range(0, g.cg, cb):
                    c1 = min(g.cg, c0 + cb)
                    patch = patch_full[..., : c1 - c0]
                    tap = tap_full[: c1 - c0]
                    for r in range(g.r):
                        for s in range(g.s):
                            np.copyto(patch, _window(xs[:, c0:c1], g, r, s).transpose(0, 2, 3, 1))
                            np.copyto(tap, wg[:, c0:c1, r, s].T, casting="unsafe")
                            np.matmul(patch, tap, out=prod)
                            acc[..., gi * g.kg:(gi + 1) * g.kg] += prod
            y[...] = acc.transpose(0, 3, 1, 2)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs), blas_threads(int(knobs["threads"])))
