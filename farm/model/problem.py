"""Problems: one operation to tune, its named tensors, criteria, and its key.

A problem's canonical form lists tensors sorted by id (order never matters),
every criterion of its op with defaults filled in, and the compute dtype. The
problem key is a hash of that canonical JSON, so equal problems share a key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from farm.errors import InputError
from farm.model import dtypes
from farm.model.op_catalog import OpSpec, infer_outputs, op_spec

CANONICAL_VERSION = 1
# Problem.library: "" is the framework-neutral call (numpy's on a CPU); "torch" a torch model's call on a CPU (its
# default: torch's own CPU kernel); "module" what a model's own module computes by hand (a hand-written RMSNorm: its
# default is that computation, farm.model.hand_norms)
LIBRARIES = ("", "torch", "module")
OPS_LIBRARIES = ("", "torch")  # the libraries of the problems farm.ops makes of a call's tensors (no "module")


def contiguous_strides(dims: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides, in elements."""
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(int(dims[i + 1]), 1)
    return tuple(strides)


INT64_MAX = (1 << 63) - 1
MAX_RANK = 16  # cuDNN and MIOpen stop at 8 dims; more is a hostile or broken input, not a tensor


def _int_list(value: Any, *, field_path: str, minimum: int) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise InputError("expected a non-empty list of integers", field=field_path, value=value)
    if len(value) > MAX_RANK:
        raise InputError(f"{len(value)} dims; a tensor has at most {MAX_RANK}", field=field_path, value=list(value))
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < minimum:
            kind = "positive integers" if minimum > 0 else "integers >= 0"
            raise InputError(f"expected a list of {kind}", field=field_path, value=list(value))
        if item > INT64_MAX:  # Parquet, FlatBuffers and every library take 64-bit sizes
            raise InputError(f"{item} does not fit in 64 bits", field=field_path, value=list(value))
        out.append(int(item))
    return tuple(out)


def _check_no_overlap(dims: tuple[int, ...], strides: tuple[int, ...], field_path: str) -> None:
    """Strides must not make two index tuples address the same element."""
    axes = sorted((s, d) for d, s in zip(dims, strides) if d > 1)
    extent = 1
    for stride, dim in axes:
        if stride < extent:
            raise InputError(
                "strides overlap: two indices would address the same element",
                field=field_path,
                value=list(strides),
            )
        extent = stride * dim


@dataclass(frozen=True)
class TensorDesc:
    """A named tensor: id, dims, strides (elements) and storage dtype."""

    id: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @staticmethod
    def create(id: str, dims: Sequence[int], strides: Sequence[int] | None = None, dtype: str = "fp32") -> "TensorDesc":
        """Validated descriptor; strides default to contiguous (row-major)."""
        if not isinstance(id, str) or not id:
            raise InputError("a tensor id must be a non-empty string", field="tensors", value=id)
        base = f"tensors.{id}"
        d = _int_list(dims, field_path=f"{base}.dims", minimum=1)
        if strides is None:
            s = contiguous_strides(d)
        else:
            s = _int_list(strides, field_path=f"{base}.strides", minimum=0)
            if len(s) != len(d):
                raise InputError(
                    f"strides need one entry per dim ({len(d)})", field=f"{base}.strides", value=list(s)
                )
            _check_no_overlap(d, s, f"{base}.strides")
        return TensorDesc(id, d, s, dtypes.canonical_dtype(dtype, field=f"{base}.dtype"))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def rows(self) -> tuple[int, int]:
        """(rows, width): the tensor as rows of its last dim (what a norm normalizes)."""
        width = self.dims[-1] if self.dims else 1
        return (self.numel // width if width else 0), width

    @property
    def storage_elements(self) -> int:
        """Elements the strided layout spans (at least numel)."""
        return 1 + sum((d - 1) * s for d, s in zip(self.dims, self.strides))

    @property
    def nbytes(self) -> int:
        return self.storage_elements * dtypes.itemsize(self.dtype)

    @property
    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.dims)

    def canonical(self) -> dict[str, Any]:
        return {"id": self.id, "dims": list(self.dims), "strides": list(self.strides), "dtype": self.dtype}


