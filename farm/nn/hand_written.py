"""The layers models write by hand, recognised by what they compute, and routed per module.

A hand-written RMSNorm (transformers' Llama, Qwen2, Mistral, Gemma families, and any module computing the same,
whatever its class is called) is a module with one weight of the last dim's size and an epsilon attribute, whose
output is exactly what farm.model.hand_norms computes for it (Llama's rounding, or Gemma's ``1 + weight``): in eager
mode seven elementwise kernels. ``farm capture`` records it as an ``rmsnorm`` problem of library "module" (its
default is that computation: a candidate is routed only where it beats the module), and ``farm.apply`` routes such a
module with a ``HandNormSite`` whose first call of each input layout compares the routed output with the module's
own: a module that does not compute what its problem says keeps its own forward, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from farm.model.hand_norms import module_rmsnorm
from farm.model.op_catalog import OFFSET_CRITERION
from farm.nn.module_sites import ModuleSite, norm_call, routable_norm
from farm.nn.torch_calls import OpCall, Skipped, eps_criterion, layout, torch_module

log = logging.getLogger("farm.nn.hand_written")
EPS_ATTRIBUTES = ("variance_epsilon", "eps", "epsilon")  # what models call their norm's epsilon
KIND = "rmsnorm_module"


def rmsnorm_shaped(module: Any) -> tuple[Any, float] | None:
    """(its weight, its eps) when ``module`` is shaped like a hand-written RMSNorm: not torch's own norm, one
    1-D parameter called weight, a numeric epsilon attribute; None otherwise."""
    if routable_norm(module) or not hasattr(module, "_parameters"):
        return None
    params = dict(module.named_parameters(recurse=False))
    w = params.get("weight")
    if set(params) != {"weight"} or w is None or w.dim() != 1:
        return None
    for name in EPS_ATTRIBUTES:
        eps = getattr(module, name, None)
        if isinstance(eps, (int, float)) and not isinstance(eps, bool):
            return w, float(eps)
    return None


def computed_offset(x: Any, w: Any, eps: float, out: Any) -> int | None:
    """The ``scale_offset`` (0: Llama's, 1: Gemma's) whose computation gives exactly ``out`` for ``x``, or None."""
    torch = torch_module()
    with torch.no_grad():
        for offset in (0, 1):
            ref = module_rmsnorm(torch, x, w, eps, offset)
            if ref.dtype == out.dtype and ref.shape == out.shape and torch.equal(ref, out):
                return offset
    return None


def read_hand_rmsnorm(module: Any, args: tuple[Any, ...], out: Any) -> OpCall | Skipped | None:
    """A module's call as a problem when it is a hand-written RMSNorm (None: it is not shaped like one; Skipped: it
    is, but the farm cannot take this call, and why)."""
    torch = torch_module()
    shaped = rmsnorm_shaped(module)
    if shaped is None or len(args) != 1 or not isinstance(args[0], torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    (w, eps), x = shaped, args[0]
    if x.dim() < 2 or x.shape[-1] != w.shape[0] or not x.is_floating_point():
        return None
    if x.device.type == "meta":
        return Skipped(KIND, "a hand-written norm on meta: what it computes cannot be checked without values "
                             "(capture on the device)")
    if not x.is_contiguous() or x.dtype != w.dtype:
        return Skipped(KIND, "a hand-written norm of a strided input, or of a weight of another dtype than its "
                             "input's")
    coded = eps_criterion(eps)
    if isinstance(coded, str):
        return Skipped(KIND, coded)
    offset = computed_offset(x, w, eps, out)
    if offset is None:
        return Skipped(KIND, f"a module shaped like an RMSNorm ({type(module).__name__}) computing something else "
                             "than Llama's or Gemma's RMSNorm")
    from farm.dispatch.calls import problem_for
    from farm.errors import InputError

    try:
        problem = problem_for("rmsnorm", {"X": layout(x), "scale": layout(w)},
                              (*coded, (OFFSET_CRITERION, offset)), None, torch_layouts=True, library="module")
    except InputError as exc:
        return Skipped(KIND, f"a call the farm's problems do not describe ({exc})")
    return OpCall(KIND, problem)


class HandNormSite(ModuleSite):
    """A hand-written RMSNorm module routed to its decision: its weight, eps and offset as its problem says, its
    first call of each input layout checked against the module's own forward."""

    kind = "hand_rmsnorm"
    farm_op = "rmsnorm"

    def __init__(self, applied: Any, module: Any, name: str, eps: float) -> None:
        super().__init__(applied, module, name)
        self.eps = eps

    def forward(self, module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        w = module._parameters.get("weight")
        if len(args) == 1 and w is not None and getattr(args[0], "dtype", None) != w.dtype:
            return self.base.forward(module, *args, **kwargs)  # its output's dtype is the promoted one: its own
        return super().forward(module, args, kwargs)

    def plain(self, x: Any, w: Any, b: Any) -> Any:
        return self.base.forward(self.module(), x)

    def bind(self, x: Any, w: Any, b: Any) -> Callable[..., Any]:
        torch = torch_module()
        plain = self.plain
        if x.dim() < 2 or not x.is_contiguous() or x.dtype != w.dtype or x.numel() == 0:
            return plain
        coded = eps_criterion(self.eps)
        if isinstance(coded, str):
            return plain
        own = self.base.forward(self.module(), x)
        offset = computed_offset(x, w, self.eps, own)
        if offset is None:
            log.warning("farm.apply: %s does not compute a hand-written RMSNorm's output for input %s: its own "
                        "forward runs", self.name, list(x.shape))
            return plain
        from farm.dispatch.calls import problem_for

        problem = problem_for("rmsnorm", {"X": layout(x), "scale": layout(w)},
                              (*coded, (OFFSET_CRITERION, offset)), None, torch_layouts=True, library="module")
        route = self.route(OpCall(KIND, problem))
        if route is None:
            return plain
        call = norm_call(route, x, w, None, plain)
        got = call(x, w, None)
        close = isinstance(got, torch.Tensor) and got.shape == own.shape and got.dtype == own.dtype and \
            torch.allclose(got.float(), own.float(), rtol=2e-2 if x.element_size() < 4 else 1e-4, atol=1e-3)
        if not close:  # a wrong answer is worse than a slow one
            log.warning("farm.apply: %s's routed norm (%s) differs from the module's own output: its own forward runs",
                        self.name, route.labels.get("eager"))
            return plain
        return call
