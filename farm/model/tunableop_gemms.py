"""PyTorch TunableOp's GEMM signatures as farm problems, and its untuned-GEMM file as a workload.

TunableOp names a GEMM by BLAS's column-major view of a row-major ``C = A @ B`` (``C^T = B^T A^T``):

    GemmTunableOp_BFloat16_TN,tn_4096_1_4096_ld_4096_4096_4096
    GemmAndBiasTunableOp_Half_TN,tn_11008_16_4096_ld_4096_4096_11008
    GemmStridedBatchedTunableOp_float_NN,nn_64_128_32_B_16_ld_64_32_64

(``m`` is our N, ``n`` our M, ``k`` our K; the first operand is our B). ``PYTORCH_TUNABLEOP_RECORD_UNTUNED=1``
makes PyTorch write each GEMM it met untuned to ``tunableop_untuned<device>.csv``, one ``op,params`` line each
(a third field, the BLAS signature, where it writes one): ``farm tune`` reads that file as a workload. Batch
strides are not in the signature: a strided-batched GEMM is read as densely batched.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

from farm.errors import InputError

TYPE_NAMES = {"fp32": "float", "fp64": "double", "fp16": "Half", "bf16": "BFloat16"}
_FROM_TYPE = {v: k for k, v in TYPE_NAMES.items()}
GEMM_OP = re.compile(r"(Gemm|GemmAndBias|GemmStridedBatched)TunableOp_(float|double|Half|BFloat16)"
                     r"(?:_(float|double|Half|BFloat16))?_([NT])([NT])")
GEMM_PARAMS = re.compile(r"([nt])([nt])_(\d+)_(\d+)_(\d+)(?:_B_(\d+))?(?:_ld_(\d+)_(\d+)_(\d+))?")

Spec = dict[str, dict[str, Any]]  # tensor id -> {dims, strides, dtype}


def gemm_tensors(op_name: str, params: str) -> tuple[str, Spec] | None:
    """(dtype, the farm matmul's tensors A, B, C and, for GemmAndBias, bias) of one TunableOp GEMM signature;
    None for any other op (ScaledGemm, a wildcard ``*`` of dynamic shapes) or a signature that does not parse."""
    op = GEMM_OP.fullmatch(op_name.strip())
    p = GEMM_PARAMS.fullmatch(params.strip())
    if op is None or p is None or (p.group(1).upper(), p.group(2).upper()) != op.group(4, 5):
        return None
    kind, dtype = op.group(1), _FROM_TYPE[op.group(2)]
    if op.group(3) is not None and _FROM_TYPE[op.group(3)] != dtype:
        return None  # an output of another type: not a farm matmul
    batched = kind == "GemmStridedBatched"
    if batched != (p.group(6) is not None):
        return None
    ta, tb = p.group(1), p.group(2)
    m, n, k = (int(x) for x in p.group(3, 4, 5))
    lda, ldb, ldc = (int(x) for x in p.group(7, 8, 9)) if p.group(7) else \
        (m if ta == "n" else k, k if tb == "n" else n, m)
    # column-major C^T (m x n) = B^T A^T: M = n, N = m, K = k; the first operand is B
    a_dims, a_strides = (n, k), ((ldb, 1) if tb == "n" else (1, ldb))
    b_dims, b_strides = (k, m), ((lda, 1) if ta == "n" else (1, lda))
    c_dims, c_strides = (n, m), (ldc, 1)
    if batched:
        count = int(p.group(6))

        def dense(dims: tuple[int, int], strides: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
            span = max(dims[0] * strides[0], dims[1] * strides[1])
            return (count, *dims), (span, *strides)

        (a_dims, a_strides), (b_dims, b_strides), (c_dims, c_strides) = (
            dense(a_dims, a_strides), dense(b_dims, b_strides), dense(c_dims, c_strides))
    spec: Spec = {"A": {"dims": list(a_dims), "strides": list(a_strides), "dtype": dtype},
                  "B": {"dims": list(b_dims), "strides": list(b_strides), "dtype": dtype},
                  "C": {"dims": list(c_dims), "strides": list(c_strides), "dtype": dtype}}
    if kind == "GemmAndBias":
        spec["bias"] = {"dims": [m], "strides": [1], "dtype": dtype}
    return dtype, spec


def is_untuned_file(text: str) -> bool:
    """A TunableOp untuned (or results) CSV rather than YAML: its first line names a TunableOp op or a validator."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first.startswith("Validator,") or bool(re.match(r"\w+TunableOp_\w+,", first))


def untuned_workload(text: str, *, source: str) -> dict[str, Any]:
    """The workload mapping of a TunableOp untuned-GEMM file: one problem per distinct GEMM line (validator lines
    and lines of ops the farm does not run are left out; a file with no GEMM it can read is an error)."""
    problems: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    others: list[str] = []
    for lineno, row in enumerate(csv.reader(io.StringIO(text.lstrip("\ufeff"))), start=1):
        if not row or not row[0].strip() or row[0].startswith("Validator"):
            continue
        if len(row) < 2:
            raise InputError("expected 'op,params' (a TunableOp untuned line)", source=f"{source}:{lineno}",
                             value=",".join(row))
        key = (row[0].strip(), row[1].strip())
        if key in seen:
            continue
        seen.add(key)
        got = gemm_tensors(*key)
        if got is None:
            others.append(f"{source}:{lineno} {key[0]}")
            continue
        _, spec = got
        name = f"{key[0].split('TunableOp')[0].lower()}-{key[1].split('_ld_')[0]}"
        problems.append({"name": f"{name}-{len(problems)}" if any(p["name"] == name for p in problems) else name,
                         "op": "matmul", "tensors": spec})
    if not problems:
        raise InputError("no GEMM line the farm runs (GemmTunableOp, GemmAndBiasTunableOp, "
                         "GemmStridedBatchedTunableOp)" + (f"; left out: {', '.join(others[:3])}" if others else ""),
                         source=source)
    description = f"the GEMMs of PyTorch TunableOp's untuned file {source}"
    if others:
        description += f" ({len(others)} line(s) of other ops left out, e.g. {others[0]})"
    return {"name": "tunableop-untuned", "description": description, "problems": problems}
