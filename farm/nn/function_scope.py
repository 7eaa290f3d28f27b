"""Routed function calls of one applied model: attention, and the matmuls a module makes itself.

``F.scaled_dot_product_attention`` is a function, not a module, and ``torch.addmm`` inside transformers'
``Conv1D`` (GPT-2) is a module's call of its own weight; neither can be routed by patching a module type. A
``FunctionScope`` routes them with a torch function mode entered only around the forward of the modules of its
model that make such calls: nothing in the process is patched, another model's calls are never seen, and
``farm.unapply`` gives every module its own class back.

Which modules those are is found on the model's first eager call of each input shape (``discovery``): the mode is
entered around the whole forward once, a call with a non-default decision names the module making it (the
innermost module being called, read from the interpreter's frames: ``calling_module``), and that module, when it
is one of the model's own, gets a ``ScopeSite`` (farm.nn.module_sites.routed_class); its forward enters the mode,
which is otherwise never entered. Eagerly a call is routed only when the module making it is such a site of this
model: a module that is not the model's (a helper or a teacher held in a list and called from its forward) runs
torch's own call, inside the applied forward too. A scope's calls are bound per layout of every tensor they pass,
so a routed call always runs on the tensors it is given (no weight is kept). Under ``torch.compile`` (where no
frame can be read) the mode routes the calls of a scoped forward's kinds through the farm's custom ops
(``farm::sdpa``, ``farm::matmul``); before any eager call, attention alone (nothing was discovered).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import Any, Callable, Iterable, Mapping

from farm.nn.decided import Route
from farm.nn.module_sites import (SITE_ATTR, InstalledSite, ModuleSite, Site, static_layouts, chooser, dummy_like_layout,
                                  in_graph_pool, install, needs_grad, prime, real_tensors)
from farm.nn.torch_calls import (default_scale, graph_capturing, read_call, read_matmul, torch_module,
                                  torch_output_layout)

log = logging.getLogger("farm.nn.function_scope")
SDPA = "sdpa"
COMPILED = "(compiled) (function)"  # the label of a call a custom op makes (no frame tells its module)
MATMULS = ("linear", "matmul", "bmm", "addmm")


def routed_functions() -> dict[Any, str]:
    """torch function -> the kind of call a scope routes (every spelling of it)."""
    torch = torch_module()
    F = torch.nn.functional
    out: dict[Any, str] = {F.scaled_dot_product_attention: SDPA, F.linear: "linear"}
    for f in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm):
        out[f] = "matmul"
    for f in (torch.bmm, torch.Tensor.bmm):
        out[f] = "bmm"
    for f in (torch.addmm, torch.Tensor.addmm):
        out[f] = "addmm"
    return out


def _mode_class() -> type:
    torch = torch_module()

    class ScopeMode(torch.overrides.TorchFunctionMode):
        """Routes the calls of ``kinds`` through its scope; every other call runs as it is."""

        def __init__(self, scope: "FunctionScope", kinds: frozenset[str]) -> None:
            super().__init__()
            self.scope, self.kinds, self.funcs = scope, kinds, scope.funcs

        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            kind = self.funcs.get(func)
            if kind is None or kind not in self.kinds:
                return func(*args, **kwargs)
            return self.scope.call(kind, func, args, kwargs)

    return ScopeMode


class FunctionScope(Site):
    """The function routing of one applied model (see the module's text)."""

    kind = "function"

    def __init__(self, applied: Any, root: Any, live: Callable[[], bool]) -> None:
        super().__init__(applied, "functions")
        self.funcs = routed_functions()
        self.mode_class = _mode_class()
        self.live = live  # whether any function decision is routed in the calling mode now (a graph capture...)
        self.local = threading.local()  # per thread: the depth of the mode, whether it discovers
        self.sites: list[ScopeSite] = []
        self.names: dict[int, str] = {}
        self.found: dict[int, tuple[Any, set[str]]] = {}
        self._found_lock = threading.Lock()
        self.kinds: frozenset[str] = frozenset()  # what any site of this scope routes: what the mode intercepts
        self.root = ScopeSite(self, root, "(model)", frozenset({SDPA}), discovering=True)
        install(root, self.root)

    # -- entering -------------------------------------------------------------------------------------
    def depth(self) -> int:
        return getattr(self.local, "depth", 0)

    def entered(self, kinds: frozenset[str], run: Callable[[], Any]) -> Any:
        """``run()`` inside this scope's mode (once: a scope inside a scope adds nothing)."""
        if self.depth():
            return run()
        self.local.depth = 1
        try:
            with self.mode_class(self, kinds):
                return run()
        finally:
            self.local.depth = 0

    def discovering(self) -> bool:
        return getattr(self.local, "discovering", False)

    def discover(self, root: Any, run: Callable[[], Any]) -> Any:
        """``run()`` (the root's forward) with every routed call recorded by the module of the model making it;
        then each such module (the root included) routes its calls from now on."""
        self.names = {id(m): n for n, m in root.named_modules()}
        self.local.discovering = True
        try:
            return self.entered(frozenset({SDPA, *MATMULS}), run)
        finally:
            self.local.discovering = False
            self._settle(root)

    def caller(self, kind: str) -> str | None:
        """Where the call being made (of ``kind``) is routed from (its label: the module making it), when this
        scope routes it: the innermost module being called is one of this model's, whose site routes ``kind``
        (while discovering: any of the model's modules but a routed one); None (torch's own call) otherwise."""
        module = calling_module()
        if module is None:
            module = self.root.module()
        site = module.__dict__.get(SITE_ATTR) if hasattr(module, "__dict__") else None
        if self.discovering():
            if isinstance(site, ModuleSite) or id(module) not in self.names:
                return None  # a routed module's own call, or a module that is not the model's
            return f"{self.names[id(module)] or '(model)'} (function)"
        if not isinstance(site, ScopeSite) or site.scope is not self or not site.scoped or kind not in site.kinds:
            return None
        return f"{site.name} (function)"

    def _record(self, module: Any, kind: str) -> None:
        with self._found_lock:
            self.found.setdefault(id(module), (module, set()))[1].add(kind)

    def _settle(self, root: Any) -> None:
        with self._found_lock:
            found, self.found = list(self.found.values()), {}
        for module, kinds in found:
            if module is root:
                self.root.kinds = self.root.kinds | frozenset(kinds)
                self.root.scoped = True
                continue
            site = module.__dict__.get(SITE_ATTR)
            if isinstance(site, ScopeSite) and site.scope is self:
                site.kinds = site.kinds | frozenset(kinds)
                continue
            new = ScopeSite(self, module, self.names.get(id(module), type(module).__name__), frozenset(kinds))
            if install(module, new):
                self.sites.append(new)
                log.info("farm.apply: %s routes its %s calls", new.name, ", ".join(sorted(kinds)))
        self.kinds = frozenset().union(*(s.kinds for s in (self.root, *self.sites) if s.scoped))

    def restore(self) -> None:
        for s in (*self.sites, self.root):
            s.restore()
        self.sites.clear()
        super().restore()

    # -- calls ----------------------------------------------------------------------------------------
    def call(self, kind: str, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """A call the mode routes: the bound decision for its layouts, or ``func`` itself."""
        parsed = _sdpa_args(*args, **kwargs) if kind == SDPA else _matmul_args(kind, *args, **kwargs)
        if parsed is None:
            return func(*args, **kwargs)
        if self.compiling():
            if self.autocast_on(parsed[0].device.type) or needs_grad(self.grad, *parsed[:4]):
                return func(*args, **kwargs)
            if kind == SDPA:
                return self.ops.sdpa(*parsed, self.number)
            return self.ops.matmul(*parsed, self.number)
        if self.autocast() or self.tracing() is not None:
            return func(*args, **kwargs)
        label = self.caller(kind)
        if label is None:
            return func(*args, **kwargs)
        if kind == SDPA:
            out = self.run_sdpa(*parsed, label=label)
        else:
            out = self.run_matmul(*parsed, kind=kind, label=label)
        if out is None:  # the library's call, exactly as the model made it
            return func(*args, **kwargs)
        return out

    def run_sdpa(self, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, gqa: bool,
                 label: str = COMPILED) -> Any:
        """Attention routed for these layouts; None where the call stays the library's."""
        if needs_grad(self.grad, q, k, v, mask):
            return None
        key = _sdpa_key(label, q, k, v, mask, is_causal, gqa)
        fn = self.table.get(key)
        if fn is None:
            if in_graph_pool(q):  # binding builds plans whose memory would outlive the recording
                return None
            fn = self.table[key] = self._bind_sdpa(q, k, v, mask, is_causal, gqa, label)
        if fn is not _library and self.discovering():
            self._record(calling_module() or self.root.module(), SDPA)  # routed in some calling mode
        return fn(q, k, v, mask)

    def _bind_sdpa(self, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, gqa: bool,
                   label: str) -> Callable[..., Any]:
        F = torch_module().nn.functional
        kwargs = {"attn_mask": mask, "is_causal": is_causal, "enable_gqa": gqa}
        route = self.route(read_call(F.scaled_dot_product_attention, (q, k, v), kwargs), label)
        if route is None:
            return _library

        if mask is not None and tuple(mask.shape) != route.problem.tensor("mask").dims:
            mdims, mstrides = route.problem.tensor("mask").dims, mask.stride()  # an expanded mask: its own dims

            def tensors_of(q: Any, k: Any, v: Any, mask: Any) -> dict[str, Any]:
                return {"Q": q, "K": k, "V": v, "mask": mask.as_strided(mdims, mstrides)}
        else:
            def tensors_of(q: Any, k: Any, v: Any, mask: Any) -> dict[str, Any]:
                return {"Q": q, "K": k, "V": v, **({"mask": mask} if mask is not None else {})}

        # the routed call returns torch's own layout (a backend's may be a transposed one that code views)
        expect = torch_output_layout(F.scaled_dot_product_attention, (q, k, v), kwargs)
        return _routed(route, tensors_of(q, k, v, mask), expect, tensors_of)

    def op_sdpa(self, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, gqa: bool) -> Any:
        """The custom op's runtime: the routed call, or the library's."""
        y = None if self.autocast() else self.run_sdpa(q, k, v, mask, is_causal, gqa)
        if y is None:
            F = torch_module().nn.functional
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)
        return y

    def run_matmul(self, a: Any, b: Any, bias: Any, kind: str = "matmul",
                   label: str = COMPILED) -> Any:
        """``a @ b (+ bias)`` (a call of ``kind``) routed for these layouts; None where the call stays the
        library's."""
        if needs_grad(self.grad, a, b, bias):
            return None
        key = _matmul_key(label, a, b, bias)
        fn = self.table.get(key)
        if fn is None:
            if in_graph_pool(a):
                return None
            fn = self.table[key] = self._bind_matmul(a, b, bias, label)
        if fn is not _library and self.discovering():
            self._record(calling_module() or self.root.module(), kind)
        return fn(a, b, bias)

    def _bind_matmul(self, a: Any, b: Any, bias: Any, label: str) -> Callable[..., Any]:
        route = self.route(read_matmul(a, b, bias), label)
        if route is None or not a.is_contiguous():
            return _library
        adims = route.problem.tensor("A").dims
        out_shape = (*a.shape[:-1], b.shape[-1])
        fold = len(adims) != a.dim()

        def tensors_of(a: Any, b: Any, bias: Any) -> dict[str, Any]:
            t = {"A": a.view(adims) if fold else a, "B": b}
            if bias is not None:
                t["bias"] = bias
            return t

        call = _routed(route, tensors_of(a, b, bias), None, tensors_of)
        if not fold:
            return call
        # the plan's C is [M, N], contiguous: torch's own result is that memory viewed as a's leading dims
        return lambda a, b, bias: _viewed(call(a, b, bias), out_shape)

    def prebind(self, *args: Any) -> None:
        """Bind a custom op's call of these layouts (fake tensors, while torch.compile traces) now, outside any CUDA
        graph's pool (as ModuleSite.prebind): the attention op's (q, k, v, mask, is_causal, gqa) or the matmul op's
        (a, b, bias)."""
        tensors = [t for t in args if hasattr(t, "shape")]
        if not self.enabled or not static_layouts(*tensors):
            return
        label = COMPILED
        if len(args) == 6:
            q, k, v, mask, is_causal, gqa = args
            if _sdpa_key(label, q, k, v, mask, is_causal, gqa) in self.table:
                return
            with real_tensors():
                q, k, v, mask = (None if t is None else dummy_like_layout(t) for t in (q, k, v, mask))
                self.table[_sdpa_key(label, q, k, v, mask, is_causal, gqa)] = \
                    self._bind_sdpa(q, k, v, mask, is_causal, gqa, label)
        else:
            a, b, bias = args
            if _matmul_key(label, a, b, bias) in self.table:
                return
            with real_tensors():
                a, b, bias = (None if t is None else dummy_like_layout(t) for t in (a, b, bias))
                self.table[_matmul_key(label, a, b, bias)] = self._bind_matmul(a, b, bias, label)

    def op_matmul(self, a: Any, b: Any, bias: Any) -> Any:
        """The custom op's runtime: the routed call, or the library's."""
        y = None if self.autocast() else self.run_matmul(a, b, bias)
        if y is None:
            torch = torch_module()
            y = torch.matmul(a, b) if bias is None else torch.matmul(a, b).add_(bias)
        return y


@functools.lru_cache(maxsize=1)
def _call_impl_code() -> Any:
    return torch_module().nn.Module._call_impl.__code__


def calling_module() -> Any:
    """The innermost ``nn.Module`` being called on this thread now (the ``self`` of the innermost
    ``Module._call_impl`` frame), or None outside any module's call."""
    code = _call_impl_code()
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is code:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


def _sdpa_key(label: str, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, gqa: bool) -> tuple[Any, ...]:
    return (label, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
            q.device, None if mask is None else (mask.shape, mask.stride(), mask.dtype), is_causal, gqa)


def _matmul_key(label: str, a: Any, b: Any, bias: Any) -> tuple[Any, ...]:
    return (label, "mm", a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype))


