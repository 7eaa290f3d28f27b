"""Routed modules: ``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm`` and ``nn.RMSNorm`` running the farm's decision.

``farm.apply`` gives such a module (and any module whose forward calls routed functions: farm.nn.function_scope)
a subclass of its own class (``routed_class``: same name, a forward that asks the module's site, ``_farm_site``).
A subclass rather than an instance attribute, so that what Python does with the object stays right:
``copy.deepcopy``, ``pickle`` and ``torch.save`` give the plain module (its own class and weights, no routing),
and ``model.half()``, ``.to()`` and every other ``_apply`` make the site forget what it bound.

A site binds each input layout once (the decision of each calling mode, farm.nn.decided) and keeps the bound
call. A bound call runs only on the weight it was bound to: the same memory (data pointer; the bound tensor is
held, so no other can take its address), dtype, shape and strides. A weight replaced in any way
(``param.data = ...``, ``load_state_dict(assign=True)``, a quantizer) binds again on its next call; an input of
another dtype, layout or device, autocast, or autograd recording runs the module's own call. Under
``torch.compile`` the forward calls the farm's custom op (farm.nn.compiled) with the current tensors.
"""

from __future__ import annotations

import contextlib
import copyreg
import functools
import logging
import weakref
from typing import Any, Callable, Iterator, Mapping

from farm.devices.device import graph_pool_active
from farm.nn.compiled import SITES, compiling, custom_ops
from farm.nn.decided import Route
from farm.nn.torch_calls import OpCall, capture_check, graph_capturing, read_call, torch_module, torch_output_layout

log = logging.getLogger("farm.nn.module_sites")
SITE_ATTR = "_farm_site"
REBIND = object()  # what a bound call returns when the weight is not the one it was bound to


