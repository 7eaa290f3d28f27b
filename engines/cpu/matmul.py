"""CPU matmul engines: numpy BLAS (direct or transposed), einsum, and K-blocked BLAS."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from farm.plugin import DirectCall, Device, Knob, KnobValue, Problem

from ._base import THREADS_KNOB, CpuEngine, FunctionPlan, blas_threads, compute_dtype, nbytes, workspace_view


def _upcast_layout(problem: Problem) -> tuple[Any, bool]:
    """(compute numpy dtype, whether inputs must be copied to it first)."""
    ct = compute_dtype(problem)
    return ct, any(np.dtype(ct) != np.dtype({"fp64": np.float64, "fp32": np.float32, "fp16": np.float16}[problem.tensor(t).dtype])
                   for t in ("A", "B", "C"))


def _operands(problem: Problem, tensors: Mapping[str, Any], workspace: Any, ct: Any, upcast: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A, B and an output buffer in the compute dtype; the offset of free workspace after them."""
    a, b, c = tensors["A"], tensors["B"], tensors["C"]
    if not upcast:
        return a, b, c, 0
    off = 0
    views = []
    for arr in (a, b, c):
        v = workspace_view(workspace, arr.shape, ct, off)
        off += v.nbytes
        views.append(v)
    np.copyto(views[0], a)
    np.copyto(views[1], b)
    return views[0], views[1], views[2], off


def _upcast_bytes(problem: Problem, ct: Any) -> int:
    return sum(nbytes(problem.tensor(t).dims, ct) for t in ("A", "B", "C"))


def _finish(tensors: Mapping[str, Any], out: np.ndarray, upcast: bool) -> None:
    c = tensors["C"]
    if "bias" in tensors:
        out += tensors["bias"].reshape(-1).astype(out.dtype, copy=False)
    if upcast:
        np.copyto(c, out, casting="unsafe")


class BlasMatmul(CpuEngine):
    """np.matmul into the output; ``order=transposed`` computes C^T = B^T A^T instead."""

    name = "cpu.matmul.blas"
    ops = frozenset({"matmul"})
    priority = 10
    knobs = (
        THREADS_KNOB,
        Knob.str("order", "direct", choices=("direct", "transposed"),
                 doc="direct: C = A B; transposed: C^T = B^T A^T (column-major BLAS call)"),
    )

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        ct, upcast = _upcast_layout(problem)
        return _upcast_bytes(problem, ct) if upcast else 0

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        ct, upcast = _upcast_layout(problem)
        transposed = knobs["order"] == "transposed"

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            a, b, out, _ = _operands(problem, tensors, workspace, ct, upcast)
            if transposed:
                np.matmul(np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2), out=np.swapaxes(out, -1, -2))
            else:
                np.matmul(a, b, out=out)
            _finish(tensors, out, upcast)

        produce = None
        if not transposed and not upcast and not problem.has_tensor("bias"):
            def produce(tensors: Mapping[str, Any]) -> Any:  # the caller's own a @ b
                return np.matmul(tensors["A"], tensors["B"])

        return FunctionPlan(run, self.estimate_workspace(problem, knobs), blas_threads(int(knobs["threads"])), produce)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall | None:
        """``np.matmul(A, B)`` where numpy computes the problem as stored (no bias, no fp16 upcast)."""
        _, upcast = _upcast_layout(problem)
        if upcast or problem.has_tensor("bias"):
            return None
        return DirectCall(np.matmul, ("A", "B"), label="np.matmul(A, B)")


class EinsumMatmul(CpuEngine):
    """np.einsum with a contraction strategy; EXHAUSTIVE priming computes and caches the path."""

    name = "cpu.matmul.einsum"
    ops = frozenset({"matmul"})
    priority = 50
    supports_exhaustive = True
    knobs = (
        THREADS_KNOB,
        Knob.str("optimize", "greedy", choices=("none", "greedy", "optimal"),
                 doc="einsum contraction strategy (none = einsum's own loops, no BLAS)"),
    )

    def __init__(self) -> None:
        self.path_cache: dict[tuple[str, str], list[Any]] = {}  # (problem key, optimize) -> einsum path

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        ct, upcast = _upcast_layout(problem)
        return _upcast_bytes(problem, ct) if upcast else 0

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        ct, upcast = _upcast_layout(problem)
        strategy = str(knobs["optimize"])
        cache_key = (problem.key, strategy)
        priming = bool(knobs.get("global.benchmarking", 0))
        expr = "...mk,...kn->...mn"

        if priming:
            def prime(tensors: Mapping[str, Any], workspace: Any) -> None:
                a, b, _, _ = _operands(problem, tensors, workspace, ct, upcast)
                path, _info = np.einsum_path(expr, a, b, optimize=strategy if strategy != "none" else False)
                self.path_cache[cache_key] = path

            return FunctionPlan(prime, self.estimate_workspace(problem, knobs))

        path: Any = self.path_cache.get(cache_key, strategy if strategy != "none" else False)

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            a, b, out, _ = _operands(problem, tensors, workspace, ct, upcast)
            if path is False:
                np.einsum(expr, a, b, out=out, optimize=False)
            else:
                # einsum's optimized path cannot write into ``out``; copy the product in
                np.copyto(out, np.einsum(expr, a, b, optimize=path))
            _finish(tensors, out, upcast)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs), blas_threads(int(knobs["threads"])))


class BlockedMatmul(CpuEngine):
    """C accumulated over K in blocks of ``block_k`` (cache blocking on top of BLAS)."""

    name = "cpu.matmul.blocked"
    ops = frozenset({"matmul"})
    priority = 60
    knobs = (
        THREADS_KNOB,
        Knob.int("block_k", 256, choices=(64, 128, 256, 512, 1024, 2048), doc="K columns per BLAS call"),
    )

    def _tile_shape(self, problem: Problem) -> tuple[int, ...]:
        return problem.tensor("C").dims

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        ct, upcast = _upcast_layout(problem)
        tile = nbytes(self._tile_shape(problem), ct)
        return (_upcast_bytes(problem, ct) if upcast else 0) + tile * (1 if upcast else 2)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        ct, upcast = _upcast_layout(problem)
        block = int(knobs["block_k"])
        k_total = problem.tensor("A").dims[-1]
        shape = self._tile_shape(problem)

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            a, b, out, off = _operands(problem, tensors, workspace, ct, upcast)
            if not upcast:
                acc = workspace_view(workspace, shape, ct, off)
                off += acc.nbytes
            else:
                acc = out
            tile = workspace_view(workspace, shape, ct, off)
            acc[...] = 0
            for k0 in range(0, k_total, block):
                k1 = min(k_total, k0 + block)
                np.matmul(a[..., :, k0:k1], b[..., k0:k1, :], out=tile)
                acc += tile
            if not upcast:
                np.copyto(out, acc)
            _finish(tensors, out, upcast)

        return FunctionPlan(run, self.estimate_workspace(problem, knobs), blas_threads(int(knobs["threads"])))