@dataclass(frozen=True)
class Problem:
    """One operation to tune. Build it with :meth:`create`, which validates and fills outputs."""

    op: str
    tensors: tuple[TensorDesc, ...]  # sorted by id
    criteria: tuple[tuple[str, int], ...]  # every criterion of the op, sorted by name
    compute_dtype: str
    key: str = field(init=False, compare=False)
    # the library whose call the problem stands for, where that decides its default ("torch": a torch model's call
    # on a CPU, whose default is torch's own kernel, not numpy's); not part of the key: the operation is the same
    library: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", _problem_key(self.canonical_json()))

    # -- construction -------------------------------------------------------------
    @staticmethod
    def create(
        op: str,
        tensors: Mapping[str, Any] | Iterable[TensorDesc],
        *,
        criteria: Mapping[str, int] | None = None,
        compute_dtype: str | None = None,
        dtype: str | None = None,
        library: str = "",
    ) -> "Problem":
        """Validate a problem and derive its output tensors.

        ``tensors`` maps tensor id to a TensorDesc or to ``{"dims": [...],
        "strides": [...], "dtype": ...}``; ``dtype`` is the default for tensors
        that name none.
        """
        if not isinstance(op, str):
            raise InputError("expected an op name", field="op", value=op)
        try:
            spec = op_spec(op)
        except LookupError as exc:
            raise InputError(str(exc), field="op", value=op) from None
        default_dtype = dtypes.canonical_dtype(dtype or "fp32", field="dtype")
        descs = _tensor_descs(tensors, default_dtype)
        crit = _criteria(spec, criteria or {})
        _check_tensor_ids(spec, descs)
        missing = [t for t in spec.given_outputs if t not in descs]
        if missing:
            raise InputError(f"{op} needs output tensor(s) {', '.join(missing)} to be given (the inputs do not determine them)",
                             field=f"tensors.{missing[0]}")
        derived = infer_outputs(spec, {t: d.dims for t, d in descs.items()}, crit)
        out_dtype = _output_dtype(spec, descs)
        for tid, dims in derived.items():
            given = descs.get(tid)
            if given is None:
                descs[tid] = TensorDesc.create(tid, dims, dtype=out_dtype)
            elif given.dims != dims:
                raise InputError(f"must be {list(dims)} for these inputs", field=f"tensors.{tid}.dims", value=list(given.dims))
        storage = descs[spec.inputs[0]].dtype
        cdt = dtypes.canonical_dtype(compute_dtype, field="compute_dtype", compute=True) if compute_dtype else dtypes.default_compute_dtype(storage)
        if cdt == "tf32" and storage != "fp32":
            raise InputError("tf32 compute needs fp32 tensors", field="compute_dtype", value=compute_dtype)
        if library not in LIBRARIES:
            raise InputError(f"expected one of {', '.join(repr(x) for x in LIBRARIES)}", field="library", value=library)
        return Problem(op, tuple(descs[k] for k in sorted(descs)), tuple(sorted(crit.items())), cdt, library=library)

    @staticmethod
    def from_canonical(data: Mapping[str, Any]) -> "Problem":
        """Inverse of :meth:`canonical` (validates again)."""
        try:
            tensors = {t["id"]: {"dims": t["dims"], "strides": t["strides"], "dtype": t["dtype"]} for t in data["tensors"]}
            return Problem.create(data["op"], tensors, criteria=data.get("criteria") or {},
                                  compute_dtype=data.get("compute_dtype"), library=data.get("library") or "")
        except (KeyError, TypeError) as exc:
            raise InputError(f"not a canonical problem: missing or malformed {exc}", field="problem") from None

    # -- views --------------------------------------------------------------------
    @property
    def spec(self) -> OpSpec:
        return op_spec(self.op)

    def tensor(self, tid: str) -> TensorDesc:
        for t in self.tensors:
            if t.id == tid:
                return t
        raise KeyError(f"problem {self.key} ({self.op}) has no tensor {tid!r}")

    def has_tensor(self, tid: str) -> bool:
        return any(t.id == tid for t in self.tensors)

    @property
    def input_ids(self) -> tuple[str, ...]:
        spec = self.spec
        return tuple(t for t in spec.inputs + spec.optional_inputs if self.has_tensor(t))

    @property
    def output_ids(self) -> tuple[str, ...]:
        return self.spec.outputs

    @property
    def criteria_dict(self) -> dict[str, int]:
        return dict(self.criteria)

    @property
    def dtype(self) -> str:
        """Storage dtype of the first input (what tables show)."""
        return self.tensor(self.spec.inputs[0]).dtype

    def canonical(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "version": CANONICAL_VERSION,
            "op": self.op,
            "tensors": [t.canonical() for t in self.tensors],
            # a criterion added later (a norm's eps) only where it is not its default: earlier keys stay
            "criteria": {k: v for k, v in self.criteria if k not in spec.late_criteria or v != spec.criteria[k]},
            "compute_dtype": self.compute_dtype,
        }

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    def stored_json(self) -> str:
        """The canonical JSON plus the problem's ``library`` where it has one: what a results row keeps, and
        ``from_canonical`` reads back (the key is the canonical form's alone)."""
        if not self.library:
            return self.canonical_json()
        return json.dumps({**self.canonical(), "library": self.library}, sort_keys=True, separators=(",", ":"))

    def label(self) -> str:
        """Short human description, e.g. ``matmul A[512,256] B[256,128] fp32``."""
        dims = " ".join(f"{t}[{','.join(map(str, self.tensor(t).dims))}]" for t in self.input_ids)
        crit = {k: v for k, v in self.criteria if v != self.spec.criteria.get(k)}
        extra = " " + ",".join(f"{k}={v}" for k, v in crit.items()) if crit else ""
        strided = "" if all(self.tensor(t).is_contiguous for t in self.input_ids) else " strided"
        return f"{self.op} {dims} {self.dtype}{strided}{extra}"

    @property
    def flops(self) -> float:
        """Floating-point operations of one execution (0 where not defined)."""
        return _flops(self)


