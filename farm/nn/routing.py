"""Route an unmodified model's operations to the published decisions: ``model = farm.apply(model, "runs/x")``.

Only what a decision changes is touched. A module (``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm``,
``nn.RMSNorm``) is patched only when the file holds a decision for its weight that is not the default (its
``forward`` becomes an instance attribute; ``farm.unapply`` deletes it); ``F.scaled_dot_product_attention`` only
when the file holds a non-default attention decision. Every other call runs as before, at exactly its cost.

A patched forward looks its input's shape up once: the first call of a shape binds it (the decision of each
calling mode, from the file, as production chooses: farm.nn.decided) and keeps either the bound plan's call or
the module's own forward (a default decision); later calls run what was kept, with a check that the input's
dtype and layout and the weight are the bound ones. A call inside a CUDA graph capture runs the graph decision
(``call="auto"``, farm.ops' rule; ``"eager"`` or ``"graph"`` binds one mode's decisions only). Under
``torch.compile`` the forward calls a farm custom op instead (farm.nn.compiled): no graph break.
Run a shape once eagerly before capturing a graph of it (binding compiles plans, which a capture forbids).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from farm.devices.open import open_device
from farm.errors import InputError, UsageError
from farm.model.problem import Problem
from farm.nn.compiled import SITES, compiling, custom_ops
from farm.nn.decided import Decisions, Route
from farm.nn.torch_calls import NORM_EPS, OpCall, layout, read_call, torch_module
from farm.store.targets import resolve

log = logging.getLogger("farm.nn.routing")
CONFIG_ENV = "FARM_HEUR_CONFIG_PATH"
CALL_CHOICES = ("auto", "eager", "graph")


@dataclass
class Routed:
    """A problem the model's calls met, what each calling mode runs for it, and the sites that call it."""

    problem: Problem
    route: Route
    sites: list[str] = field(default_factory=list)


class Applied:
    """The routing of one model (what ``farm.apply`` made): its sites, the problems they met, and a switch
    (``only``) that routes a subset of those problems (the model check's variants)."""

    def __init__(self, model: Any, decisions: Decisions, call: str) -> None:
        self.model = model
        self.decisions = decisions
        self.call = call
        self.routed: dict[str, Routed] = {}
        self.enabled: frozenset[str] | None = None  # None: every routed problem
        self.sites: list[_Site] = []
        self._lock = threading.Lock()

    def route(self, problem: Problem, site: str) -> Route | None:
        """The route of ``problem`` (bound once per problem), or None where this call stays the library's (its
        decisions are the default, or ``only`` leaves it out)."""
        with self._lock:
            r = self.routed.get(problem.key)
            if r is None:
                r = self.routed[problem.key] = Routed(problem, self.decisions.route(problem, self.call))
            if site not in r.sites:
                r.sites.append(site)
        if not r.route.routed or (self.enabled is not None and problem.key not in self.enabled):
            return None
        return r.route

    def only(self, keys: Iterable[str] | None) -> None:
        """Route only these problems (None: all); every site binds its shapes again (cheap: routes are kept)."""
        self.enabled = None if keys is None else frozenset(keys)
        for s in self.sites:
            s.table.clear()

    def remove(self) -> None:
        for s in self.sites:
            s.restore()
        self.sites.clear()


class AppliedModels:
    """The registry of applied models (a weak mapping: a model dropped by its owner is forgotten)."""

    def __init__(self) -> None:
        self._by_model: "weakref.WeakKeyDictionary[Any, Applied]" = weakref.WeakKeyDictionary()

    def get(self, model: Any) -> Applied | None:
        return self._by_model.get(model)

    def add(self, model: Any, applied: Applied) -> None:
        self._by_model[model] = applied

    def pop(self, model: Any) -> Applied | None:
        return self._by_model.pop(model, None)


APPLIED = AppliedModels()


def apply(model: Any, overrides: str | None = None, *, call: str = "auto") -> Any:
    """Route ``model``'s operations to the decisions of ``overrides`` (a ``farm tune --out`` folder, a published
    root, or an override file; default ``$FARM_HEUR_CONFIG_PATH``) for the device its parameters are on. Returns
    the model itself (``torch.compile(farm.apply(model))``); ``farm.unapply(model)`` undoes it."""
    if call not in CALL_CHOICES:
        raise UsageError(f"call: expected one of {', '.join(CALL_CHOICES)}, got {call!r}")
    if APPLIED.get(model) is not None:
        unapply(model)
    decisions = decisions_for(model, overrides, call)
    applied = Applied(model, decisions, call)
    names = {id(m): n for n, m in model.named_modules()}
    for module in model.modules():
        site = _site_for(applied, module, names.get(id(module), type(module).__name__))
        if site is not None:
            applied.sites.append(site)
    if decisions.may_route("sdpa_fwd"):
        applied.sites.append(_SdpaSite(applied))
    APPLIED.add(model, applied)
    log.info("farm.apply: %d site(s) routed from %s", len(applied.sites), decisions.path)
    return model


