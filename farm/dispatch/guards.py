"""A fast check that torch tensors have one given layout: torch's own tensor guards.

``torch.compile`` checks, before each run of compiled code, that its input tensors have the layout the code
was made for (shape, strides, dtype, device, requires_grad, dispatch keys) with ``TensorGuards``, one C++
call. Reading the same fields from Python costs about four times as long (each attribute a call into torch),
which on a host-bound eager call is the caller's time. It is a private class of torch: it is used only where
it exists and passes a self-test of the behaviour relied on; elsewhere the callers read the fields.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

log = logging.getLogger("farm.dispatch.guards")


def layout_check(*tensors: Any) -> Callable[..., bool] | None:
    """``check(*tensors)`` -> True while the tensors given have the layouts these have (torch tensors only), or
    None where torch's guards are not usable here."""
    make = _factory()
    if make is None:
        return None
    try:
        return make(*tensors)
    except Exception as exc:  # a tensor it cannot describe: the caller reads the fields itself
        log.debug("tensor guards unusable for these tensors: %s", exc)
        return None


@functools.lru_cache(maxsize=1)
def _factory() -> Callable[..., Callable[..., bool]] | None:
    try:
        import torch
        from torch._C._dynamo.guards import TensorGuards
    except Exception:  # no torch, or a torch without them
        return None

    def make(*tensors: Any) -> Callable[..., bool]:
        guards = TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                              dynamic_dims_strides=[list(t.stride()) for t in tensors])
        return guards.check

    try:
        a, b = torch.empty(2, 3), torch.empty(3, 2)
        check = make(a, b)
        behaves = (check(torch.empty(2, 3), torch.empty(3, 2))  # the same layouts, other tensors
                   and not check(torch.empty(3, 3), b)  # another shape
                   and not check(torch.empty(3, 2).t(), b)  # the same shape, other strides
                   and not check(a.half(), b))  # another dtype
    except Exception as exc:
        log.debug("torch's tensor guards are not usable here: %s", exc)
        return None
    return make if behaves else None
