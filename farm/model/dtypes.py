"""Data type names: one canonical short name per type, with the usual aliases."""

from __future__ import annotations

from farm.errors import InputError

# canonical name -> bytes per element
STORAGE_DTYPES: dict[str, int] = {
    "fp64": 8,
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "int32": 4,
    "int8": 1,
    "bool": 1,  # attention masks (True attends)
}
# tf32 is a way of computing fp32 products, never a storage type.
COMPUTE_DTYPES: frozenset[str] = frozenset({"fp64", "fp32", "tf32", "fp16", "bf16", "int32"})
FLOAT_DTYPES: frozenset[str] = frozenset({"fp64", "fp32", "fp16", "bf16"})

_ALIASES = {
    "float64": "fp64", "double": "fp64", "f64": "fp64",
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bfloat16": "bf16",
    "tensorfloat32": "tf32",
    "i32": "int32", "i8": "int8",
    "boolean": "bool",
}

# Relative-norm tolerance ||out - ref|| / ||ref|| per compute dtype (see METHOD.md's ranges).
RELATIVE_TOLERANCE: dict[str, float] = {
    "fp64": 1e-10,
    "fp32": 1e-4,
    "tf32": 2e-3,
    "fp16": 1e-2,
    "bf16": 3e-2,
    "int32": 0.0,
}


def canonical_dtype(name: object, *, field: str = "dtype", compute: bool = False) -> str:
    """Canonical short name of a dtype, or an InputError naming the field."""
    if type(name) is str and name in (COMPUTE_DTYPES if compute else STORAGE_DTYPES):
        return name  # already canonical (every problem read back from a file)
    if not isinstance(name, str):
        raise InputError("expected a dtype name such as fp32, fp16, bf16", field=field, value=name)
    key = name.strip().lower().replace("_", "").replace("torch.", "")
    key = _ALIASES.get(key, key)
    allowed = COMPUTE_DTYPES if compute else STORAGE_DTYPES.keys()
    if key not in allowed:
        raise InputError(
            f"unknown {'compute ' if compute else ''}dtype; expected one of {', '.join(sorted(allowed))}",
            field=field,
            value=name,
        )
    return key


def itemsize(dtype: str) -> int:
    return STORAGE_DTYPES[dtype]


def default_compute_dtype(storage: str) -> str:
    """The accumulation type a library would pick for inputs of ``storage`` type."""
    return {"fp64": "fp64", "int8": "int32", "int32": "int32"}.get(storage, "fp32")
