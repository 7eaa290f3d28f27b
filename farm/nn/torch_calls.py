"""Which torch calls are operations the farm tunes, and the problem each one is.

A model's forward calls torch functions (``F.linear``, ``torch.matmul``, ``@``, ``torch.bmm``, ``torch.addmm``,
``F.conv2d``, ``F.scaled_dot_product_attention``, ``F.layer_norm``, ``F.rms_norm``; ``nn.Linear``,
``nn.Conv2d``, ``nn.LayerNorm`` and ``nn.RMSNorm`` call them). ``read_call`` turns one call into the farm's
problem of it: the tensors the library kernel sees (``F.linear``'s weight as ``B = W.T``, ``[K, N]`` with
strides ``(1, K)``; a 3-D input folded to ``[M, K]`` as torch folds it), its criteria and compute type. A call
the farm cannot run as written (an attention mask, a norm's eps other than the farm's 1e-5, autocast) is a
``Skipped`` with the reason. Only metadata is read: tensors on the ``meta`` device describe the same problems.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from farm.dispatch.calls import conv_criteria, problem_for
from farm.model.dtypes import canonical_dtype
from farm.model.problem import Problem, contiguous_strides

Layout = tuple[tuple[int, ...], tuple[int, ...], str]  # dims, strides (elements), canonical dtype
NORM_EPS = 1e-5  # the farm's layernorm and rmsnorm (farm/model/op_catalog.py)


@dataclass(frozen=True)
class OpCall:
    """One tunable call: the torch function's kind (``linear``, ``matmul``, ``bmm``, ``addmm``, ``conv2d``,
    ``sdpa``, ``layer_norm``, ``rms_norm``) and the farm problem it is."""

    kind: str
    problem: Problem


@dataclass(frozen=True)
class Skipped:
    """A call of a tunable operation the farm cannot run as written, and why."""

    kind: str
    reason: str


def read_call(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> OpCall | Skipped | None:
    """The problem of a torch function call, ``Skipped`` when the farm cannot run it as written, None when the
    function is no operation the farm tunes."""
    reader = tunable_functions().get(func)
    if reader is None:
        return None
    kind, read = reader
    try:
        got = read(*args, **kwargs)
    except TypeError:  # a call torch itself would refuse: not ours to judge
        return Skipped(kind, "arguments this reader does not know")
    if isinstance(got, str):
        return Skipped(kind, got)
    op, described, criteria, compute = got
    if _autocast_on(args[0] if args else None):
        return Skipped(kind, "autocast is on (the kernel runs in another dtype than the tensors'; farm.apply "
                             "routes calls outside autocast only)")
    return OpCall(kind, problem_for(op, described, criteria, compute, torch_layouts=_gpu_semantics(args[0])))


def layout(t: Any) -> Layout:
    return tuple(t.shape), tuple(t.stride()), canonical_dtype(str(t.dtype))


def _gpu_semantics(t: Any) -> bool:
    """Tensors on a GPU (or ``meta``, which stands for one) follow torch's layouts; CPU tensors run as numpy
    arrays in farm.ops (a channels-last convolution writes NCHW there)."""
    return getattr(getattr(t, "device", None), "type", "cpu") != "cpu"


def _autocast_on(t: Any) -> bool:
    torch = torch_module()
    device = getattr(getattr(t, "device", None), "type", "cpu")
    if device == "meta":
        device = "cuda"
    try:
        return bool(torch.is_autocast_enabled(device))
    except (TypeError, RuntimeError):
        return False


def _compute(dtype: str, t: Any) -> str | None:
    """TF32 for fp32 products where torch allows it on a GPU (it changes results: part of the problem)."""
    if dtype != "fp32" or not _gpu_semantics(t):
        return None
    torch = torch_module()
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else None


def _flat(t: Any) -> Layout:
    """``t`` folded to ``[prod(leading), last]`` as torch folds a linear's or matmul's input (a copy, when it
    is not contiguous, is contiguous)."""
    dims, strides, dtype = layout(t)
    if len(dims) == 2:
        return dims, strides, dtype
    rows = math.prod(dims[:-1])
    return (rows, dims[-1]), contiguous_strides((rows, dims[-1])), dtype


def _linear(x: Any, w: Any, bias: Any = None) -> Any:
    if x.dim() < 2 or w.dim() != 2:
        return "a 1-D input or weight (a matrix-vector product)"
    a = _flat(x)
    (n, k), (sn, sk), dt = layout(w)
    described = {"A": a, "B": ((k, n), (sk, sn), dt)}
    if bias is not None:
        if bias.dim() != 1:
            return "a bias that is not 1-D"
        described["bias"] = layout(bias)
    return "matmul", described, (), _compute(a[2], x)


def _matmul(a: Any, b: Any, *, out: Any = None) -> Any:
    if out is not None:
        return "out= given"
    if a.dim() < 2 or b.dim() < 2:
        return "a 1-D operand (a matrix-vector product)"
    if b.dim() == 2:
        la = _flat(a)
        return "matmul", {"A": la, "B": layout(b)}, (), _compute(la[2], a)
    if a.dim() != b.dim() or tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
        return "broadcast batch dims"
    la = layout(a)
    return "matmul", {"A": la, "B": layout(b)}, (), _compute(la[2], a)


def _bmm(a: Any, b: Any, *, out: Any = None) -> Any:
    return _matmul(a, b, out=out)


def _addmm(bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1, out: Any = None) -> Any:
    if out is not None or beta != 1 or alpha != 1:
        return "out=, beta or alpha given"
    if bias.dim() != 1 or a.dim() != 2 or b.dim() != 2:
        return "a bias that is not 1-D"
    la = layout(a)
    return "matmul", {"A": la, "B": layout(b), "bias": layout(bias)}, (), _compute(la[2], a)


def _conv2d(x: Any, w: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
            groups: int = 1) -> Any:
    if x.dim() != 4:
        return "an unbatched input (3-D)"
    if isinstance(padding, str):
        padding = _string_padding(padding, tuple(w.shape[2:]), dilation)
        if isinstance(padding, str):
            return padding
    # the bias is added after the convolution (the farm's conv_fprop has none): the convolution is the problem
    return "conv_fprop", {"X": layout(x), "W": layout(w)}, conv_criteria(stride, padding, dilation, groups), None


def _string_padding(padding: str, kernel: tuple[int, ...], dilation: Any) -> Any:
    if padding == "valid":
        return 0
    d = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    total = [dd * (k - 1) for dd, k in zip(d, kernel)]
    if any(t % 2 for t in total):
        return "padding='same' with an even kernel (asymmetric padding)"
    return tuple(t // 2 for t in total)


def _sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: Any = None, enable_gqa: bool = False) -> Any:
    if attn_mask is not None:
        return "an attention mask"
    if dropout_p:
        return "dropout"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "tensors that are not [batch, heads, seq, dim]"
    if scale is not None and not math.isclose(scale, 1.0 / math.sqrt(q.shape[-1]), rel_tol=1e-6):
        return "a scale other than 1/sqrt(head dim)"
    if k.shape[1] != q.shape[1] and not enable_gqa:
        return "fewer key heads than query heads without enable_gqa"
    return "sdpa_fwd", {"Q": layout(q), "K": layout(k), "V": layout(v)}, (("causal", int(bool(is_causal))),), None


def _norm_shape(x: Any, normalized_shape: Any) -> str:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return "" if shape == tuple(x.shape[-1:]) else "normalized over more than the last dim"


def _layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                cudnn_enable: bool = True) -> Any:
    why = _norm_shape(x, normalized_shape)
    if why:
        return why
    if weight is None or bias is None:
        return "no affine weight or bias"
    if not math.isclose(eps, NORM_EPS, rel_tol=1e-9):
        return f"eps {eps:g} (the farm's layernorm uses {NORM_EPS:g})"
    return "layernorm", {"X": layout(x), "scale": layout(weight), "bias": layout(bias)}, (), None


def _rms_norm(x: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:
    why = _norm_shape(x, normalized_shape)
    if why:
        return why
    if weight is None:
        return "no affine weight"
    if eps is None:
        return f"eps unset (torch then uses the dtype's machine epsilon; the farm's rmsnorm uses {NORM_EPS:g})"
    if not math.isclose(eps, NORM_EPS, rel_tol=1e-9):
        return f"eps {eps:g} (the farm's rmsnorm uses {NORM_EPS:g})"
    return "rmsnorm", {"X": layout(x), "scale": layout(weight)}, (), None


@functools.lru_cache(maxsize=1)
def torch_module() -> Any:
    import torch

    return torch


@functools.lru_cache(maxsize=1)
def tunable_functions() -> dict[Any, tuple[str, Callable[..., Any]]]:
    """Each torch function a model calls for a tunable operation (every spelling of it), and its reader."""
    torch = torch_module()
    F = torch.nn.functional
    table: dict[Any, tuple[str, Callable[..., Any]]] = {}
    for kind, read, funcs in (
        ("linear", _linear, (F.linear,)),
        ("matmul", _matmul, (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm)),
        ("bmm", _bmm, (torch.bmm, torch.Tensor.bmm)),
        ("addmm", _addmm, (torch.addmm, torch.Tensor.addmm)),
        ("conv2d", _conv2d, (F.conv2d, torch.conv2d)),
        ("sdpa", _sdpa, (F.scaled_dot_product_attention,)),
        ("layer_norm", _layer_norm, (F.layer_norm, torch.layer_norm)),
        ("rms_norm", _rms_norm, (getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None))),
    ):
        for f in funcs:
            if f is not None:
                table[f] = (kind, read)
    return table
