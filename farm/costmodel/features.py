"""What a cost model sees of one candidate: its problem's, its own and its device's features.

A feature row is a flat mapping of names to numbers or strings. Problem and device features are made once
per problem; each candidate adds its engine and knobs. :class:`FeatureSchema` fixes the columns and the
categories a model was trained with, and turns rows into the matrix the booster reads (a category or a knob
the model never saw becomes a missing value, which the trees route like any other missing value).

``FEATURE_VERSION`` changes whenever a feature's meaning does; a model trained on another version is refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from farm.errors import InputError
from farm.model.knobs import KnobSettings
from farm.model.problem import Problem

FEATURE_VERSION = 2
MAX_TENSORS = 4  # per problem: the op's tensors in the catalogue's order (inputs, optional inputs, outputs)
ALIGNMENTS = (128, 64, 16, 8)

Row = dict[str, Any]

# every column this code makes: fixed names, and families (a knob's, a criterion's, a library's, a tensor's)
FIXED = frozenset({"op", "op_category", "dtype", "compute_dtype", "log2_flops", "log2_bytes", "intensity", "tensors",
                   "gemm_batch", "gemm_m", "gemm_n", "gemm_k", "gemm_m_align", "gemm_n_align", "gemm_k_align",
                   "gemm_mn_over_k", "vendor", "arch", "compute_units", "memory_gib", "l2_mib", "clock_mhz",
                   "warp_size", "engine", "knobs"})
FAMILIES = re.compile(r"^(knob_.+|crit_.+|lib_.+|t[0-9]_(rank|layout|align|dtype))$")


def unknown_columns(names: Iterable[str]) -> list[str]:
    """Columns this code does not make: a model reading them was trained by other feature code."""
    return [n for n in names if n not in FIXED and not FAMILIES.match(n)]


def alignment(n: int) -> int:
    """The largest of 128, 64, 16, 8 dividing ``n``; 1 when none does (a vectorised load's width, in elements)."""
    return next((a for a in ALIGNMENTS if n % a == 0), 1)


def _gemm_shape(p: Problem) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of the GEMM the op is, or lowers to (implicit GEMM for convolutions); None otherwise."""
    try:
        if p.op == "matmul":
            a, b = p.tensor("A").dims, p.tensor("B").dims
            batch = math.prod(a[:-2]) if len(a) > 2 else 1
            return batch, a[-2], b[-1], a[-1]
        if p.op.startswith("conv_"):
            x, w = p.tensor("X" if p.op != "conv_dgrad" else "dX").dims, p.tensor("W" if p.op != "conv_wgrad" else "dW").dims
            y = p.tensor("Y" if p.op == "conv_fprop" else "dY").dims
            n, c, k = x[0], x[1], w[0]
            window = math.prod(w[2:])
            out = math.prod(y[2:])
            groups = p.criteria_dict.get("groups", 1) or 1
            if p.op == "conv_fprop":
                return groups, n * out, k // groups, c // groups * window
            if p.op == "conv_dgrad":
                return groups, n * math.prod(x[2:]), c // groups, k // groups * window
            return groups, k // groups, c // groups * window, n * out
    except (KeyError, IndexError, ValueError):
        return None
    return None


def _layout(dims: Sequence[int], strides: Sequence[int]) -> int:
    """0 packed row-major; 1 the last dim is not unit-stride (a transposed operand); 2 channels-last
    (a 4-D or 5-D tensor whose dim 1 is unit-stride); 3 another layout."""
    if not dims:
        return 0
    packed = all(strides[i] == math.prod(dims[i + 1:]) for i in range(len(dims)) if dims[i] > 1)
    if packed:
        return 0
    if len(dims) in (4, 5) and strides[1] == 1:
        return 2
    if strides[-1] != 1:
        return 1
    return 3


def problem_features(p: Problem) -> Row:
    """The problem's own features: op and dtypes, size, GEMM shape (M, N, K; implicit GEMM for convolutions),
    alignment, layouts, criteria."""
    nbytes = float(sum(t.nbytes for t in p.tensors)) or 1.0
    flops = float(p.flops or 0.0)
    row: Row = {"op": p.op, "op_category": p.spec.category.value, "dtype": p.dtype, "compute_dtype": p.compute_dtype,
                "log2_flops": math.log2(flops) if flops > 0 else math.nan, "log2_bytes": math.log2(nbytes),
                "intensity": flops / nbytes if flops > 0 else math.nan, "tensors": len(p.tensors)}
    gemm = _gemm_shape(p)
    for name, value in zip(("gemm_batch", "gemm_m", "gemm_n", "gemm_k"), gemm or (None,) * 4):
        row[name] = float(value) if value is not None else math.nan
        if name != "gemm_batch":
            row[f"{name}_align"] = float(alignment(value)) if value is not None else math.nan
    if gemm is not None:
        _, m, n, k = gemm
        row["gemm_mn_over_k"] = (m * n) / max(k, 1)
    # each tensor's rank, layout, alignment and dtype; not its raw dims: a tree splitting on one model's exact
    # sizes learns that model, not shapes (held-out families were ranked worse with them)
    order = [t for t in p.spec.tensor_ids if p.has_tensor(t)]
    for i, tid in enumerate(order[:MAX_TENSORS]):
        t = p.tensor(tid)
        row[f"t{i}_rank"] = float(len(t.dims))
        row[f"t{i}_layout"] = float(_layout(t.dims, t.strides))
        row[f"t{i}_align"] = float(alignment(t.dims[-1])) if t.dims else math.nan
        row[f"t{i}_dtype"] = t.dtype
    for name, value in p.criteria:
        row[f"crit_{name}"] = float(value)
    return row


def device_features(props: Mapping[str, Any]) -> Row:
    """A device's properties (DeviceProperties.to_dict() or a results row's device_json), so one model can
    serve several signatures: vendor, arch, size, clock, and the libraries' major.minor versions."""
    row: Row = {"vendor": str(props.get("vendor", "")), "arch": str(props.get("arch", "")),
                "compute_units": float(props.get("compute_units") or 0),
                "memory_gib": round(float(props.get("total_memory") or 0) / 2**30),
                "l2_mib": round(float(props.get("l2_bytes") or 0) / 2**20, 1),
                "clock_mhz": float(props.get("clock_mhz") or 0), "warp_size": float(props.get("warp_size") or 0)}
    libs = props.get("libraries") or {}
    for name, version in (libs.items() if isinstance(libs, Mapping) else libs):
        row[f"lib_{name}"] = ".".join(str(version).split(".")[:2])
    return row


