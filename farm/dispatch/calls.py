"""The per-call path: the op entry points (matmul, sdpa, conv2d, layernorm, rmsnorm) over a binder.

A call looks its tensors' layouts up in a dictionary of bound calls and runs the one it finds; only a new
layout builds a Problem and asks the binder which plan runs it. ``farm.ops`` is one ``OpCalls`` whose binder
asks the device's replay runtime (recorded winners, selection policies); the confirmation stage and
``farm verify`` make others, bound to one measured plan or to a file under test, so what they time is this
same code, dispatch included.

The common call (tensors of one library, no ``out=``) is keyed by a flat tuple of the tensors' shapes,
strides, dtypes and devices, read as cheaply as the library allows (a replayed small GEMM is host-bound:
every attribute read is part of the caller's time).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from farm.dispatch.binding import Binding, Bound
from farm.devices.sim import SimTensor
from farm.dispatch.frameworks import Placement, TorchFramework, placement
from farm.dispatch.guards import layout_check
from farm.errors import InputError
from farm.model.problem import Problem, contiguous_strides

Criteria = tuple[tuple[str, int], ...]
_NDARRAY = np.ndarray


class Binder(Protocol):
    """Chooses the plan for a problem of a call: ``(bound, graph)``, ``graph`` being the plan recorded for
    calls inside a captured graph when another one is (else None), with ``capturing()`` telling a capture."""

    def __call__(self, problem: Problem, where: Placement) -> tuple[Bound, Bound | None, Callable[[], bool] | None]: ...


def problem_of(op: str, tensors: Mapping[str, Any], criteria: Criteria, compute_dtype: str | None
               ) -> tuple[Problem, Placement, dict[str, Any]]:
    """The Problem a call with these tensors is (what a replay looks up), where it runs, and the tensors as
    its framework reads them (numpy views of CPU torch tensors)."""
    where = placement(next(iter(tensors.values())))
    for name, t in tensors.items():
        other = placement(t)
        if (other.kind, other.index, other.back is None) != (where.kind, where.index, where.back is None):
            first = next(iter(tensors))
            raise InputError(f"every tensor of one call must be of one kind and on one device as {first} is "
                             f"({_where(where)})", field=name, value=_where(other))
    if where.back is not None:
        tensors = {k: v.numpy() for k, v in tensors.items()}
    fw = where.framework
    described = {k: fw.describe(v) for k, v in tensors.items()}
    problem = problem_for(op, described, criteria, compute_dtype, torch_layouts=isinstance(fw, TorchFramework))
    return problem, where, tensors


def problem_for(op: str, described: Mapping[str, tuple[tuple[int, ...], tuple[int, ...], str]], criteria: Criteria,
                compute_dtype: str | None, *, torch_layouts: bool, library: str = "") -> Problem:
    """The Problem a call makes of tensors of these layouts (``described``: id -> (dims, strides, dtype)), as
    farm.ops binds it; ``torch_layouts``: the tensors are torch's (a convolution with a channels-last input or
    filter gives a channels-last output, as torch's conv2d does; farm.ops' CPU engines write NCHW)."""
    spec: dict[str, Any] = {k: {"dims": d, "strides": s, "dtype": t} for k, (d, s, t) in described.items()}
    problem = Problem.create(op, spec, criteria=dict(criteria), compute_dtype=compute_dtype, library=library)
    if op == "conv_fprop" and torch_layouts and (_channels_last(*described["X"][:2]) or
                                                 _channels_last(*described["W"][:2])):
        # a channels-last input (or filter) gives a channels-last output, as torch's conv2d does (and the engines
        # are tuned for: an NCHW output from NHWC inputs is another, slower problem)
        dims = problem.tensor("Y").dims
        spec["Y"] = {"dims": dims, "strides": nhwc_strides(dims), "dtype": described["X"][2]}
        problem = Problem.create(op, spec, criteria=dict(criteria), compute_dtype=compute_dtype, library=library)
    return problem


def _where(p: Placement) -> str:
    if p.kind == "cpu":
        return "a torch CPU tensor" if p.back is not None else "a numpy array"
    return f"{p.framework.name} on {p.kind}:{p.index}"


def nhwc_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = dims
    return (c * h * w, 1, w * c, c)


def _channels_last(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Stored NHWC (and not also plain NCHW, as a 1x1 image or one channel is)."""
    return len(dims) == 4 and tuple(strides) == nhwc_strides(tuple(dims)) and \
        tuple(strides) != contiguous_strides(tuple(dims))


def pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    try:
        h, w = value
        return int(h), int(w)
    except (TypeError, ValueError):
        raise InputError("expected an int or a pair of ints", field=name, value=value) from None


def conv_criteria(stride: Any, padding: Any, dilation: Any, groups: int) -> Criteria:
    sh, sw = pair(stride, "stride")
    ph, pw = pair(padding, "padding")
    dh, dw = pair(dilation, "dilation")
    return (("dilation_h", dh), ("dilation_w", dw), ("groups", int(groups)), ("pad_h", ph), ("pad_w", pw),
            ("stride_h", sh), ("stride_w", sw))


def _no_criteria() -> Criteria:
    return ()


_UNSET = object()
_MAX_WEIGHTS = 4096


class OpCalls:
    """The op entry points over one binder, with their cache of bound calls."""

    def __init__(self, binder: Binder) -> None:
        self.binder = binder
        # one dictionary per entry point's flat keys (no op name in them), and one for the general path
        self._matmul: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], Any]] = {}
        self._conv: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], Any]] = {}
        self._sdpa: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], Any]] = {}
        self._norm: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], Any]] = {}
        self.bindings: dict[tuple[Any, ...], Binding] = {}
        # torch calls by the id of their weight (matmul's B, conv2d's W: the tensor a model passes again and again):
        # a guard of the layouts of its last call, that call, and its other arguments; one C call instead of a key
        # read field by field (farm.dispatch.guards). The guards are made once per key.
        Seen = tuple[Callable[..., bool], Callable[[Mapping[str, Any]], Any], Any]
        self._mm_weights: dict[int, Seen] = {}
        self._conv_weights: dict[int, Seen] = {}
        self._guards: dict[tuple[Any, ...], Callable[..., bool] | None] = {}

    def clear(self) -> None:
        """Forget every bound call (settings changed: the choices may be different now)."""
        for d in (self._matmul, self._conv, self._sdpa, self._norm, self.bindings, self._mm_weights,
                  self._conv_weights, self._guards):
            d.clear()

    def _remember(self, weights: dict[int, Any], weight: Any, key: tuple[Any, ...], tensors: tuple[Any, ...],
                  call: Callable[[Mapping[str, Any]], Any], settings: Any = None) -> None:
        """Torch tensors bound by ``key``: their next call with this weight (and these ``settings``) tries a guard
        of the tensors' layouts before the key."""
        guard = self._guards.get(key, _UNSET)
        if guard is _UNSET:
            guard = self._guards[key] = layout_check(*tensors)
        if guard is not None:
            if len(weights) >= _MAX_WEIGHTS:  # weights made anew every call (views): start over
                weights.clear()
            weights[id(weight)] = (guard, call, settings)

    # -- binding ------------------------------------------------------------------------------
    def bind(self, op: str, tensors: Mapping[str, Any], criteria: Criteria, compute_dtype: str | None) -> Binding:
        """The binding of a call of these tensors (made once per problem and placement, and kept)."""
        problem, where, tensors = problem_of(op, tensors, criteria, compute_dtype)
        key = ("problem", problem.key, where.kind, where.index, where.back is not None)
        found = self.bindings.get(key)
        if found is not None:
            return found
        bound, graph, capturing = self.binder(problem, where)
        out_id = problem.output_ids[0]
        desc = problem.tensor(out_id)
        like = next(iter(tensors.values()))

        def binding(b: Bound, graph_binding: Binding | None = None) -> Binding:
            return Binding(b, out_id, desc.dims, desc.dtype, desc.strides, where.framework, where.back,
                           where.framework.allocator(like, desc.dims, desc.dtype, desc.strides),
                           graph=graph_binding, capturing=capturing if graph_binding is not None else None)

        made = binding(bound, binding(graph) if graph is not None else None)
        self.bindings[key] = made
        return made

    def _miss(self, cache: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], Any]], key: tuple[Any, ...] | None,
              op: str, tensors: Mapping[str, Any], criteria: Callable[[], Criteria], compute_dtype: str | None) -> Any:
        return self._bound(cache, key, op, tensors, criteria, compute_dtype)(tensors)

    def _bound(self, cache: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], Any]], key: tuple[Any, ...] | None,
               op: str, tensors: Mapping[str, Any], criteria: Callable[[], Criteria],
               compute_dtype: str | None) -> Callable[[Mapping[str, Any]], Any]:
        """A new layout's bound call, kept under ``key``."""
        call = self.bind(op, tensors, criteria(), compute_dtype).call
        if key is not None:
            cache[key] = call
        return call

    def _general(self, op: str, tensors: Mapping[str, Any], params: Any, criteria: Callable[[], Criteria],
                 compute_dtype: str | None, out: Any) -> Any:
        """Any call: ``out=`` given, a bias, mixed or simulated tensors, unhashable arguments (``params``: the
        op's own arguments, as given). Its key costs more to make than the flat ones."""
        try:
            key = ("general", op, params, compute_dtype, *[_any_layout(t) for t in tensors.values()])
            binding = self.bindings.get(key)
        except TypeError:  # unhashable arguments (lists): bound by their problem
            key, binding = None, None
        if binding is None:
            binding = self.bind(op, tensors, criteria(), compute_dtype)
            if key is not None:
                self.bindings[key] = binding
        if out is None:
            return binding.call(tensors)
        return binding.into(tensors, out)

    # -- the ops --------------------------------------------------------------------------------
    def matmul(self, a: Any, b: Any, bias: Any = None, *, out: Any = None, compute_dtype: str | None = None) -> Any:
        """``a @ b (+ bias)``; batched when ``a`` has more than two dims. ``compute_dtype="tf32"`` allows TF32."""
        if bias is None and out is None:
            if type(a) is _NDARRAY:  # numpy: its key is a few attribute reads
                try:
                    key = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, compute_dtype)
                    hit = self._matmul.get(key)
                except (AttributeError, TypeError):  # b is not an array: the general path (and its clear error)
                    return self._general("matmul", {"A": a, "B": b}, (), _no_criteria, compute_dtype, None)
                if hit is None:
                    hit = self._bound(self._matmul, key, "matmul", {"A": a, "B": b}, _no_criteria, compute_dtype)
                return hit({"A": a, "B": b})
            seen = self._mm_weights.get(id(b)) if compute_dtype is None else None
            if seen is not None:
                try:
                    holds = seen[0](a, b)
                except TypeError:  # another kind of object than the guard's
                    holds = False
                if holds:
                    return seen[1]({"A": a, "B": b})
            try:  # torch tensors: the device index (-1 on the CPU), not a device object made every call
                key = (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(),
                       compute_dtype)
                hit = self._matmul.get(key)
            except (AttributeError, TypeError):  # anything else: the general path (and its clear error)
                return self._general("matmul", {"A": a, "B": b}, (), _no_criteria, compute_dtype, None)
            if hit is None:
                hit = self._bound(self._matmul, key, "matmul", {"A": a, "B": b}, _no_criteria, compute_dtype)
            if compute_dtype is None and type(b).__module__.startswith("torch"):
                self._remember(self._mm_weights, b, key, (a, b), hit)
            return hit({"A": a, "B": b})
        tensors = {"A": a, "B": b} if bias is None else {"A": a, "B": b, "bias": bias}
        return self._general("matmul", tensors, (), _no_criteria, compute_dtype, out)

    def sdpa(self, q: Any, k: Any, v: Any, mask: Any = None, *, causal: bool = False, out: Any = None) -> Any:
        """softmax(q k^T / sqrt(d) + mask) v on [batch, heads, seq, dim] tensors (grouped-query when k/v have
        fewer heads). ``mask`` (torch's ``attn_mask``): 4-D, broadcasting to [batch, heads, queries, keys],
        boolean (True attends) or added to the scores; a query row it masks whole gives 0, as torch's does."""
        if mask is not None:
            return self._masked_sdpa(q, k, v, mask, causal, out)
        tensors = {"Q": q, "K": k, "V": v}
        if out is None:
            try:
                if type(q) is _NDARRAY:
                    key = (q.shape, q.strides, q.dtype, k.shape, k.strides, k.dtype, v.shape, v.strides, v.dtype,
                           causal)
                else:
                    key = (q.shape, q.stride(), q.dtype, q.get_device(), k.shape, k.stride(), k.dtype, v.shape,
                           v.stride(), v.dtype, causal)
                hit = self._sdpa.get(key)
            except (AttributeError, TypeError):
                key, hit = None, None
            if hit is not None:
                return hit(tensors)
            if key is not None:
                return self._miss(self._sdpa, key, "sdpa_fwd", tensors, functools.partial(_causal, causal), None)
        return self._general("sdpa_fwd", tensors, causal, functools.partial(_causal, causal), None, out)

    def _masked_sdpa(self, q: Any, k: Any, v: Any, mask: Any, causal: bool, out: Any) -> Any:
        if causal:
            raise InputError("a mask and causal=True together (torch refuses them too): put the causal part in "
                             "the mask", field="causal", value=causal)
        return self._by_layouts(self._sdpa, "mask", "sdpa_fwd", {"Q": q, "K": k, "V": v, "mask": unexpanded(mask)},
                                functools.partial(_causal, False), "mask", out)

    def conv2d(self, x: Any, w: Any, *, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
               dilation: int | tuple[int, int] = 1, groups: int = 1, out: Any = None) -> Any:
        """2-D convolution, NCHW input, KCRS filter (no bias); a channels-last input gives a channels-last
        output, as torch's conv2d does."""
        if out is None:
            seen = self._conv_weights.get(id(w))
            if seen is not None and seen[2] == (stride, padding, dilation, groups):
                try:
                    holds = seen[0](x, w)
                except TypeError:
                    holds = False
                if holds:
                    return seen[1]({"X": x, "W": w})
        tensors = {"X": x, "W": w}
        criteria = functools.partial(conv_criteria, stride, padding, dilation, groups)
        if out is None:
            try:
                if type(x) is _NDARRAY:
                    key = (x.shape, x.strides, x.dtype, w.shape, w.strides, w.dtype, stride, padding, dilation,
                           groups)
                    torch_tensors = False
                else:
                    key = (x.shape, x.stride(), x.dtype, x.get_device(), w.shape, w.stride(), w.dtype, stride,
                           padding, dilation, groups)
                    torch_tensors = type(w).__module__.startswith("torch")
                hit = self._conv.get(key)  # lists for stride or padding: unhashable, the general path
            except (AttributeError, TypeError):
                key, hit = None, None
            if key is not None:
                if hit is None:
                    hit = self._bound(self._conv, key, "conv_fprop", tensors, criteria, None)
                if torch_tensors:
                    self._remember(self._conv_weights, w, key, (x, w), hit, (stride, padding, dilation, groups))
                return hit(tensors)
        return self._general("conv_fprop", tensors, (stride, padding, dilation, groups), criteria, None, out)

    def layernorm(self, x: Any, scale: Any, bias: Any, *, out: Any = None) -> Any:
        """Layer normalization over the last dim (eps 1e-5): ``(x - mean) / sqrt(var + eps) * scale + bias``."""
        return self._norm_call("layernorm", {"X": x, "scale": scale, "bias": bias}, out)

    def rmsnorm(self, x: Any, scale: Any, *, out: Any = None) -> Any:
        """RMS normalization over the last dim (eps 1e-5): ``x / sqrt(mean(x^2) + eps) * scale``."""
        return self._norm_call("rmsnorm", {"X": x, "scale": scale}, out)

    def _norm_call(self, op: str, tensors: dict[str, Any], out: Any) -> Any:
        return self._by_layouts(self._norm, op, op, tensors, _no_criteria, (), out)

    def _by_layouts(self, cache: dict[tuple[Any, ...], Callable[[Mapping[str, Any]], Any]], head: str, op: str,
                    tensors: dict[str, Any], criteria: Callable[[], Criteria], params: Any, out: Any) -> Any:
        """A call whose flat key is ``head`` and its tensors' layouts (the general path for ``out=`` and for
        what has no layout)."""
        if out is None:
            try:
                key: tuple[Any, ...] | None = (head, *[_layout(t) for t in tensors.values()])
                hit = cache.get(key)  # type: ignore[arg-type]
            except (AttributeError, TypeError):
                key, hit = None, None
            if hit is not None:
                return hit(tensors)
            if key is not None:
                return self._miss(cache, key, op, tensors, criteria, None)
        return self._general(op, tensors, params, criteria, None, out)

    # -- bound callables for hot loops ---------------------------------------------------------
    def bind_matmul(self, a: Any, b: Any, bias: Any = None, *, compute_dtype: str | None = None,
                    check: bool = True) -> Callable[..., Any]:
        """A callable for repeated calls of this one layout: ``mm(a, b)`` (``mm(a, b, bias)`` when bound with a
        bias) runs the bound plan with no lookup. ``check``: each call compares the shapes with the bound ones
        (a plan compiled for one shape must not see another); False skips that too."""
        names = ("A", "B") if bias is None else ("A", "B", "bias")
        given = (a, b) if bias is None else (a, b, bias)
        return self._bound_callable("matmul", names, given, (), compute_dtype, check)

    def bind_conv2d(self, x: Any, w: Any, *, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                    dilation: int | tuple[int, int] = 1, groups: int = 1, check: bool = True) -> Callable[..., Any]:
        """``conv(x, w)`` for repeated calls of this layout and these settings (see bind_matmul)."""
        return self._bound_callable("conv_fprop", ("X", "W"), (x, w), conv_criteria(stride, padding, dilation, groups),
                                    None, check)

    def bind_sdpa(self, q: Any, k: Any, v: Any, mask: Any = None, *, causal: bool = False,
                  check: bool = True) -> Callable[..., Any]:
        """``attn(q, k, v)`` (``attn(q, k, v, mask)`` when bound with a mask) for repeated calls of this layout
        (see bind_matmul)."""
        if mask is None:
            return self._bound_callable("sdpa_fwd", ("Q", "K", "V"), (q, k, v), _causal(causal), None, check)
        if causal:
            raise InputError("a mask and causal=True together (torch refuses them too)", field="causal", value=causal)
        return self._bound_callable("sdpa_fwd", ("Q", "K", "V", "mask"), (q, k, v, unexpanded(mask)), _causal(False),
                                    None, check)

    def _bound_callable(self, op: str, names: tuple[str, ...], given: tuple[Any, ...], criteria: Criteria,
                        compute_dtype: str | None, check: bool) -> Callable[..., Any]:
        return bound_callable(op, names, given, self.bind(op, dict(zip(names, given)), criteria, compute_dtype).call,
                              check)


