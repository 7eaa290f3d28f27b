"""The farm's routed calls as torch custom ops, so ``torch.compile(farm.apply(model))`` keeps them.

Under ``torch.compile`` a patched module's forward calls ``torch.ops.farm.linear`` (``conv2d``, ``sdpa``,
``layer_norm``, ``rms_norm``) with its site's number: Dynamo records one opaque op with a fake implementation (the
output's shape, dtype and layout), so the graph does not break and Inductor fuses everything around it; at run
time the op runs the site's own call (the routed plan, or the library call where the decision is the default).
Sites are numbered in ``SITES``, the one registry of them (farm.nn.routing fills and empties it).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional

from farm.nn.torch_calls import torch_module, tunable_functions


class SiteRegistry:
    """Every routed call site by number: what a custom op runs (``run``) and its fake result (``fake``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sites: list[Any] = []

    def add(self, site: Any) -> int:
        with self._lock:
            self._sites.append(site)
            return len(self._sites) - 1

    def remove(self, number: int) -> None:
        with self._lock:
            self._sites[number] = None

    def __getitem__(self, number: int) -> Any:
        site = self._sites[number]
        if site is None:
            raise RuntimeError(f"farm site {number} was removed (farm.unapply): compile the model again")
        return site


SITES = SiteRegistry()


@functools.lru_cache(maxsize=1)
def custom_ops() -> Any:
    """Register the farm's ops once (torch.library) and return ``torch.ops.farm``."""
    torch = torch_module()
    tunable_functions()  # torch's own functions, read before farm.apply patches any
    Tensor = torch.Tensor

    # schemas given: this module's annotations are strings (from __future__ import annotations)
    @torch.library.custom_op("farm::linear", mutates_args=(), schema="(Tensor x, Tensor w, Tensor? b, int site) -> Tensor")
    def linear(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].run(x, w, b)

    @linear.register_fake
    def _(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        return x.new_empty((*x.shape[:-1], w.shape[0]))

    @torch.library.custom_op("farm::conv2d", mutates_args=(), schema="(Tensor x, Tensor w, Tensor? b, int site) -> Tensor")
    def conv2d(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].run(x, w, b)

    @conv2d.register_fake
    def _(x: Tensor, w: Tensor, b: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].fake(x, w, b)  # torch's own layout (channels-last in, channels-last out)

    @torch.library.custom_op("farm::norm", mutates_args=(), schema="(Tensor x, Tensor? w, Tensor? b, int site) -> Tensor")
    def norm(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], site: int) -> Tensor:
        return SITES[site].run(x, w, b)

    @norm.register_fake
    def _(x: Tensor, w: Optional[Tensor], b: Optional[Tensor], site: int) -> Tensor:
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.custom_op("farm::sdpa", mutates_args=(),
                             schema="(Tensor q, Tensor k, Tensor v, bool is_causal, bool enable_gqa, int site) -> Tensor")
    def sdpa(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, enable_gqa: bool, site: int) -> Tensor:
        return SITES[site].run_sdpa(q, k, v, is_causal, enable_gqa)

    @sdpa.register_fake
    def _(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, enable_gqa: bool, site: int) -> Tensor:
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    return torch.ops.farm


def compiling() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (Dynamo reads it as True while it traces; a plain call costs ~0.1 us)."""
    torch = torch_module()
    return torch.compiler.is_compiling
