"""Liger-Kernel's Triton kernels as candidates (``pip install 'tunefarm[liger]'``): a well-kept library's kernels
for the layers models write by hand, beside the farm's own.

``liger.rmsnorm`` is Liger's RMSNorm forward (``liger_kernel.ops.rms_norm.rms_norm_forward``) for a hand-written
RMSNorm's problem: its "llama" casting mode is Llama's rounding (the normalized row in the input's dtype, then the
weight), its "gemma" mode with offset 1 is Gemma's (``1 + weight`` in fp32, one cast at the end), as
transformers' modules compute them. Liger allocates its output each call; the plan copies it into Y, and a routed
call takes Liger's output as it is.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from farm.plugin import Device, KnobValue, Problem, Support, norm_eps

from ._common import GpuEngine, TorchPlan


@functools.lru_cache(maxsize=1)
def _liger_rms_norm() -> Any:
    """Liger's RMSNorm forward, or None where liger-kernel is not installed or does not import here."""
    try:
        from liger_kernel.ops.rms_norm import rms_norm_forward
    except Exception:  # an ImportError, or a Liger built against another triton: not a candidate here
        return None
    return rms_norm_forward


class LigerRmsNorm(GpuEngine):
    """Liger-Kernel's fused RMSNorm, in the casting mode of the hand-written module the problem came from."""

    name = "liger.rmsnorm"
    library = "liger"
    ops = frozenset({"rmsnorm"})
    storage_dtypes = frozenset({"fp32", "fp16", "bf16"})
    priority = 25

    def supports(self, problem: Problem, device: Device) -> Support:
        if _liger_rms_norm() is None:
            return Support.no("liger-kernel is not installed (pip install 'tunefarm[liger]') or does not import")
        if problem.library != "module":
            return Support.no("hand-written RMSNorm modules' problems (library module): Liger casts as they do")
        x, y = problem.tensor("X"), problem.tensor("Y")
        if not (x.is_contiguous and y.is_contiguous) or problem.tensor("scale").dtype != x.dtype:
            return Support.no("contiguous rows and a weight of the input's dtype")
        return Support.yes()

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> TorchPlan:
        forward, eps = _liger_rms_norm(), norm_eps(problem.criteria_dict)
        offset = int(problem.criteria_dict.get("scale_offset", 0))
        mode = "gemma" if offset else "llama"

        def produce(t: Mapping[str, Any]) -> Any:
            return forward(t["X"], t["scale"], eps, float(offset), mode, None)[0]

        return TorchPlan(lambda t: t["Y"].copy_(produce(t)), device, produce=produce, copies_output=True)