def bound_callable(op: str, names: tuple[str, ...], given: tuple[Any, ...], call: Callable[[Mapping[str, Any]], Any],
                   check: bool) -> Callable[..., Any]:
    """``call`` taking the tensors as arguments (named ``names``, laid out as ``given``); ``check``: each call's
    layouts are compared with the bound ones."""
    shapes = tuple(t.shape for t in given)
    guard = layout_check(*given) if check and _all_torch(given) else None  # shapes, strides, dtypes at once
    if len(names) == 2:
        n0, n1 = names
        s0, s1 = shapes

        if guard is not None:
            def guarded2(x: Any, y: Any) -> Any:
                if not guard(x, y) and not _same_layouts((x, y), given):  # the guard's no: checked field by field
                    _wrong_layout(op, names, given, (x, y))
                return call({n0: x, n1: y})

            return guarded2
        if check:
            def bound2(x: Any, y: Any) -> Any:
                if x.shape != s0 or y.shape != s1:
                    _wrong_layout(op, names, given, (x, y))
                return call({n0: x, n1: y})

            return bound2
        return lambda x, y: call({n0: x, n1: y})

    if len(names) == 3 and not check:
        m0, m1, m2 = names
        return lambda x, y, z: call({m0: x, m1: y, m2: z})
    if len(names) == 3 and guard is not None:
        m0, m1, m2 = names

        def guarded3(x: Any, y: Any, z: Any) -> Any:
            if not guard(x, y, z) and not _same_layouts((x, y, z), given):
                _wrong_layout(op, names, given, (x, y, z))
            return call({m0: x, m1: y, m2: z})

        return guarded3

    def bound(*args: Any) -> Any:
        if len(args) != len(names):
            raise InputError(f"expected {len(names)} tensors ({', '.join(names)})", field=op, value=len(args))
        if check and (not guard(*args) and not _same_layouts(args, given) if guard is not None
                      else tuple(t.shape for t in args) != shapes):
            _wrong_layout(op, names, given, args)
        return call(dict(zip(names, args)))

    return bound