@functools.lru_cache(maxsize=None)
def routed_class(base: type) -> type:
    """``base`` with its forward asking the module's site; copies and pickles of it are plain ``base``."""

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._farm_site.forward(self, args, kwargs)

    def _apply(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = base._apply(self, *args, **kwargs)
        site = self.__dict__.get(SITE_ATTR)
        if site is not None:
            site.forget()  # .half(), .to(), .cuda(): new tensors; bind again
        return out

    def __reduce_ex__(self: Any, protocol: int) -> Any:
        # deepcopy, pickle and torch.save: the plain module (copyreg's reconstructor: loads without tunefarm)
        state = {k: v for k, v in self.__getstate__().items() if k != SITE_ATTR}
        return copyreg._reconstructor, (base, object, None), state

    return type(base.__name__, (base,), {"forward": forward, "_apply": _apply, "__reduce_ex__": __reduce_ex__,
                                         "_farm_base": base, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__, "__doc__": base.__doc__})


def install(module: Any, site: Any) -> bool:
    """Route ``module`` through ``site`` (False: another applied model routes it already)."""
    if SITE_ATTR in module.__dict__:
        return False
    module.__dict__[SITE_ATTR] = site
    module.__class__ = routed_class(type(module))
    return True


def uninstall(module: Any, site: Any) -> None:
    """``module`` as it was before ``install``: its own class, no site."""
    if module.__dict__.get(SITE_ATTR) is not site:
        return
    cls = type(module)
    base = getattr(cls, "_farm_base", None)
    if base is not None and cls is routed_class(base):
        module.__class__ = base
        del module.__dict__[SITE_ATTR]
    else:  # something subclassed the routed class since (torch.nn.utils.parametrize): keep it, route nothing
        site.disable()
        log.warning("farm.unapply: %s was given another class after farm.apply; its calls are the module's own now",
                    site.name)


class Site:
    """What every routed call site shares: its name, its number (the custom ops'), its table of bound calls."""

    kind = ""

    def __init__(self, applied: Any, name: str) -> None:
        torch = torch_module()
        self.applied = applied
        self.name = name
        self.label = f"{name} ({self.kind})"
        self.table: dict[Any, Callable[..., Any]] = {}
        self.ops = custom_ops()
        self.number = SITES.add(self)
        self.compiling = compiling()
        self.grad = torch.is_grad_enabled
        self.autocast = torch._C._is_any_autocast_enabled
        self.autocast_on = torch.is_autocast_enabled  # (device type): what Dynamo reads while it traces
        self.tracing = torch._C._get_tracing_state  # torch.jit.trace records the model's own calls (None: not)
        self.enabled = True

    def forget(self) -> None:
        self.table.clear()

    def disable(self) -> None:
        self.enabled = False
        self.forget()

    def restore(self) -> None:
        self.disable()
        SITES.remove(self.number)

    def route(self, got: Any, label: str | None = None) -> Route | None:
        """The route of a call the readers made a problem of (made at ``label``: this site's, by default); None
        where the call stays the library's."""
        if not self.enabled or not isinstance(got, OpCall):
            return None
        return self.applied.route(got.problem, label or self.label)


class InstalledSite(Site):
    """A site of one module (installed on it: ``install``): the module's own class, held weakly."""

    def __init__(self, applied: Any, module: Any, name: str) -> None:
        super().__init__(applied, name)
        self.base = type(module)
        self.module = weakref.ref(module)

    def restore(self) -> None:
        module = self.module()
        if module is not None:
            uninstall(module, self)
        super().restore()


class ModuleSite(InstalledSite):
    """A routed module's forward: the module's own call, or the bound decision for its input's layout."""

    strided_key = True  # keyed by the input's shape, strides and dtype
    farm_op = ""  # the op of the problems its calls make (farm.model's: matmul, conv_fprop, rmsnorm, layernorm)

    def __init__(self, applied: Any, module: Any, name: str) -> None:
        super().__init__(applied, module, name)
        self.op = getattr(self.ops, {"linear": "linear", "conv2d": "conv2d"}.get(self.kind, "norm"))
        self.capturing = capture_check()

    def forward(self, module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        if self.farm_op not in self.applied.eager_ops and not self.compiling() and not self.capturing():
            # no decision of its op runs in eager now: the module's own call, paying none of routing's checks
            return self.base.forward(module, *args, **kwargs)
        p = module._parameters
        if kwargs or len(args) != 1 or "weight" not in p or not self.enabled:
            return self.base.forward(module, *args, **kwargs)  # module(input=x) and the like: its own call
        x, w, b = args[0], p["weight"], p.get("bias")
        if self.compiling():
            if self.autocast_on(x.device.type) or needs_grad(self.grad, x, w, b):
                return self.base.forward(module, x)
            return self.op(x, w, b, self.number)
        return self.run(x, w, b)

    def run(self, x: Any, w: Any, b: Any) -> Any:
        """The call on these tensors (also the custom op's runtime)."""
        # (autograd inline, not needs_grad: this is every routed call's host cost)
        if self.autocast() or self.tracing() is not None or \
                self.grad() and (x.requires_grad or w.requires_grad or b is not None and b.requires_grad):
            return self.plain(x, w, b)
        key = self.key(x)
        fn = self.table.get(key)
        if fn is None:
            if in_graph_pool(x):  # binding builds plans whose memory would outlive the recording
                return self.plain(x, w, b)
            fn = self.table[key] = self.bind(x, w, b)
        y = fn(x, w, b)
        if y is REBIND:  # a new weight: bind it
            fn = self.table[key] = self.bind(x, w, b)
            y = fn(x, w, b)
            if y is REBIND:  # replaced again meanwhile (another thread reloading weights): the module's own call
                return self.plain(x, w, b)
        return y

    def key(self, x: Any) -> Any:
        return (x.shape, x.stride(), x.dtype) if self.strided_key or not x.is_contiguous() else x.shape

    def prebind(self, x: Any) -> None:
        """Bind the layout of ``x`` (a fake tensor: the custom op's fake implementation, while torch.compile
        traces) now, outside any CUDA graph's pool: the compiled model's first calls, which torch.compile's
        CUDA graphs run in their pool, then find it bound."""
        module = self.module()
        if module is None or not self.enabled or not static_layouts(x) or self.key(x) in self.table:
            return
        p = module._parameters
        with real_tensors():
            dummy = dummy_like_layout(x)
            self.table[self.key(x)] = self.bind(dummy, p["weight"], p.get("bias"))

    def plain(self, x: Any, w: Any, b: Any) -> Any:
        raise NotImplementedError  # pragma: no cover - every site overrides it

    def bind(self, x: Any, w: Any, b: Any) -> Callable[..., Any]:
        raise NotImplementedError  # pragma: no cover - every site overrides it


class LinearSite(ModuleSite):
    farm_op = "matmul"
    kind = "linear"
    strided_key = False  # a contiguous input keyed by its shape: the bound call checks dtype, layout and device

    def plain(self, x: Any, w: Any, b: Any) -> Any:
        return torch_module().nn.functional.linear(x, w, b)

    def bind(self, x: Any, w: Any, b: Any) -> Callable[..., Any]:
        plain = torch_module().nn.functional.linear
        if x.dim() < 2:
            return plain
        route = self.route(read_call(plain, (x, w, b), {}))
        return _linear_call(route, x, w, b, plain) if route is not None else plain


class ConvSite(ModuleSite):
    farm_op = "conv_fprop"
    kind = "conv2d"

    def _args(self) -> tuple[Any, Any, Any, int]:
        m = self.module()
        return m.stride, m.padding, m.dilation, m.groups

    def plain(self, x: Any, w: Any, b: Any) -> Any:
        return torch_module().nn.functional.conv2d(x, w, b, *self._args())

    def fake(self, x: Any, w: Any, b: Any) -> Any:
        """The custom op's result on fake tensors: torch's own convolution of them (its output layout)."""
        return self.plain(x, w, b)

    def bind(self, x: Any, w: Any, b: Any) -> Callable[..., Any]:
        F = torch_module().nn.functional
        args = self._args()
        route = self.route(read_call(F.conv2d, (x, w, None, *args), {}))
        if route is None:
            return self.plain
        y = route.problem.tensor("Y")
        if (y.dims, y.strides) != torch_output_layout(F.conv2d, (x, w, None, *args)):
            # a routed call returns what torch's returns, layout included (the next layer's decision is for it)
            log.info("farm.apply: %s keeps torch's convolution: its output layout is not the problem's", self.name)
            return self.plain
        return _conv_call(route, x, w, b, self.plain)


NORM_KINDS = ("layer_norm", "rms_norm")


def routable_norm(module: Any) -> bool:
    """A module whose norm farm.apply routes: torch's own nn.LayerNorm or nn.RMSNorm (a subclass with a forward of
    its own computes its own way: timm's LayerNorm, a hand-written RMSNorm)."""
    nn = torch_module().nn
    return type(module) in (nn.LayerNorm, getattr(nn, "RMSNorm", nn.LayerNorm))


class NormSite(ModuleSite):
    """nn.LayerNorm (``kind`` layer_norm) and nn.RMSNorm (rms_norm) over the last dim."""

    def __init__(self, applied: Any, module: Any, name: str, kind: str) -> None:
        self.kind = kind
        self.farm_op = "layernorm" if kind == "layer_norm" else "rmsnorm"
        super().__init__(applied, module, name)

    def plain(self, x: Any, w: Any, b: Any) -> Any:
        F, m = torch_module().nn.functional, self.module()
        if self.kind == "layer_norm":
            return F.layer_norm(x, m.normalized_shape, w, b, m.eps)
        return F.rms_norm(x, m.normalized_shape, w, m.eps)

    def bind(self, x: Any, w: Any, b: Any) -> Callable[..., Any]:
        F, m = torch_module().nn.functional, self.module()
        if not x.is_contiguous():
            return self.plain  # torch's norms keep a strided input's layout; the farm's write rows
        if self.kind == "layer_norm":
            got = read_call(F.layer_norm, (x, m.normalized_shape, w, b, m.eps), {})
        else:
            got = read_call(F.rms_norm, (x, m.normalized_shape, w, m.eps), {})
        route = self.route(got)
        return norm_call(route, x, w, b, self.plain) if route is not None else self.plain


def in_graph_pool(t: Any) -> bool:
    """A GPU tensor's call made while a CUDA graph's pool takes what is allocated (farm.devices.device): a new
    layout is not bound then (plans and their buffers would outlive the recording); torch's own call runs."""
    return t.is_cuda and graph_pool_active(t.get_device())


@contextlib.contextmanager
def real_tensors() -> Iterator[None]:
    """Real tensors and real kernels inside a fake implementation: no fake tensor mode (the modes above it are
    popped while it runs the op) and no torch function mode (a scope's) while the block runs."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    torch = torch_module()
    with unset_fake_temporarily(), torch._C.DisableTorchFunction():
        yield


def dummy_like_layout(t: Any) -> Any:
    """A real tensor of ``t``'s shape, strides, dtype and device, of values a call can be checked on (normal
    floats; an attention mask's True everywhere)."""
    torch = torch_module()
    shape, stride = tuple(t.shape), tuple(t.stride())
    size = 1 + sum((d - 1) * s for d, s in zip(shape, stride)) if all(shape) else 0
    memory = torch.empty(size, dtype=t.dtype, device=t.device)  # filled whole, then viewed (an expanded mask too)
    if memory.is_floating_point():
        memory.normal_()
    else:
        memory.fill_(True if memory.dtype == torch.bool else 0)
    return memory.as_strided(shape, stride)


def static_layouts(*tensors: Any) -> bool:
    """Every size and stride a plain int (no symbolic dims of a dynamic-shape trace)."""
    return all(t is None or all(type(v) is int for v in (*t.shape, *t.stride())) for t in tensors)


def needs_grad(grad_enabled: Callable[[], bool], *tensors: Any) -> bool:
    """Autograd records this call: grad mode is on and a tensor it reads needs a gradient (then the module's own
    call runs, so every gradient, a trainable bias's or mask's included, is torch's)."""
    return grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# -- bound calls -------------------------------------------------------------------------------------
def same_tensors(w: Any, b: Any) -> Callable[[Any, Any], bool]:
    """Whether a call's weight and bias are the bound ones: the same memory, dtype, shape and strides (a cheap
    check; the bound call holds the tensors, so no other tensor can be at their address)."""
    wptr, wdt, wshape, wstride = w.data_ptr(), w.dtype, w.shape, w.stride()
    if b is None:
        return lambda w2, b2: b2 is None and w2.data_ptr() == wptr and w2.dtype is wdt and w2.shape == wshape \
            and w2.stride() == wstride
    bptr, bdt, bshape = b.data_ptr(), b.dtype, b.shape
    return lambda w2, b2: b2 is not None and w2.data_ptr() == wptr and b2.data_ptr() == bptr and \
        w2.dtype is wdt and b2.dtype is bdt and w2.shape == wshape and b2.shape == bshape and w2.stride() == wstride


def chooser(route: Route) -> Callable[[], Callable[..., Any] | None]:
    """Which binding a call runs: the graph decision while a graph is being captured, else the eager one (None:
    the library call, the mode's decision being the default)."""
    eager = route.eager.call if route.eager is not None else None
    graph = route.graph.call if route.graph is not None else None
    if eager is graph or graph is None and eager is None:
        return lambda: eager
    capturing = capture_check()
    return lambda: graph if capturing() else eager


def prime(route: Route, tensors: dict[str, Any]) -> None:
    """Run the graph decision once now, outside any capture, where eager calls run something else: a plan's
    lazily made state (split-K's partials, a stream's scratch) is then made outside the graph's memory pool, which
    torch.compile's CUDA graphs require of everything that outlives a recording."""
    graph = route.graph
    if graph is None or graph is route.eager:
        return
    if graph_capturing():
        return
    graph.call(tensors)


def _linear_call(route: Route, x: Any, w: Any, b: Any, plain: Callable[..., Any]) -> Callable[..., Any]:
    wt, bd, dtype, shape, device = w.detach().t(), (b.detach() if b is not None else None), x.dtype, \
        tuple(x.shape), x.get_device()
    # a matrix is bound in its own layout (a class token's rows of a longer sequence: a row stride past K); an
    # input of more dims is folded to [M, K] as torch folds it (a copy where it is a strided view)
    strides = None if x.is_contiguous() else x.stride()
    same = same_tensors(w, b)
    k, n = shape[-1], w.shape[0]
    flat = len(shape) != 2
    rows, out_shape = (x.numel() // k if k else 0), (*shape[:-1], n)
    pick = chooser(route)
    prime(route, {"A": x.reshape(rows, k), "B": wt, **({"bias": bd} if bd is not None else {})})

    def call(x: Any, w: Any, b: Any) -> Any:
        if not same(w, b):
            return REBIND
        run = pick()
        if run is None or x.dtype is not dtype or x.get_device() != device or \
                not flat and (x.stride() != strides if strides is not None else not x.is_contiguous()):
            return plain(x, w, b)
        # folded to [M, K] as torch's linear folds it (a copy where the input is a strided view)
        tensors = {"A": x.reshape(rows, k) if flat else x, "B": wt}
        if bd is not None:
            tensors["bias"] = bd
        y = run(tensors)
        return y.view(out_shape) if flat else y

    return call


def _held_call(route: Route, x: Any, w: Any, b: Any, plain: Callable[..., Any], held: dict[str, Any],
               finish: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """A call of the decision with the module's weights as bound (``held``, detached) and the input as "X";
    ``finish(y)``: what the module adds after it (a conv's bias)."""
    same, device = same_tensors(w, b), x.get_device()
    pick = chooser(route)
    prime(route, {**held, "X": x})

    def call(x: Any, w: Any, b: Any) -> Any:
        if not same(w, b):
            return REBIND
        run = pick()
        if run is None or x.get_device() != device:
            return plain(x, w, b)
        y = run({**held, "X": x})
        return finish(y) if finish is not None else y

    return call


def _conv_call(route: Route, x: Any, w: Any, b: Any, plain: Callable[..., Any]) -> Callable[..., Any]:
    bias = b.detach().view(1, -1, 1, 1) if b is not None else None
    return _held_call(route, x, w, b, plain, {"W": w.detach()}, (lambda y: y.add_(bias)) if bias is not None else None)


def norm_call(route: Route, x: Any, w: Any, b: Any, plain: Callable[..., Any]) -> Callable[..., Any]:
    return _held_call(route, x, w, b, plain, {"scale": w.detach(), **({"bias": b.detach()} if b is not None else {})})
