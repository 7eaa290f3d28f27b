"""CPU layernorm and rmsnorm engines over the last dim, in row blocks (eps: the problem's ``eps_e12``)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from farm.plugin import Device, Knob, KnobValue, Problem, norm_eps

from ._base import CpuEngine, FunctionPlan, chunks, compute_dtype, nbytes, workspace_view

ROW_BLOCK = Knob.int("row_block", 0, choices=(0, 16, 64, 256, 1024, 4096),
                     doc="rows normalised per step (0 = all rows at once)")


def _as_rows(arr: np.ndarray, n: int) -> np.ndarray | None:
    """A (rows, n) view of ``arr`` when one exists without copying, else None."""
    try:
        return np.reshape(arr, (-1, n), copy=False)  # raises instead of copying
    except ValueError:
        return None


class _RowEngine(CpuEngine):
    """Runs ``kernel(x_block, params, out_block, stats)`` over blocks of rows in the compute dtype.

    Each block is copied into the workspace, normalised there, and written to Y,
    so fp16 tensors and strided layouts take the same path.
    """

    ops: frozenset[str] = frozenset()
    knobs = (ROW_BLOCK,)
    params: tuple[str, ...] = ()

    def _block(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> tuple[int, int, int]:
        rows, n = problem.tensor("X").rows
        blk = rows if int(knobs["row_block"]) <= 0 else min(rows, int(knobs["row_block"]))
        return rows, n, blk

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        _, n, blk = self._block(problem, knobs)
        ct = compute_dtype(problem)
        return 2 * nbytes((blk, n), ct) + nbytes((blk, 2), ct)

    def kernel(self, x: np.ndarray, params: dict[str, np.ndarray], out: np.ndarray, stats: np.ndarray,
               eps: float) -> None:
        raise NotImplementedError  # pragma: no cover

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        rows, n, blk = self._block(problem, knobs)
        ct = compute_dtype(problem)
        kernel: Callable[..., None] = self.kernel
        eps = norm_eps(problem.criteria_dict)
        offset = problem.criteria_dict.get("scale_offset", 0)  # rmsnorm's x / rms * (scale + offset)

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            x, y = tensors["X"], tensors["Y"]
            params = {p: tensors[p].astype(ct, copy=False) for p in self.params}
            if offset:
                params["scale"] = params["scale"] + offset
            xr = _as_rows(x, n)
            if xr is None:
                xr = np.ascontiguousarray(x).reshape(-1, n)
            yr = _as_rows(y, n)
            dst = yr if yr is not None else np.empty((rows, n), dtype=y.dtype)
            xb_full = workspace_view(workspace, (blk, n), ct)
            ob_full = workspace_view(workspace, (blk, n), ct, xb_full.nbytes)
            stats_full = workspace_view(workspace, (blk, 2), ct, 2 * xb_full.nbytes)
            for r0, r1 in chunks(rows, blk):
                m = r1 - r0
                xb, ob = xb_full[:m], ob_full[:m]
                np.copyto(xb, xr[r0:r1], casting="unsafe")
                kernel(xb, params, ob, stats_full[:m], eps)
                np.copyto(dst[r0:r1], ob, casting="unsafe")
            if yr is None:
                y[...] = dst.reshape(y.shape)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs))


def _normalized(y: np.ndarray, std: np.ndarray, p: dict[str, np.ndarray]) -> None:
    """``y`` (x less its mean) divided by its rows' ``std``, scaled and shifted, in place."""
    y /= std
    y *= p["scale"]
    y += p["bias"]


class _LayerNorm(_RowEngine):
    """(x - mean) / sqrt(var + eps) * scale + bias over each row; a subclass says how the moments are summed."""

    ops = frozenset({"layernorm"})
    params = ("scale", "bias")


class TwoPassLayerNorm(_LayerNorm):
    """Mean first, then the variance of the centred rows (numerically safest)."""

    name = "cpu.layernorm.twopass"
    priority = 10

    def kernel(self, x: np.ndarray, p: dict[str, np.ndarray], y: np.ndarray, stats: np.ndarray, eps: float) -> None:
        mean = stats[:, 0:1]
        np.mean(x, axis=1, keepdims=True, out=mean)
        np.subtract(x, mean, out=y)
        var = stats[:, 1:2]
        np.einsum("ij,ij->i", y, y, out=var[:, 0])
        var /= x.shape[1]
        var += eps
        np.sqrt(var, out=var)
        _normalized(y, var, p)


class OnePassLayerNorm(_LayerNorm):
    """Sum and sum of squares in one sweep: var = E[x^2] - E[x]^2."""

    name = "cpu.layernorm.onepass"
    priority = 20

    def kernel(self, x: np.ndarray, p: dict[str, np.ndarray], y: np.ndarray, stats: np.ndarray, eps: float) -> None:
        n = x.shape[1]
        mean = stats[:, 0:1]
        sq = stats[:, 1:2]
        np.sum(x, axis=1, keepdims=True, out=mean)
        np.einsum("ij,ij->i", x, x, out=sq[:, 0])
        mean /= n
        sq /= n
        sq -= mean * mean
        np.maximum(sq, 0.0, out=sq)
        sq += eps
        np.sqrt(sq, out=sq)
        np.subtract(x, mean, out=y)
        _normalized(y, sq, p)


class _RmsNorm(_RowEngine):
    """x / sqrt(mean(x^2) + eps) * scale; a subclass says how the rows' mean square is summed."""

    ops = frozenset({"rmsnorm"})
    params = ("scale",)

    def mean_square(self, x: np.ndarray, y: np.ndarray, ms: np.ndarray) -> None:
        raise NotImplementedError  # pragma: no cover - every subclass sums it

    def kernel(self, x: np.ndarray, p: dict[str, np.ndarray], y: np.ndarray, stats: np.ndarray, eps: float) -> None:
        ms = stats[:, 0:1]
        self.mean_square(x, y, ms)
        ms += eps
        np.sqrt(ms, out=ms)
        np.divide(x, ms, out=y)
        y *= p["scale"]


class NumpyRmsNorm(_RmsNorm):
    """mean(x*x) through a squared temporary (``y`` holds it)."""

    name = "cpu.rmsnorm.numpy"
    priority = 10

    def mean_square(self, x: np.ndarray, y: np.ndarray, ms: np.ndarray) -> None:
        np.multiply(x, x, out=y)
        np.mean(y, axis=1, keepdims=True, out=ms)


class EinsumRmsNorm(_RmsNorm):
    """Sum of squares as a row-wise dot product (no squared temporary)."""

    name = "cpu.rmsnorm.einsum"
    priority = 20

    def mean_square(self, x: np.ndarray, y: np.ndarray, ms: np.ndarray) -> None:
        np.einsum("ij,ij->i", x, x, out=ms[:, 0])
        ms /= x.shape[1]