def _same_layouts(args: tuple[Any, ...], bound: tuple[Any, ...]) -> bool:
    """Shapes, strides, dtypes and devices equal, read field by field (what a guard says no to on aliased
    tensors, a @ a, though the layouts are the bound ones)."""
    return all(x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype and x.device == y.device
               for x, y in zip(args, bound))


def _all_torch(tensors: tuple[Any, ...]) -> bool:
    return all(type(t).__module__.startswith("torch") for t in tensors)


def _wrong_layout(op: str, names: tuple[str, ...], bound: tuple[Any, ...], args: tuple[Any, ...]) -> None:
    def desc(t: Any) -> str:
        stride = t.stride() if callable(getattr(t, "stride", None)) else getattr(t, "strides", "")
        return f"{list(t.shape)} strides {tuple(stride)} {getattr(t, 'dtype', '')}"

    got = ", ".join(f"{n}{desc(t)}" for n, t in zip(names, args))
    want = ", ".join(f"{n}{desc(t)}" for n, t in zip(names, bound))
    raise InputError(f"this bound {op} was made for {want}; bind another one for other layouts", field=op, value=got)


def unexpanded(mask: Any) -> Any:
    """An attention mask with its broadcast dims (stride 0: ``expand``ed) of size 1: the same mask, in the layout
    the farm's problem describes (a stride-0 dim of a tensor's own is no layout a kernel is tuned for)."""
    strides = mask.strides if type(mask) is _NDARRAY else mask.stride() if callable(getattr(mask, "stride", None)) \
        else None
    if strides is None or 0 not in strides:
        return mask
    dims = tuple(1 if s == 0 else d for d, s in zip(mask.shape, strides))
    if type(mask) is _NDARRAY:
        return np.lib.stride_tricks.as_strided(mask, shape=dims, strides=strides)
    return mask.as_strided(dims, tuple(strides))