def _library(*_args: Any) -> None:
    """A call bound to the library: None, and the mode calls the function exactly as the model did."""
    return None


def _viewed(y: Any, shape: tuple[int, ...]) -> Any:
    return None if y is None else y.view(shape)


def _routed(route: Route, tensors: dict[str, Any], expect: Any,
            tensors_of: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    """A routed function call: the calling mode's decision on the call's own tensors (None where that mode's
    decision is the default), in torch's output layout (``expect``: its shape and strides; None: the plan's)."""
    pick = chooser(route)
    prime(route, dict(tensors))
    out = route.problem.tensor(route.problem.output_ids[0])
    convert = expect is not None and not _same_ignoring_ones(expect[0], expect[1], out.strides)
    torch = torch_module()

    def call(*args: Any) -> Any:
        run = pick()
        if run is None:
            return None
        y = run(tensors_of(*args))
        if convert:
            y = torch.empty_strided(expect[0], expect[1], dtype=y.dtype, device=y.device).copy_(y)
        return y

    return call


def _same_ignoring_ones(dims: Iterable[int], a: Iterable[int], b: Iterable[int]) -> bool:
    """Two layouts of ``dims`` that differ only in the strides of dims of size 1 (the same memory order)."""
    return all(d == 1 or x == y for d, x, y in zip(dims, a, b))


def _sdpa_args(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
               scale: Any = None, enable_gqa: bool = False) -> tuple[Any, ...] | None:
    """(q, k, v, mask, is_causal, enable_gqa) of a call the farm can route, or None (dropout, its own scale)."""
    if dropout_p or not hasattr(q, "dim") or q.dim() != 4 or not default_scale(scale, q.shape[-1]):
        return None
    return q, k, v, attn_mask, bool(is_causal), bool(enable_gqa)


def _matmul_args(kind: str, *args: Any, **kwargs: Any) -> tuple[Any, Any, Any] | None:
    """(a, b, bias) of ``a @ b + bias`` for a call of ``kind``, or None where it is not one (out=, alpha, beta)."""
    try:
        if kind == "linear":
            x, w, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            return (x, w.t(), bias) if w.dim() == 2 and not set(kwargs) - {"bias"} else None
        if kind == "addmm":
            bias, a, b = args[:3]
            if len(args) > 3 or kwargs.get("out") is not None or kwargs.get("beta", 1) != 1 or \
                    kwargs.get("alpha", 1) != 1 or set(kwargs) - {"out", "beta", "alpha"}:
                return None
            return a, b, bias
        a, b = args
        return None if kwargs else (a, b, None)
    except (TypeError, ValueError, AttributeError):
        return None


class ScopeSite(InstalledSite):
    """A module whose forward makes routed function calls: its forward runs inside its scope's mode. The model's
    own (``discovering``) finds those modules on each new input shape's first eager call."""

    kind = "scope"

    def __init__(self, scope: FunctionScope, module: Any, name: str, kinds: frozenset[str],
                 discovering: bool = False) -> None:
        super().__init__(scope.applied, module, name)
        self.scope = scope
        self.kinds = kinds
        self.scoped = not discovering  # the root routes its own calls only once discovery found some
        self.discovering = discovering
        self.seen: set[Any] = set()
        self.lock = threading.Lock()

    def forward(self, module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        def run() -> Any:
            return self.base.forward(module, *args, **kwargs)

        if not self.enabled:
            return run()
        if self.compiling():
            if self.scoped or self.discovering:  # before discovery: attention only (self.kinds)
                with self.scope.mode_class(self.scope, self.kinds):
                    return run()
            return run()
        if self.tracing() is not None:  # torch.jit.trace: the model's own calls are what it records
            return run()
        if self.discovering:  # with a function decision in any calling mode (a graph's is found eagerly too)
            shapes = _shapes(args, kwargs)
            if shapes not in self.seen and not self.scope.depth() and not graph_capturing():
                with self.lock:
                    fresh = shapes not in self.seen
                    self.seen.add(shapes)
                if fresh:
                    return self.scope.discover(module, run)
        if self.scoped and self.scope.live():
            return self.scope.entered(self.scope.kinds, run)
        return run()


def _shapes(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The shapes and dtypes of a call's tensor arguments: one discovery each."""
    def one(a: Any) -> Any:
        return (tuple(a.shape), str(a.dtype)) if hasattr(a, "shape") and hasattr(a, "dtype") else type(a).__name__
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


