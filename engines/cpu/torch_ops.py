"""torch's own CPU kernels, for the calls of a torch model on a CPU (problems whose ``library`` is "torch").

A torch model's ``F.linear``, ``F.conv2d``, attention and norms run torch's kernels (oneDNN, MKL) when the
farm is not there, so those kernels are the default such a problem is tuned against: a numpy engine is a
decision only where it beats what the model runs already. These engines apply to those problems alone (the
framework-neutral problems of ``farm.ops`` on numpy arrays keep numpy's call as their default) and are found
first for them (``library = "torch"``). They take the tuner's numpy arrays as torch tensors of the same memory.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from farm.plugin import DirectCall, Device, KnobValue, Problem, Support, module_rmsnorm, norm_eps

from ._base import CpuEngine, FunctionPlan


@functools.lru_cache(maxsize=1)
def _torch() -> Any:
    import torch

    return torch


class _TorchCpuEngine(CpuEngine):
    """Runs ``compute(torch tensors) -> result`` and writes the result into the output."""

    library = "torch"
    priority = 5
    out = ""

    libraries = ("torch",)

    def applicable(self, problem: Problem, device: Device) -> Support:
        if problem.library not in self.libraries:
            return Support.no("runs the calls of a torch model (problems of library torch) only")
        try:
            _torch()
        except ImportError:
            return Support.no("torch is not installed")
        return super().applicable(problem, device)

    def compute(self, problem: Problem) -> Callable[[dict[str, Any]], Any]:
        raise NotImplementedError  # pragma: no cover - every engine overrides it

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> FunctionPlan:
        out_id, views = self.out, _Views()
        compute, into = self.compute(problem), self.into(problem)

        def run(tensors: Mapping[str, Any], workspace: Any) -> None:
            t = {k: views(v) for k, v in tensors.items()}
            if into is not None:
                into(t)
            else:
                t[out_id].copy_(compute(t))

        return FunctionPlan(run)

    def into(self, problem: Problem) -> Callable[[dict[str, Any]], None] | None:
        """The call writing its output itself (``out=``), where torch has one."""
        return None


class _Views:
    """torch tensors of the numpy arrays a plan is given, made once per array (``torch.from_numpy`` costs more
    than a small product): a torch kernel is timed at its own cost, as the model calls it. The arrays are held
    with their views (a few input sets'), so no other array can take an id in the table."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, Any]] = {}

    def __call__(self, arr: Any) -> Any:
        hit = self._by_id.get(id(arr))
        if hit is not None and hit[0] is arr:
            return hit[1]
        torch = _torch()
        t = arr if isinstance(arr, torch.Tensor) else torch.from_numpy(arr)
        if len(self._by_id) >= 64:
            self._by_id.clear()
        self._by_id[id(arr)] = (arr, t)
        return t


class TorchCpuMatmul(_TorchCpuEngine):
    """``torch.matmul`` (``torch.addmm`` with a bias): what ``nn.Linear`` and ``@`` run on a CPU."""

    name = "torch.cpu.matmul"
    ops = frozenset({"matmul"})
    out = "C"

    def compute(self, problem: Problem) -> Callable[[dict[str, Any]], Any]:
        torch = _torch()
        if not problem.has_tensor("bias"):
            return lambda t: torch.matmul(t["A"], t["B"])
        if len(problem.tensor("A").dims) == 2:
            return lambda t: torch.addmm(t["bias"], t["A"], t["B"])
        return lambda t: torch.matmul(t["A"], t["B"]).add_(t["bias"])

    def into(self, problem: Problem) -> Callable[[dict[str, Any]], None] | None:
        torch = _torch()
        if not problem.has_tensor("bias"):
            return lambda t: torch.matmul(t["A"], t["B"], out=t["C"])
        if len(problem.tensor("A").dims) == 2:
            return lambda t: torch.addmm(t["bias"], t["A"], t["B"], out=t["C"])
        return None


class TorchCpuConv(_TorchCpuEngine):
    """``F.conv2d``: oneDNN's convolution, NCHW or channels-last as its tensors are."""

    name = "torch.cpu.conv"
    ops = frozenset({"conv_fprop"})
    out = "Y"

    def compute(self, problem: Problem) -> Callable[[dict[str, Any]], Any]:
        conv = _torch().nn.functional.conv2d
        c = problem.criteria_dict
        stride, padding = (c["stride_h"], c["stride_w"]), (c["pad_h"], c["pad_w"])
        dilation, groups = (c["dilation_h"], c["dilation_w"]), c["groups"]
        return lambda t: conv(t["X"], t["W"], None, stride, padding, dilation, groups)


class TorchCpuSdpa(_TorchCpuEngine):
    """``F.scaled_dot_product_attention`` with the problem's mask, causality and grouped-query heads."""

    name = "torch.cpu.sdpa"
    ops = frozenset({"sdpa_fwd"})
    out = "O"

    def compute(self, problem: Problem) -> Callable[[dict[str, Any]], Any]:
        sdpa = _torch().nn.functional.scaled_dot_product_attention
        causal = bool(problem.criteria_dict.get("causal"))
        gqa = problem.tensor("Q").dims[1] != problem.tensor("K").dims[1]
        return lambda t: sdpa(t["Q"], t["K"], t["V"], attn_mask=t.get("mask"), is_causal=causal, enable_gqa=gqa)


class TorchCpuNorm(_TorchCpuEngine):
    """``F.layer_norm`` or ``F.rms_norm`` over the last dim, with the problem's eps; ``F.rms_norm`` is also a
    candidate for a hand-written RMSNorm (library "module") of scale_offset 0."""

    out = "Y"
    libraries = ("torch", "module")

    def __init__(self, op: str) -> None:
        self.op = op
        self.name = f"torch.cpu.{op}"
        self.ops = frozenset({op})

    def supports(self, problem: Problem) -> Support:
        if self.op == "rmsnorm" and not hasattr(_torch().nn.functional, "rms_norm"):
            return Support.no("this torch has no F.rms_norm (torch >= 2.4)")
        if problem.criteria_dict.get("scale_offset"):
            return Support.no("F.rms_norm scales by the weight, not by scale_offset + weight (Gemma's norm)")
        return Support.yes()

    def compute(self, problem: Problem) -> Callable[[dict[str, Any]], Any]:
        F = _torch().nn.functional
        shape = (problem.tensor("X").dims[-1],)
        eps = norm_eps(problem.criteria_dict)
        if self.op == "layernorm":
            return lambda t: F.layer_norm(t["X"], shape, t["scale"], t["bias"], eps)
        return lambda t: F.rms_norm(t["X"], shape, t["scale"], eps)


class TorchCpuModuleRmsNorm(_TorchCpuEngine):
    """A hand-written RMSNorm's own computation (farm.model.hand_norms): the default of an ``rmsnorm`` problem of
    library "module", what the model's module runs without the farm."""

    name = "torch.cpu.rmsnorm_module"
    ops = frozenset({"rmsnorm"})
    library = "module"
    libraries = ("module",)
    priority = 4
    out = "Y"

    def compute(self, problem: Problem) -> Callable[[dict[str, Any]], Any]:
        torch, eps = _torch(), norm_eps(problem.criteria_dict)
        offset = problem.criteria_dict.get("scale_offset", 0)
        return lambda t: module_rmsnorm(torch, t["X"], t["scale"], eps, offset)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall | None:
        """The module's computation on the problem's tensors, as the model makes it."""
        torch, eps = _torch(), norm_eps(problem.criteria_dict)
        offset = problem.criteria_dict.get("scale_offset", 0)
        views = _Views()
        return DirectCall(lambda x, w: module_rmsnorm(torch, views(x), views(w), eps, offset), ("X", "scale"),
                          label=f"the hand-written RMSNorm (eps {eps:g}{', 1 + weight' if offset else ''})")
