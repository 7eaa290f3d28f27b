"""The operation catalogue: op kinds, their tensors, criteria and output shapes.

Fine-grained op strings (``conv_fprop``, ``sdpa_fwd``, ``matmul``, ``rmsnorm``...)
belong to a core-op category. Categories carry the autotuning RFC's priority,
used to pick the core operation of a multi-op graph (the op an override entry
is keyed by): CONVOLUTION 70 > SDPA 60 > MATMUL 50 > BATCHNORM 40 > NORM 30 >
REDUCTION = RESAMPLE 20 > POINTWISE 10.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from farm.errors import InputError, UnknownNameError

Dims = tuple[int, ...]


class OpCategory(str, enum.Enum):
    CONVOLUTION = "convolution"
    SDPA = "sdpa"
    MATMUL = "matmul"
    BATCHNORM = "batchnorm"
    NORM = "norm"
    REDUCTION = "reduction"
    RESAMPLE = "resample"
    POINTWISE = "pointwise"

    @property
    def priority(self) -> int:
        return CATEGORY_PRIORITY[self]


CATEGORY_PRIORITY: dict[OpCategory, int] = {
    OpCategory.CONVOLUTION: 70,
    OpCategory.SDPA: 60,
    OpCategory.MATMUL: 50,
    OpCategory.BATCHNORM: 40,
    OpCategory.NORM: 30,
    OpCategory.REDUCTION: 20,
    OpCategory.RESAMPLE: 20,
    OpCategory.POINTWISE: 10,
}

# A norm's epsilon, integer-coded as criteria are: in units of 1e-12 (1e-5 is 10_000_000; BERT's 1e-12 is 1)
EPS_CRITERION = "eps_e12"
DEFAULT_EPS_E12 = 10_000_000


OFFSET_CRITERION = "scale_offset"  # rmsnorm's output is x / rms * (scale + scale_offset): Gemma's norms add 1


def norm_eps(criteria: Mapping[str, int]) -> float:
    """A norm problem's epsilon, from its criteria."""
    return criteria.get(EPS_CRITERION, DEFAULT_EPS_E12) * 1e-12


# infer(dims by tensor id, criteria) -> dims of each output the op can derive.
InferFn = Callable[[Mapping[str, Dims], Mapping[str, int]], dict[str, Dims]]


@dataclass(frozen=True)
class OpSpec:
    """What a problem of one op kind must contain."""

    name: str
    category: OpCategory
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    optional_inputs: tuple[str, ...] = ()
    criteria: Mapping[str, int] = field(default_factory=dict)  # name -> default
    # criteria added after problems of this op were keyed: in a problem's canonical form (its key) only where they
    # differ from their default, so every problem of an earlier file keeps its key
    late_criteria: tuple[str, ...] = ()
    infer: InferFn | None = None  # validates shapes and derives outputs
    given_outputs: tuple[str, ...] = ()  # outputs the shapes do not determine: the user gives them
    doc: str = ""

    @property
    def priority(self) -> int:
        return self.category.priority

    @property
    def tensor_ids(self) -> tuple[str, ...]:
        return self.inputs + self.optional_inputs + self.outputs


def _fail(message: str, tensor: str, value: object, what: str = "dims") -> InputError:
    return InputError(message, field=f"tensors.{tensor}.{what}", value=list(value) if isinstance(value, tuple) else value)


def _rank(dims: Mapping[str, Dims], tid: str, *ranks: int) -> Dims:
    d = dims[tid]
    if len(d) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise _fail(f"{tid} must have {want} dims", tid, d)
    return d


def _infer_matmul(dims: Mapping[str, Dims], criteria: Mapping[str, int]) -> dict[str, Dims]:
    a = _rank(dims, "A", 2, 3, 4)
    b = _rank(dims, "B", 2, 3, 4)
    if a[-1] != b[-2]:
        raise _fail(f"B's rows ({b[-2]}) must equal A's columns K={a[-1]}", "B", b)
    batch_a, batch_b = a[:-2], b[:-2]
    if batch_b and batch_a != batch_b:
        raise _fail(f"B's batch dims must be absent or equal A's {list(batch_a)}", "B", b)
    out = batch_a + (a[-2], b[-1])
    if "bias" in dims and dims["bias"] not in ((b[-1],), (1, b[-1])):
        raise _fail(f"bias must be [N] with N={b[-1]}", "bias", dims["bias"])
    return {"C": out}