def candidate_features(engine_name: str, knobs: KnobSettings) -> Row:
    """The candidate: its engine and its knobs (a knob left at its default is missing)."""
    row: Row = {"engine": engine_name, "knobs": float(len(knobs))}
    for name, value in knobs:
        row[f"knob_{name}"] = value if isinstance(value, str) else float(value)
    return row


def candidate_rows(problem: Row, device: Row, candidates: Iterable[tuple[str, KnobSettings]]) -> list[Row]:
    """One row per candidate of one problem on one device."""
    base = {**problem, **device}
    return [{**base, **candidate_features(engine, knobs)} for engine, knobs in candidates]


@dataclass(frozen=True)
class FeatureSchema:
    """The columns a model reads, in order: each numeric, or categorical with the categories it was trained on."""

    version: int
    numeric: tuple[str, ...]
    categorical: tuple[tuple[str, tuple[str, ...]], ...]

    @staticmethod
    def infer(rows: Sequence[Mapping[str, Any]]) -> "FeatureSchema":
        """The schema of training rows: a column is categorical when any row holds a string in it."""
        kinds: dict[str, set[str]] = {}
        for row in rows:
            for name, value in row.items():
                kind = kinds.setdefault(name, set())
                if isinstance(value, str):
                    kind.add(value)
        numeric = tuple(sorted(n for n, cats in kinds.items() if not cats))
        categorical = tuple((n, tuple(sorted(cats))) for n, cats in sorted(kinds.items()) if cats)
        return FeatureSchema(FEATURE_VERSION, numeric, categorical)

    @property
    def names(self) -> tuple[str, ...]:
        return self.numeric + tuple(n for n, _ in self.categorical)

    @property
    def categorical_indices(self) -> list[int]:
        return list(range(len(self.numeric), len(self.names)))

    def matrix(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Rows as a float matrix: numbers as they are, categories as their index, anything unknown as NaN."""
        out = np.full((len(rows), len(self.names)), np.nan)
        codes = [{c: float(i) for i, c in enumerate(cats)} for _, cats in self.categorical]
        n_num = len(self.numeric)
        for r, row in enumerate(rows):
            for j, name in enumerate(self.numeric):
                v = row.get(name)
                if v is not None and not isinstance(v, str):
                    out[r, j] = v
            for j, (name, _) in enumerate(self.categorical):
                v = row.get(name)
                if v is not None:
                    out[r, n_num + j] = codes[j].get(str(v), np.nan)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "numeric": list(self.numeric),
                "categorical": [{"name": n, "categories": list(c)} for n, c in self.categorical]}

    @staticmethod
    def from_json(data: Any, source: str) -> "FeatureSchema":
        try:
            version = int(data["version"])
            numeric = tuple(str(n) for n in data["numeric"])
            categorical = tuple((str(c["name"]), tuple(str(x) for x in c["categories"])) for c in data["categorical"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"the feature schema is malformed ({type(exc).__name__}: {exc})", field="features",
                             source=source) from None
        if version != FEATURE_VERSION:
            raise InputError(f"the model's feature schema is version {version}; this tunefarm computes version "
                             f"{FEATURE_VERSION} (train the model again with this tunefarm)",
                             field="features.version", value=version, source=source)
        return FeatureSchema(version, numeric, categorical)
