"""The farm's routed calls as torch custom ops, so ``torch.compile(farm.apply(model))`` keeps them.

Under ``torch.compile`` a routed module's forward calls ``torch.ops.farm.linear`` (``conv2d``, ``norm``), and a
routed function call ``torch.ops.farm.sdpa`` or ``torch.ops.farm.matmul``, with its site's number: Dynamo
records one opaque op with a fake implementation, so the graph does not break and Inductor fuses everything
around it; at run time the op runs the site's own call (the routed plan, or the library call where the decision
is the default) on the tensors it is given. Each op's fake gives exactly the layout its run returns (a
convolution: torch's own, channels-last in, channels-last out). Sites are numbered in ``SITES``, the one
registry of them (farm.nn.module_sites and farm.nn.function_scope fill it; farm.unapply empties it).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import weakref
from typing import Any, Callable, Optional

from farm.nn.torch_calls import torch_module, tunable_functions

log = logging.getLogger("farm.nn.compiled")


class SiteRegistry:
    """Every routed call site by number: what a custom op runs and its fake result. A site is held weakly: a
    model dropped without ``farm.unapply`` takes its sites with it. Numbers are never given twice (a graph compiled
    for a removed site must fail, not run another), and the registry holds only the sites alive."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a weak reference's callback may run in a collection inside ``add``
        self._sites: dict[int, Callable[[], Any]] = {}
        self._next = itertools.count()

    def add(self, site: Any) -> int:
        with self._lock:
            number = next(self._next)
            self._sites[number] = weakref.ref(site, functools.partial(self._gone, number))
            return number

    def _gone(self, number: int, _ref: Any = None) -> None:
        with self._lock:
            self._sites.pop(number, None)

    def remove(self, number: int) -> None:
        self._gone(number)

    def __len__(self) -> int:
        return len(self._sites)

    def __getitem__(self, number: int) -> Any:
        ref = self._sites.get(number)
        site = ref() if ref is not None else None
        if site is None:
            raise RuntimeError(f"farm site {number} was removed (farm.unapply, or its model is gone): compile the "
                               "model again")
        return site


SITES = SiteRegistry()


@functools.lru_cache(maxsize=1)
def custom_ops() -> Any:
    """Register the farm's ops once (torch.library) and return ``torch.ops.farm``."""
    torch = torch_module()
    tunable_functions()  # torch's own functions, read before any is called through a routed site
    Tensor = torch.Tensor

    # schemas given: this module's annotations are strings (from __future__ import annotations)
    @torch.library.custom_op("farm::linear", mutates_args=(), schema="(Tensor x, Tensor w, Tensor? b, int site) -> Tensor")
    def linear(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].run(x, w, b).contiguous()  # the fake's layout, whatever the input's (a no-op mostly)

    @linear.register_fake
    def _(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        prebind(site, x)
        return x.new_empty((*x.shape[:-1], w.shape[0]))

    @torch.library.custom_op("farm::conv2d", mutates_args=(), schema="(Tensor x, Tensor w, Tensor? b, int site) -> Tensor")
    def conv2d(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].run(x, w, b)

    @conv2d.register_fake
    def _(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        prebind(site, x)
        return SITES[site].fake(x, w, b)  # torch's own layout (channels-last in, channels-last out)

    @torch.library.custom_op("farm::norm", mutates_args=(), schema="(Tensor x, Tensor? w, Tensor? b, int site) -> Tensor")
    def norm(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].run(x, w, b).contiguous()  # rms_norm keeps a strided input's layout: the fake's is dense

    @norm.register_fake
    def _(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], site: int) -> Tensor:
        prebind(site, x)
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.custom_op("farm::sdpa", mutates_args=(),
                             schema="(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, bool enable_gqa, "
                                    "int site) -> Tensor")
    def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool, enable_gqa: bool,
             site: int) -> Tensor:
        return SITES[site].op_sdpa(q, k, v, mask, is_causal, enable_gqa)

    @sdpa.register_fake
    def _(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool, enable_gqa: bool,
          site: int) -> Tensor:
        prebind(site, q, k, v, mask, is_causal, enable_gqa)
        # torch's own layout for these tensors (a backend may return a transposed one): what the run returns
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                                enable_gqa=enable_gqa)

    @torch.library.custom_op("farm::matmul", mutates_args=(), schema="(Tensor a, Tensor b, Tensor? bias, int site) -> Tensor")
    def matmul(a: Tensor, b: Tensor, bias: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].op_matmul(a, b, bias).contiguous()

    @matmul.register_fake
    def _(a: Tensor, b: Tensor, bias: Optional[Tensor], site: int) -> Tensor:
        prebind(site, a, b, bias)
        return a.new_empty((*a.shape[:-1], b.shape[-1]))

    return torch.ops.farm


def prebind(site: int, *args: Any) -> None:
    """While torch.compile traces (an op's fake implementation), bind the site's call of these layouts now, so that
    its compiled calls, which CUDA graphs warm up and record in their own memory pool, find it bound (a site
    binds nothing in that pool). Best effort: a site that cannot bind here binds, or runs torch's call, later."""
    try:
        SITES[site].prebind(*args)
    except Exception as exc:  # tracing goes on; the call binds at run time as it would have
        log.debug("farm: site %d not bound while tracing: %s", site, exc)


def compiling() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (Dynamo reads it as True while it traces; a plain call costs ~0.1 us)."""
    torch = torch_module()
    return torch.compiler.is_compiling