def _conv_out(size: int, pad: int, kernel: int, stride: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _check_conv_criteria(c: Mapping[str, int]) -> None:
    for key in ("stride_h", "stride_w", "dilation_h", "dilation_w", "groups"):
        if c[key] < 1:
            raise InputError("must be >= 1", field=f"criteria.{key}", value=c[key])
    for key in ("pad_h", "pad_w"):
        if c[key] < 0:
            raise InputError("must be >= 0", field=f"criteria.{key}", value=c[key])


def _conv_geometry(x: Dims, w: Dims, c: Mapping[str, int], xid: str, wid: str) -> Dims:
    _check_conv_criteria(c)
    n, ch, h, wd = x
    k, cg, r, s = w
    g = c["groups"]
    if ch % g or k % g:
        raise InputError(f"groups={g} must divide channels C={ch} and K={k}", field="criteria.groups", value=g)
    if cg * g != ch:
        raise _fail(f"{wid} dim 1 must be C/groups = {ch // g}", wid, w)
    p = _conv_out(h, c["pad_h"], r, c["stride_h"], c["dilation_h"])
    q = _conv_out(wd, c["pad_w"], s, c["stride_w"], c["dilation_w"])
    if p < 1 or q < 1:
        raise _fail(f"filter {r}x{s} does not fit the padded input {h}x{wd}", wid, w)
    return (n, k, p, q)


def _infer_conv_fprop(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    x = _rank(dims, "X", 4)
    w = _rank(dims, "W", 4)
    return {"Y": _conv_geometry(x, w, c, "X", "W")}


def _conv_gradient(data: str, filt: str) -> InferFn:
    """Shape check of a conv gradient: dY must be what conv_fprop(data, filt) would produce."""

    def infer(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
        expect = _conv_geometry(_rank(dims, data, 4), _rank(dims, filt, 4), c, data, filt)
        dy = _rank(dims, "dY", 4)
        if dy != expect:
            raise _fail(f"dY must be {list(expect)} for this {data}, {filt} and criteria", "dY", dy)
        return {}

    return infer


def _sdpa_shapes(dims: Mapping[str, Dims]) -> tuple[Dims, Dims, Dims]:
    q = _rank(dims, "Q", 4)
    k = _rank(dims, "K", 4)
    v = _rank(dims, "V", 4)
    b, hq, _sq, d = q
    if k[0] != b or v[0] != b:
        raise _fail(f"batch must equal Q's ({b})", "K" if k[0] != b else "V", k if k[0] != b else v)
    if k[3] != d:
        raise _fail(f"head dim must equal Q's ({d})", "K", k)
    if v[1] != k[1] or v[2] != k[2]:
        raise _fail(f"V's heads and sequence must equal K's ({k[1]}, {k[2]})", "V", v)
    if k[1] < 1 or hq % k[1]:
        raise _fail(f"K's heads must divide Q's heads ({hq}) for grouped-query attention", "K", k)
    return q, k, v


def _infer_sdpa_fwd(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    if c["causal"] not in (0, 1):
        raise InputError("must be 0 or 1", field="criteria.causal", value=c["causal"])
    q, k, v = _sdpa_shapes(dims)
    if "mask" in dims:
        mask = _rank(dims, "mask", 4)
        want = (q[0], q[1], q[2], k[2])
        if any(m not in (1, w) for m, w in zip(mask, want)):
            raise _fail(f"must broadcast to [batch, heads, queries, keys] = {list(want)}", "mask", mask)
        if c["causal"]:
            raise InputError("a mask and causal=1 together (torch refuses them)", field="criteria.causal", value=1)
    return {"O": (q[0], q[1], q[2], v[3])}


def _infer_sdpa_bwd(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    out = _infer_sdpa_fwd(dims, c)
    for tid in ("O", "dO"):
        if tuple(dims[tid]) != out["O"]:
            raise _fail(f"{tid} must be {list(out['O'])}", tid, dims[tid])
    return {"dQ": dims["Q"], "dK": dims["K"], "dV": dims["V"]}


def _infer_norm(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    x = dims["X"]
    if len(x) < 2:
        raise _fail("X must have at least 2 dims (rows x normalized size)", "X", x)
    for tid in ("scale", "bias"):
        if tid in dims and dims[tid] != (x[-1],):
            raise _fail(f"{tid} must be [{x[-1]}] (the normalized size)", tid, dims[tid])
    return {"Y": x}


def _infer_batchnorm(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    x = _rank(dims, "X", 2, 3, 4, 5)
    for tid in ("scale", "bias", "mean", "var"):
        if dims[tid] != (x[1],):
            raise _fail(f"{tid} must be [{x[1]}] (the channel count)", tid, dims[tid])
    return {"Y": x}


def _per_channel(dims: Mapping[str, Dims], names: Sequence[str], channels: int, what: str) -> None:
    for tid in names:
        if tid in dims and dims[tid] not in ((channels,), (1, channels) + (1,) * (len(dims["X"]) - 2)):
            raise _fail(f"{tid} must be [{channels}] ({what})", tid, dims[tid])


def _infer_batchnorm_training(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    x = _rank(dims, "X", 2, 3, 4, 5)
    _per_channel(dims, ("scale", "bias"), x[1], "the channel count")
    return {"Y": x, "mean": (x[1],), "inv_variance": (x[1],)}


def _infer_batchnorm_backward(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    x = _rank(dims, "X", 2, 3, 4, 5)
    if dims["dY"] != x:
        raise _fail(f"dY must be {list(x)} (X's shape)", "dY", dims["dY"])
    _per_channel(dims, ("scale", "mean", "inv_variance"), x[1], "the channel count")
    return {"dX": x, "dscale": (x[1],), "dbias": (x[1],)}


def _infer_rmsnorm_backward(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    out = _infer_norm(dims, c)
    if dims["dY"] != dims["X"]:
        raise _fail(f"dY must be {list(dims['X'])} (X's shape)", "dY", dims["dY"])
    return {"dX": out["Y"], "dscale": (dims["X"][-1],)}


def _infer_pointwise(dims: Mapping[str, Dims], c: Mapping[str, int]) -> dict[str, Dims]:
    a = dims["A"]
    if c["mode"] not in (0, 1, 2, 3):
        raise InputError("must be 0 (add), 1 (mul), 2 (relu) or 3 (gelu)", field="criteria.mode", value=c["mode"])
    if c["mode"] in (0, 1) and "B" not in dims:
        raise InputError("add and mul need tensor B", field="tensors.B")
    if "B" in dims and dims["B"] != a:
        raise _fail(f"B must match A {list(a)}", "B", dims["B"])
    return {"C": a}


_CONV_CRITERIA = {
    "pad_h": 0, "pad_w": 0, "stride_h": 1, "stride_w": 1,
    "dilation_h": 1, "dilation_w": 1, "groups": 1,
}

OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("conv_fprop", OpCategory.CONVOLUTION, ("X", "W"), ("Y",), criteria=_CONV_CRITERIA,
               infer=_infer_conv_fprop, doc="2-D convolution forward, NCHW dims, KCRS filter"),
        OpSpec("conv_dgrad", OpCategory.CONVOLUTION, ("dY", "W"), ("dX",), criteria=_CONV_CRITERIA,
               infer=_conv_gradient("dX", "W"), given_outputs=("dX",), doc="gradient of conv_fprop w.r.t. its input"),
        OpSpec("conv_wgrad", OpCategory.CONVOLUTION, ("X", "dY"), ("dW",), criteria=_CONV_CRITERIA,
               infer=_conv_gradient("X", "dW"), given_outputs=("dW",), doc="gradient of conv_fprop w.r.t. its filter"),
        OpSpec("sdpa_fwd", OpCategory.SDPA, ("Q", "K", "V"), ("O",), optional_inputs=("mask",), criteria={"causal": 0},
               infer=_infer_sdpa_fwd, doc="softmax(Q K^T / sqrt(d) + mask) V, [batch, heads, seq, dim]; GQA allowed; "
                                          "mask: 4-D, broadcast to [batch, heads, queries, keys], bool (True "
                                          "attends) or added to the scores"),
        OpSpec("sdpa_bwd", OpCategory.SDPA, ("Q", "K", "V", "O", "dO"), ("dQ", "dK", "dV"),
               criteria={"causal": 0}, infer=_infer_sdpa_bwd, doc="backward of sdpa_fwd"),
        OpSpec("matmul", OpCategory.MATMUL, ("A", "B"), ("C",), optional_inputs=("bias",),
               infer=_infer_matmul, doc="C = A @ B (+ bias); batched when A has more than 2 dims"),
        OpSpec("batchnorm_inference", OpCategory.BATCHNORM, ("X", "scale", "bias", "mean", "var"), ("Y",),
               infer=_infer_batchnorm, doc="batch normalization with running statistics, channels in dim 1"),
        # ops the autotuning RFC lists for override files: read, written and matched by name; no engine here runs them
        OpSpec("batchnorm_training", OpCategory.BATCHNORM, ("X", "scale", "bias"), ("Y", "mean", "inv_variance"),
               infer=_infer_batchnorm_training, doc="batch normalization computing the batch's statistics (hipDNN's)"),
        OpSpec("batchnorm_backward", OpCategory.BATCHNORM, ("dY", "X", "scale", "mean", "inv_variance"),
               ("dX", "dscale", "dbias"), infer=_infer_batchnorm_backward, doc="backward of batchnorm_training"),
        OpSpec("rmsnorm_backward", OpCategory.NORM, ("dY", "X", "scale", "inv_rms"), ("dX", "dscale"),
               infer=_infer_rmsnorm_backward, doc="backward of rmsnorm (inv_rms: [rows])"),
        OpSpec("layernorm", OpCategory.NORM, ("X", "scale", "bias"), ("Y",), infer=_infer_norm,
               criteria={EPS_CRITERION: DEFAULT_EPS_E12}, late_criteria=(EPS_CRITERION,),
               doc="layer normalization over the last dim; eps in units of 1e-12 (eps_e12, default 1e-5)"),
        OpSpec("rmsnorm", OpCategory.NORM, ("X", "scale"), ("Y",), infer=_infer_norm,
               criteria={EPS_CRITERION: DEFAULT_EPS_E12, OFFSET_CRITERION: 0},
               late_criteria=(EPS_CRITERION, OFFSET_CRITERION),
               doc="RMS normalization over the last dim, scaled by scale + scale_offset (Gemma's 1 + weight: 1); "
                   "eps in units of 1e-12 (eps_e12, default 1e-5)"),
        OpSpec("reduction", OpCategory.REDUCTION, ("X",), ("Y",), criteria={"mode": 0}, given_outputs=("Y",),
               doc="sum (mode 0) or max (mode 1) to the shape of Y"),
        OpSpec("resample", OpCategory.RESAMPLE, ("X",), ("Y",), criteria={"mode": 0}, given_outputs=("Y",),
               doc="nearest (mode 0) or bilinear (mode 1) resize to the shape of Y"),
        OpSpec("pointwise", OpCategory.POINTWISE, ("A",), ("C",), optional_inputs=("B",),
               criteria={"mode": 0}, infer=_infer_pointwise, doc="elementwise add (0), mul (1), relu (2), gelu (3)"),
    )
}


def op_spec(name: str) -> OpSpec:
    """The catalogue entry of op ``name``."""
    try:
        return OPS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(str(name), sorted(OPS), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownNameError(f"unknown op {name!r}; {hint}known ops: {', '.join(sorted(OPS))}") from None


def core_op(ops: Iterable[str]) -> str:
    """The op an override entry of a multi-op graph is keyed by: the highest priority, first on ties."""
    best: str | None = None
    for name in ops:
        if best is None or op_spec(name).priority > op_spec(best).priority:
            best = name
    if best is None:
        raise InputError("a graph needs at least one op", field="ops", value=[])
    return best


def infer_outputs(spec: OpSpec, dims: Mapping[str, Sequence[int]], criteria: Mapping[str, int]) -> dict[str, Dims]:
    """Output dims derivable from the inputs (validating their shapes)."""
    if spec.infer is None:
        return {}
    return spec.infer({k: tuple(v) for k, v in dims.items()}, criteria)
