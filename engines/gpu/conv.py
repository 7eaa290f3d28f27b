"""PyTorch / cuDNN (MIOpen on ROCm) convolutions: forward, data gradient, weight gradient.

Knobs: the memory layout the convolution runs in (``native``, the default, runs the tensors as they
are stored, which is what PyTorch does; ``nchw`` and ``nhwc`` convert inputs that are not stored that
way, and that copy is part of the time) and cuDNN's deterministic mode. EXHAUSTIVE mode primes with cuDNN's own benchmark
search (``torch.backends.cudnn.benchmark``): the priming run searches and
caches the fastest algorithm for the shape, and the primed plan keeps benchmark
mode on so it runs that algorithm; STANDARD plans use cuDNN's heuristics.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from farm.plugin import DirectCall, Device, Knob, KnobValue, Problem

from ._common import Flags, GpuEngine, TorchPlan, torch_module


class TorchConv(GpuEngine):
    name = "torch.conv"
    ops = frozenset({"conv_fprop", "conv_dgrad", "conv_wgrad"})
    priority = 10
    supports_exhaustive = True
    knobs = (
        Knob.str("layout", "native", choices=("native", "nchw", "nhwc"),
                 doc="memory format the convolution runs in (native: as the tensors are stored)"),
        Knob.int("deterministic", 0, choices=(0, 1), doc="cuDNN deterministic algorithms only"),
    )

    def __init__(self) -> None:
        self._primed: set[tuple[str, tuple[Any, ...]]] = set()
        self._lock = threading.Lock()

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        torch = torch_module()
        F = torch.nn.functional
        c = problem.criteria_dict
        stride, pad = (c["stride_h"], c["stride_w"]), (c["pad_h"], c["pad_w"])
        dil, groups = (c["dilation_h"], c["dilation_w"]), c["groups"]
        native = knobs["layout"] == "native"
        fmt = torch.channels_last if knobs["layout"] == "nhwc" else torch.contiguous_format
        key = (problem.key, (knobs["layout"], knobs["deterministic"]))
        priming = bool(knobs.get("global.benchmarking", 0))
        with self._lock:
            if priming:
                self._primed.add(key)
            benchmark = priming or key in self._primed
        settings = {"benchmark": benchmark, "deterministic": bool(knobs["deterministic"])}

        def fmt_(x: Any) -> Any:
            return x if native else x.contiguous(memory_format=fmt)  # contiguous() returns x when laid out so

        produce = None
        if problem.op == "conv_fprop":
            if native or (knobs["layout"] == "nchw" and problem.tensor("X").is_contiguous
                          and problem.tensor("W").is_contiguous):
                def produce(t: Mapping[str, Any]) -> Any:  # the caller's own F.conv2d: replay hands its output back
                    return F.conv2d(t["X"], t["W"], None, stride, pad, dil, groups)
            else:
                def produce(t: Mapping[str, Any]) -> Any:
                    return F.conv2d(fmt_(t["X"]), fmt_(t["W"]), None, stride, pad, dil, groups)

            def fn(t: Mapping[str, Any]) -> None:
                t["Y"].copy_(produce(t))
        elif problem.op == "conv_dgrad":
            in_size = problem.tensor("dX").dims

            def fn(t: Mapping[str, Any]) -> None:
                t["dX"].copy_(torch.nn.grad.conv2d_input(in_size, fmt_(t["W"]), fmt_(t["dY"]), stride, pad, dil, groups))
        else:
            w_size = problem.tensor("dW").dims

            def fn(t: Mapping[str, Any]) -> None:
                t["dW"].copy_(torch.nn.grad.conv2d_weight(fmt_(t["X"]), w_size, fmt_(t["dY"]), stride, pad, dil, groups))

        return TorchPlan(fn, device, context=Flags(torch.backends.cudnn, **settings), produce=produce,
                         copies_output=True)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall | None:
        """``F.conv2d(X, W, None, stride, padding, dilation, groups)`` on the tensors as stored (forward only)."""
        if problem.op != "conv_fprop" or len(problem.tensor("X").dims) != 4:
            return None
        c = problem.criteria_dict
        stride, pad = (c["stride_h"], c["stride_w"]), (c["pad_h"], c["pad_w"])
        dil, groups = (c["dilation_h"], c["dilation_w"]), c["groups"]
        return DirectCall(torch_module().nn.functional.conv2d, ("X", "W"), (None, stride, pad, dil, groups),
                          label=f"F.conv2d(X, W, None, {stride}, {pad}, {dil}, {groups})")
