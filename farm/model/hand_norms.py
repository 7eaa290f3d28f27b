"""What a hand-written RMSNorm module computes: the default of an ``rmsnorm`` problem of library "module".

A model that writes its RMSNorm by hand (transformers' Llama, Qwen2, Mistral, Gemma families) computes it from
elementwise torch calls; ``farm capture`` records such a module as an ``rmsnorm`` problem of library "module" when
its output is exactly one of these two computations (farm.nn.hand_written), and that computation is the problem's
default (what the model runs without the farm), on the CPU (engines.cpu.torch_ops) and on a GPU (engines.gpu.norms):

- ``scale_offset`` 0 (Llama, Qwen2, Mistral): the statistics in fp32, the normalized rows cast back to the input's
  dtype, then multiplied by the weight: ``w * (x32 * rsqrt(mean(x32^2) + eps)).to(dtype)``;
- ``scale_offset`` 1 (Gemma): the weight added to 1 in fp32, one cast at the end:
  ``(x32 * rsqrt(mean(x32^2) + eps) * (1 + w32)).to(dtype)``.
"""

from __future__ import annotations

from typing import Any


def module_rmsnorm(torch: Any, x: Any, w: Any, eps: float, offset: int) -> Any:
    """The hand-written RMSNorm of ``x`` with weight ``w`` (see the module's text)."""
    xf = x.to(torch.float32)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (normed * (offset + w.to(torch.float32))).to(x.dtype)
    return w * normed.to(x.dtype)