def unapply(model: Any) -> Any:
    """Undo ``farm.apply``: every patched forward and function as it was. Returns the model."""
    applied = APPLIED.pop(model)
    if applied is not None:
        applied.remove()
    return model


def applied_to(model: Any) -> Applied | None:
    """The routing ``farm.apply`` made of ``model`` (None when it is not applied)."""
    return APPLIED.get(model)


def decisions_for(model: Any, overrides: str | None, call: str = "auto") -> Decisions:
    """The decisions production would read on the device ``model``'s parameters are on (of calling mode ``call``)."""
    given = overrides or os.environ.get(CONFIG_ENV)
    if not given:
        raise UsageError(f"no override file: give one (a run folder, a published root or a file) or set {CONFIG_ENV}")
    param = next(iter(model.parameters()), None)
    where = param.device if param is not None else None
    if where is None or where.type == "meta":
        raise UsageError("the model's parameters must be on the device that runs it (not meta) to apply decisions")
    device = open_device("cpu" if where.type == "cpu" else "cuda", where.index or 0)
    return Decisions(resolve(str(given), device).path, device, ("eager", "graph") if call == "auto" else (call,))


# -- sites ----------------------------------------------------------------------------------------
def _site_for(applied: Applied, module: Any, name: str) -> "_Site | None":
    torch = torch_module()
    nn, d = torch.nn, applied.decisions
    weight = getattr(module, "weight", None)
    if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward:
        w = layout(weight)
        return _LinearSite(applied, module, name) if d.may_route("matmul", ((w[0][1], w[0][0]), (w[1][1], w[1][0]), w[2])) \
            else None
    if isinstance(module, nn.Conv2d) and type(module).forward is nn.Conv2d.forward and module.padding_mode == "zeros":
        return _ModuleSite(applied, module, name, "conv2d") if d.may_route("conv_fprop", layout(weight)) else None
    norms = {nn.LayerNorm: ("layernorm", "layer_norm"), getattr(nn, "RMSNorm", None): ("rmsnorm", "rms_norm")}
    for cls, (op, kind) in norms.items():
        eps = getattr(module, "eps", None)
        if cls is not None and type(module) is cls and weight is not None and eps is not None and \
                math.isclose(eps, NORM_EPS, rel_tol=1e-9) and d.may_route(op, layout(weight)):
            return _ModuleSite(applied, module, name, kind)
    return None


class _Site:
    """One patched call site: its table of input layouts -> what runs, its custom-op number."""

    kind = ""

    def __init__(self, applied: Applied, name: str) -> None:
        self.applied = applied
        self.name = name
        self.table: dict[Any, Callable[..., Any]] = {}
        self.number = SITES.add(self)
        custom_ops()

    def restore(self) -> None:
        SITES.remove(self.number)

    def bind(self, call: OpCall | Any, fast: Callable[[Route], Callable[..., Any]], original: Callable[..., Any]
             ) -> Callable[..., Any]:
        """What a call of this layout runs: the route's call (``fast(route)``), or ``original``."""
        if not isinstance(call, OpCall):
            return original  # a call the farm cannot run as written (torch_calls says why)
        route = self.applied.route(call.problem, f"{self.name} ({self.kind})")
        return fast(route) if route is not None else original


class _LinearSite(_Site):
    kind = "linear"

    def __init__(self, applied: Applied, module: Any, name: str) -> None:
        super().__init__(applied, name)
        self.module = module
        self.original = type(module).forward.__get__(module)
        ops, is_compiling, table, number = custom_ops(), compiling(), self.table, self.number

        def forward(x: Any) -> Any:
            if is_compiling():
                return ops.linear(x, module.weight, module.bias, number)
            fn = table.get(x.shape)
            if fn is None:
                fn = table[x.shape] = self.resolve(x)
            return fn(x)

        self.run = lambda x, w, b: forward(x)  # the custom op's runtime: the module's own call (its weight)
        module.forward = forward

    def restore(self) -> None:
        self.module.__dict__.pop("forward", None)
        super().restore()

    def resolve(self, x: Any) -> Callable[..., Any]:
        module, original = self.module, self.original
        params = module._parameters
        w, b = params["weight"], params.get("bias")
        if not x.is_contiguous():
            return original  # the routed call views x as [M, K]
        got = read_call(torch_module().nn.functional.linear, (x, w, b), {})
        return self.bind(got, lambda route: _linear_call(route, x, params, w, b, original), original)