def _causal(causal: bool) -> Criteria:
    return (("causal", int(bool(causal))),)


def _layout(t: Any) -> tuple[Any, ...]:
    """What a bound call depends on, read as cheaply as the tensor library allows."""
    if type(t) is _NDARRAY:
        return t.shape, t.strides, t.dtype
    return t.shape, t.stride(), t.dtype, t.get_device()  # a torch tensor; anything else raises AttributeError


def _any_layout(t: Any) -> tuple[Any, ...]:
    """The layout of any tensor a call may get (the general path's key), or a clear error."""
    if isinstance(t, _NDARRAY):
        return type(t), t.shape, t.strides, t.dtype
    if isinstance(t, SimTensor):
        return SimTensor, t.shape, t.dtype
    try:
        return type(t), t.shape, t.stride(), t.dtype, t.device  # a torch tensor
    except (AttributeError, TypeError):
        raise InputError("expected a numpy array or a torch tensor", field="tensor", value=type(t).__name__) from None


def entry_point(problem: Problem) -> tuple[str, tuple[str, ...], dict[str, Any]] | None:
    """How production calls ``problem`` through an ``OpCalls``: (entry point, the tensors it takes in order,
    its keyword arguments); None for ops farm.ops has no entry point for (conv_dgrad, a 3-D convolution...).
    Whether the call gives this very problem (its output layout) is for the binder to see."""
    from farm.model.dtypes import default_compute_dtype

    c = problem.criteria_dict
    if problem.op == "matmul":
        ids = ("A", "B", "bias") if problem.has_tensor("bias") else ("A", "B")
        default = default_compute_dtype(problem.tensor("A").dtype)
        return "matmul", ids, ({} if problem.compute_dtype == default else {"compute_dtype": problem.compute_dtype})
    if problem.op == "conv_fprop" and len(problem.tensor("X").dims) == 4:
        return "conv2d", ("X", "W"), {"stride": (c["stride_h"], c["stride_w"]), "padding": (c["pad_h"], c["pad_w"]),
                                      "dilation": (c["dilation_h"], c["dilation_w"]), "groups": c["groups"]}
    if problem.op == "sdpa_fwd":
        if problem.has_tensor("mask"):
            return "sdpa", ("Q", "K", "V", "mask"), {}
        return "sdpa", ("Q", "K", "V"), {"causal": bool(c.get("causal", 0))}
    if problem.op == "layernorm":
        return "layernorm", ("X", "scale", "bias"), {}
    if problem.op == "rmsnorm":
        return "rmsnorm", ("X", "scale"), {}
    return None
