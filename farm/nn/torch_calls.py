"""Which torch calls are operations the farm tunes, and the problem each one is.

A model's forward calls torch functions (``F.linear``, ``torch.matmul``, ``@``, ``torch.bmm``, ``torch.addmm``,
``F.conv2d``, ``F.scaled_dot_product_attention``, ``F.layer_norm``, ``F.rms_norm``; ``nn.Linear``,
``nn.Conv2d``, ``nn.LayerNorm``, ``nn.RMSNorm`` and transformers' ``Conv1D`` call them). ``read_call`` turns one
call into the farm's problem of it: the tensors the library kernel sees (``F.linear``'s weight as ``B = W.T``,
``[K, N]`` with strides ``(1, K)``; a 3-D input folded to ``[M, K]`` as torch folds it; an attention mask as
the optional ``mask`` tensor), its criteria and compute type, and the output in the layout torch's own call
gives it. A call the farm cannot run as written (dropout, a scale other than 1/sqrt(head dim), autocast, bf16 on a
CPU) is a ``Skipped`` with the reason; a norm's eps is its problem's ``eps_e12`` criterion. Only metadata is read:
tensors on the ``meta`` device describe the same problems.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from farm.dispatch.calls import conv_criteria, problem_for
from farm.errors import InputError
from farm.model.dtypes import canonical_dtype
from farm.model.op_catalog import EPS_CRITERION
from farm.model.problem import Problem, contiguous_strides

Layout = tuple[tuple[int, ...], tuple[int, ...], str]  # dims, strides (elements), canonical dtype
STRIDED_INPUT = ("a strided input (a transposed view): farm.apply routes a norm of a contiguous input only, so "
                 "this one is not tuned")


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
    except InputError as exc:  # a dtype the farm's problems do not take (int64, complex...): torch's own call
        return Skipped(kind, _undescribed(exc))
    if isinstance(got, str):
        return Skipped(kind, got)
    return _op_call(kind, got, args[0] if args else None)


def read_matmul(a: Any, b: Any, bias: Any = None) -> OpCall | Skipped:
    """The problem of ``a @ b (+ bias)`` as torch computes it (``a`` folded to 2-D where ``b`` is): what a free
    ``torch.addmm``, ``torch.matmul``, ``F.linear`` (with ``b = W.T``) or ``torch.bmm`` call is."""
    kind = "matmul" if bias is None else "addmm"
    try:
        got = _matmul(a, b)
        if not isinstance(got, str) and bias is not None:
            if bias.dim() != 1 or bias.shape[0] != b.shape[-1]:
                got = "a bias that is not one value a column"
            else:
                got[1]["bias"] = layout(bias)
    except InputError as exc:
        return Skipped(kind, _undescribed(exc))
    return _op_call(kind, got, a)


def _undescribed(exc: InputError) -> str:
    return f"a call the farm's problems do not describe ({exc}): torch's own call runs it"


def _op_call(kind: str, got: Any, first: Any) -> OpCall | Skipped:
    if isinstance(got, str):
        return Skipped(kind, got)
    op, described, criteria, compute = got
    if _autocast_on(first):
        return Skipped(kind, "autocast is on (the kernel runs in another dtype than the tensors'; farm.apply "
                             "routes calls outside autocast only)")
    where = getattr(getattr(first, "device", None), "type", "cpu")
    if where == "cpu" and any(d[2] == "bf16" for d in described.values()):
        return Skipped(kind, "bf16 on a CPU (the farm's CPU engines compute on numpy arrays, which have no bf16: "
                             "capture on the GPU, with --meta, or in float32)")
    library = "torch" if where == "cpu" else ""
    empty = next((tid for tid, d in described.items() if 0 in d[0]), None)
    if empty is not None:
        return Skipped(kind, f"an empty tensor ({empty} {list(described[empty][0])}: nothing to compute; torch's own "
                             "call returns it)")
    try:
        return OpCall(kind, problem_for(op, described, criteria, compute, torch_layouts=True, library=library))
    except InputError as exc:  # a layout the farm's problems do not take: torch's own call
        return Skipped(kind, _undescribed(exc))


def layout(t: Any) -> Layout:
    return tuple(t.shape), tuple(t.stride()), canonical_dtype(str(t.dtype))


def _gpu_semantics(t: Any) -> bool:
    """Tensors on a GPU (or ``meta``, which stands for one): TF32 applies to their fp32 products."""
    return getattr(getattr(t, "device", None), "type", "cpu") != "cpu"


def torch_output_layout(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None
                        ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and strides of what ``fn(*args, **kwargs)`` returns, computed on fake tensors (no memory, no
    kernel): the layout torch's own call gives, which a routed call must give too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch = torch_module()
    mode = FakeTensorMode()
    def faked(a: Any) -> Any:
        return mode.from_tensor(a) if isinstance(a, torch.Tensor) else a

    fake_args, fake_kwargs = [faked(a) for a in args], {k: faked(v) for k, v in (kwargs or {}).items()}
    with mode:
        out = fn(*fake_args, **fake_kwargs)
    return tuple(out.shape), tuple(out.stride())


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


def _conv1d(*_args: Any, **_kwargs: Any) -> str:
    return "a 1-D convolution (nn.Conv1d): the farm tunes 2-D ones"


def _multi_head_attention(*_args: Any, **_kwargs: Any) -> str:
    return ("nn.MultiheadAttention: its projections and attention run inside one torch call "
            "(F.multi_head_attention_forward), which the farm does not route")


def _string_padding(padding: str, kernel: tuple[int, ...], dilation: Any) -> Any:
    if padding == "valid":
        return 0
    d = (dilation, dilation) if isinstance(dilation, int) else tuple(dilation)
    total = [dd * (k - 1) for dd, k in zip(d, kernel)]
    if any(t % 2 for t in total):
        return "padding='same' with an even kernel (asymmetric padding)"
    return tuple(t // 2 for t in total)


def default_scale(scale: Any, head_dim: int) -> bool:
    """``scale`` is what torch uses when none is given (1/sqrt(head dim)): transformers passes it on every call."""
    return scale is None or isinstance(scale, (int, float)) and math.isclose(scale, 1.0 / math.sqrt(head_dim),
                                                                             rel_tol=1e-6)


def _sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: Any = None, enable_gqa: bool = False) -> Any:
    if dropout_p:
        return "dropout"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "tensors that are not [batch, heads, seq, dim]"
    if not default_scale(scale, q.shape[-1]):
        return "a scale other than 1/sqrt(head dim)"
    if k.shape[1] != q.shape[1] and not enable_gqa:
        return "fewer key heads than query heads without enable_gqa"
    described = {"Q": layout(q), "K": layout(k), "V": layout(v)}
    if attn_mask is not None:
        why = _mask_reason(attn_mask, q, k, is_causal)
        if why:
            return why
        described["mask"] = mask_layout(attn_mask)
    return "sdpa_fwd", described, (("causal", int(bool(is_causal))),), None


def mask_layout(mask: Any) -> Layout:
    """An attention mask's layout with its broadcast dims (stride 0: an expanded mask) of size 1: the same mask,
    which a routed call passes as ``mask.as_strided`` of these dims."""
    dims, strides, dtype = layout(mask)
    return tuple(1 if s == 0 else d for d, s in zip(dims, strides)), strides, dtype


def _mask_reason(mask: Any, q: Any, k: Any, is_causal: bool) -> str:
    """Why an attention mask is not one the farm's sdpa_fwd takes ('' when it is): 4-D, broadcasting to
    [batch, heads, queries, keys], boolean (True attends) or of the tensors' dtype (added to the scores)."""
    if is_causal:
        return "an attention mask with is_causal (torch refuses it)"
    if mask.dim() != 4:
        return "an attention mask that is not 4-D"
    want = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if any(m not in (1, w) for m, w in zip(mask.shape, want)):
        return "an attention mask that does not broadcast to [batch, heads, queries, keys]"
    if str(mask.dtype) not in ("torch.bool", str(q.dtype)):
        return f"an attention mask of {mask.dtype} (boolean or the tensors' dtype)"
    return ""