def _linear_call(route: Route, x: Any, params: dict[str, Any], w: Any, b: Any, original: Callable[..., Any]
                 ) -> Callable[..., Any]:
    # the routed plans compute no gradient: with autograd recording, the module's own forward runs
    grad = torch_module().is_grad_enabled
    wt, bd, dtype, shape = w.detach().t(), (b.detach() if b is not None else None), x.dtype, tuple(x.shape)
    k, n = shape[-1], w.shape[0]
    flat = len(shape) != 2
    rows, out_shape = (x.numel() // k if k else 0), (*shape[:-1], n)
    pick = _chooser(route)
    _prime(route, {"A": x.view(rows, k), "B": wt, **({"bias": bd} if bd is not None else {})})

    def call(x: Any) -> Any:
        if x.dtype is not dtype or params["weight"] is not w or params.get("bias") is not b or not x.is_contiguous():
            return original(x)
        run = pick()
        if run is None or grad() and (x.requires_grad or w.requires_grad):
            return original(x)
        tensors = {"A": x.view(rows, k) if flat else x, "B": wt}
        if bd is not None:
            tensors["bias"] = bd
        y = run(tensors)
        return y.view(out_shape) if flat else y

    return call


def _prime(route: Route, tensors: dict[str, Any]) -> None:
    """Run the graph decision once now, outside any capture, where eager calls run something else: a plan's
    lazily made state (split-K's partials, a stream's scratch) is then made outside the graph's memory pool, which
    torch.compile's CUDA graphs require of everything that outlives a recording."""
    graph = route.graph
    if graph is None or graph is route.eager:
        return
    torch = torch_module()
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    graph.call(tensors)


def _chooser(route: Route) -> Callable[[], Callable[..., Any] | None]:
    """Which binding a call runs: the graph decision while a graph is being captured, else the eager one (None:
    the library call, the mode's decision being the default)."""
    eager = route.eager.call if route.eager is not None else None
    graph = route.graph.call if route.graph is not None else None
    if eager is graph or graph is None and eager is None:
        return lambda: eager
    torch = torch_module()
    capturing = torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else (lambda: False)
    return lambda: graph if capturing() else eager


class _ModuleSite(_Site):
    """nn.Conv2d, nn.LayerNorm and nn.RMSNorm: the module's own forward, or the route's plan for its input."""

    def __init__(self, applied: Applied, module: Any, name: str, kind: str) -> None:
        super().__init__(applied, name)
        self.kind = kind
        self.module = module
        self.original = type(module).forward.__get__(module)
        ops, is_compiling, table, number = custom_ops(), compiling(), self.table, self.number
        op = ops.conv2d if kind == "conv2d" else ops.norm

        def forward(x: Any) -> Any:
            if is_compiling():
                return op(x, module.weight, getattr(module, "bias", None), number)
            key = (x.shape, x.stride(), x.dtype)
            fn = table.get(key)
            if fn is None:
                fn = table[key] = self.resolve(x)
            return fn(x)

        self.run = lambda x, w, b: forward(x)
        module.forward = forward

    def fake(self, x: Any, w: Any, b: Any) -> Any:
        """The custom op's result on fake tensors: torch's own convolution of them (its output layout)."""
        m = self.module
        return torch_module().nn.functional.conv2d(x, w, b, m.stride, m.padding, m.dilation, m.groups)

    def restore(self) -> None:
        self.module.__dict__.pop("forward", None)
        super().restore()

    def resolve(self, x: Any) -> Callable[..., Any]:
        torch = torch_module()
        F, m, original = torch.nn.functional, self.module, self.original
        params = m._parameters
        w, b = params.get("weight"), params.get("bias")
        if self.kind == "conv2d":
            got = read_call(F.conv2d, (x, w, None, m.stride, m.padding, m.dilation, m.groups), {})
            return self.bind(got, lambda route: _conv_call(route, x, params, w, b, original), original)
        if self.kind == "layer_norm":
            got = read_call(F.layer_norm, (x, m.normalized_shape, w, b, m.eps), {})
            return self.bind(got, lambda route: _plain_call(route, x, params, {"X": None, "scale": w, "bias": b},
                                                            original), original)
        got = read_call(F.rms_norm, (x, m.normalized_shape, w, m.eps), {})
        return self.bind(got, lambda route: _plain_call(route, x, params, {"X": None, "scale": w}, original), original)


def _conv_call(route: Route, x: Any, params: dict[str, Any], w: Any, b: Any, original: Callable[..., Any]
               ) -> Callable[..., Any]:
    pick, grad = _chooser(route), torch_module().is_grad_enabled
    bias = b.detach().view(1, -1, 1, 1) if b is not None else None
    wd = w.detach()
    _prime(route, {"X": x, "W": wd})

    def call(x: Any) -> Any:
        run = pick()
        if run is None or params["weight"] is not w or params.get("bias") is not b or \
                grad() and (x.requires_grad or w.requires_grad):
            return original(x)
        y = run({"X": x, "W": wd})
        return y.add_(bias) if bias is not None else y

    return call


def _plain_call(route: Route, x: Any, params: dict[str, Any], tensors: dict[str, Any], original: Callable[..., Any]
                ) -> Callable[..., Any]:
    pick, grad = _chooser(route), torch_module().is_grad_enabled
    w = tensors.get("scale")
    detached = {k: v.detach() for k, v in tensors.items() if v is not None}
    _prime(route, {**detached, "X": x})

    def call(x: Any) -> Any:
        run = pick()
        if run is None or params["weight"] is not w or grad() and (x.requires_grad or w.requires_grad):
            return original(x)
        return run({**detached, "X": x})

    return call


class _SdpaSite(_Site):
    """``F.scaled_dot_product_attention`` itself (a function, not a module): patched in torch.nn.functional while
    the model is applied, for calls without a mask, dropout or a scale of their own."""

    kind = "sdpa"

    def __init__(self, applied: Applied) -> None:
        super().__init__(applied, "F.scaled_dot_product_attention")
        torch = torch_module()
        self.F = F = torch.nn.functional
        self.original = original = F.scaled_dot_product_attention
        ops, is_compiling, number = custom_ops(), compiling(), self.number

        def sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
                 scale: Any = None, enable_gqa: bool = False) -> Any:
            if attn_mask is not None or dropout_p or scale is not None:
                return original(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
            if is_compiling():
                return ops.sdpa(q, k, v, is_causal, enable_gqa, number)
            return self.run_sdpa(q, k, v, is_causal, enable_gqa, contiguous=False)

        self.patched = sdpa
        F.scaled_dot_product_attention = sdpa

    def run_sdpa(self, q: Any, k: Any, v: Any, is_causal: bool, enable_gqa: bool, contiguous: bool = True) -> Any:
        key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, is_causal, enable_gqa)
        fn = self.table.get(key)
        if fn is None:
            fn = self.table[key] = self.resolve(q, k, v, is_causal, enable_gqa)
        out = fn(q, k, v)
        return out.contiguous() if contiguous else out  # the custom op's fake is contiguous

    def resolve(self, q: Any, k: Any, v: Any, is_causal: bool, enable_gqa: bool) -> Callable[..., Any]:
        original = self.original

        def plain(q: Any, k: Any, v: Any) -> Any:
            return original(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)

        got = read_call(original, (q, k, v), {"is_causal": is_causal, "enable_gqa": enable_gqa})

        def fast(route: Route) -> Callable[..., Any]:
            pick = _chooser(route)
            _prime(route, {"Q": q, "K": k, "V": v})

            grad = torch_module().is_grad_enabled

            def call(q: Any, k: Any, v: Any) -> Any:
                run = pick()
                if run is None or grad() and (q.requires_grad or k.requires_grad or v.requires_grad):
                    return plain(q, k, v)
                return run({"Q": q, "K": k, "V": v})

            return call

        return self.bind(got, fast, plain)

    def restore(self) -> None:
        if self.F.scaled_dot_product_attention is self.patched:
            self.F.scaled_dot_product_attention = self.original
        else:
            raise InputError("F.scaled_dot_product_attention was replaced again after farm.apply; not restored",
                             field="torch.nn.functional.scaled_dot_product_attention")
        super().restore()