def _problem_key(canonical_json: str) -> str:
    return hashlib.sha256(canonical_json.encode("utf-8")).hexdigest()[:16]


def _tensor_descs(tensors: Mapping[str, Any] | Iterable[TensorDesc], default_dtype: str) -> dict[str, TensorDesc]:
    out: dict[str, TensorDesc] = {}
    if type(tensors) is dict or isinstance(tensors, Mapping):  # the exact type first: ABC checks are slow
        items = list(tensors.items())
    else:
        items = [(t.id, t) for t in tensors]
    for tid, spec in items:
        if isinstance(spec, TensorDesc):
            desc = spec if spec.id == tid else TensorDesc.create(tid, spec.dims, spec.strides, spec.dtype)
        elif type(spec) is dict or isinstance(spec, Mapping):
            unknown = set(spec) - {"dims", "strides", "dtype"}
            if unknown:
                raise InputError("unknown field(s); a tensor has dims, strides, dtype",
                                 field=f"tensors.{tid}.{sorted(unknown)[0]}", value=spec[sorted(unknown)[0]])
            if "dims" not in spec:
                raise InputError("missing dims", field=f"tensors.{tid}.dims")
            desc = TensorDesc.create(str(tid), spec["dims"], spec.get("strides"), spec.get("dtype", default_dtype))
        elif isinstance(spec, (list, tuple)):
            desc = TensorDesc.create(str(tid), spec, None, default_dtype)
        else:
            raise InputError("expected {dims: [...], strides: [...], dtype: ...} or a dims list",
                             field=f"tensors.{tid}", value=spec)
        out[desc.id] = desc
    return out


def _criteria(spec: OpSpec, given: Mapping[str, int]) -> dict[str, int]:
    if type(given) is not dict and not isinstance(given, Mapping):
        raise InputError("expected a mapping of criterion name to integer", field="criteria", value=given)
    crit = dict(spec.criteria)
    for name, value in given.items():
        if name not in spec.criteria:
            known = ", ".join(sorted(spec.criteria)) or "none"
            raise InputError(f"unknown criterion for {spec.name} (known: {known})", field=f"criteria.{name}", value=value)
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int):
            raise InputError("criteria are integer-coded", field=f"criteria.{name}", value=value)
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise InputError("does not fit in 64 bits", field=f"criteria.{name}", value=value)
        crit[name] = int(value)
    return crit


def _check_tensor_ids(spec: OpSpec, descs: Mapping[str, TensorDesc]) -> None:
    allowed = set(spec.tensor_ids)
    for tid in descs:
        if tid not in allowed:
            raise InputError(f"{spec.name} has no tensor {tid!r} (tensors: {', '.join(spec.tensor_ids)})",
                             field=f"tensors.{tid}", value=tid)
    for tid in spec.inputs:
        if tid not in descs:
            raise InputError(f"{spec.name} needs tensor {tid}", field=f"tensors.{tid}")


def _output_dtype(spec: OpSpec, descs: Mapping[str, TensorDesc]) -> str:
    return descs[spec.inputs[0]].dtype


def _flops(p: Problem) -> float:
    d = {t.id: t.dims for t in p.tensors}
    if p.op == "matmul":
        a, c = d["A"], d["C"]
        batch = 1
        for x in c[:-2]:
            batch *= x
        return 2.0 * batch * c[-2] * c[-1] * a[-1]
    if p.op in ("conv_fprop", "conv_dgrad", "conv_wgrad"):
        y = d["Y"] if p.op == "conv_fprop" else d["dY"]
        w = d["W"] if "W" in d else d["dW"]
        n, k, pp, q = y
        return 2.0 * n * k * pp * q * w[1] * w[2] * w[3]
    if p.op in ("sdpa_fwd", "sdpa_bwd"):
        b, h, sq, dh = d["Q"]
        skv, dv = d["K"][2], d["V"][3]
        f = 2.0 * b * h * sq * skv * (dh + dv)
        if p.criteria_dict.get("causal"):
            f /= 2
        return f * (2.5 if p.op == "sdpa_bwd" else 1.0)
    return 0.0