def _norm_shape(x: Any, normalized_shape: Any) -> str:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if shape != tuple(x.shape[-1:]):
        return "normalized over more than the last dim"
    return "" if x.is_contiguous() else STRIDED_INPUT


def _layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                cudnn_enable: bool = True) -> Any:
    why = _norm_shape(x, normalized_shape)
    if why:
        return why
    if weight is None or bias is None:
        return "no affine weight or bias"
    coded = eps_criterion(eps)
    if isinstance(coded, str):
        return coded
    return "layernorm", {"X": layout(x), "scale": layout(weight), "bias": layout(bias)}, coded, None


def _rms_norm(x: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:
    why = _norm_shape(x, normalized_shape)
    if why:
        return why
    if weight is None:
        return "no affine weight"
    if eps is None:
        return "eps unset (torch then uses the dtype's machine epsilon: give the model's eps)"
    coded = eps_criterion(eps)
    if isinstance(coded, str):
        return coded
    return "rmsnorm", {"X": layout(x), "scale": layout(weight)}, coded, None


def eps_criterion(eps: Any) -> tuple[tuple[str, int], ...] | str:
    """A norm's eps as its problem's criterion (an integer in units of 1e-12), or why it cannot be one."""
    try:
        e12 = round(float(eps) * 1e12)
    except (TypeError, ValueError):
        return f"eps {eps!r} is not a number"
    if e12 < 1 or not math.isclose(e12 * 1e-12, float(eps), rel_tol=1e-9):
        return f"eps {eps:g} is not a whole multiple of 1e-12 (the farm's norms take eps in those units)"
    return ((EPS_CRITERION, e12),)


@functools.lru_cache(maxsize=1)
def torch_module() -> Any:
    import torch

    return torch


def graph_capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (False where torch has no CUDA)."""
    torch = torch_module()
    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def capture_check() -> Callable[[], bool]:
    """:func:`graph_capturing` for a hot path: one C call a check (always False where torch has no CUDA)."""
    torch = torch_module()
    return torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else _never


def _never() -> bool:
    return False


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
        ("conv1d", _conv1d, (F.conv1d, torch.conv1d)),
        ("multi_head_attention", _multi_head_attention,
         (F.multi_head_attention_forward, getattr(torch, "_native_multi_head_attention", None))),
    ):
        for f in funcs:
            if f is not None:
                table[f] = (kind, read)
    return table
