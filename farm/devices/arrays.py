"""Array backends: how a device's tensors are made and read back.

The tuner builds input tensors for a problem (random, never zeros), output
tensors (poisoned, so an unwritten element shows), and reads results back as
numpy for numerical checks. CPU devices use numpy (NumpyArrays); GPU devices
use torch (TorchArrays).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from farm.errors import InputError
from farm.model.problem import Problem, TensorDesc

NUMPY_DTYPES: dict[str, Any] = {
    "fp64": np.float64,
    "fp32": np.float32,
    "fp16": np.float16,
    "int32": np.int32,
    "int8": np.int8,
    "bool": np.bool_,
}


@runtime_checkable
class ArrayBackend(Protocol):
    name: str

    def from_numpy(self, data: np.ndarray, desc: TensorDesc) -> Any:
        """A device tensor with ``desc``'s dims, strides and dtype holding ``data``."""

    def empty(self, desc: TensorDesc) -> Any:
        """An uninitialised device tensor laid out as ``desc``."""

    def fill(self, tensor: Any, value: float) -> None:
        """Set every element (used to poison outputs)."""

    def to_numpy(self, tensor: Any) -> np.ndarray:
        """A host copy, as float64 for floating types."""


class NumpyArrays:
    name = "numpy"

    def empty(self, desc: TensorDesc) -> np.ndarray:
        try:
            dtype = np.dtype(NUMPY_DTYPES[desc.dtype])
        except KeyError:
            raise InputError("numpy has no such dtype (bf16 needs a GPU device)", field=f"tensors.{desc.id}.dtype", value=desc.dtype) from None
        base = np.empty(desc.storage_elements, dtype=dtype)
        return np.lib.stride_tricks.as_strided(
            base, shape=desc.dims, strides=tuple(s * dtype.itemsize for s in desc.strides), writeable=True
        )

    def from_numpy(self, data: np.ndarray, desc: TensorDesc) -> np.ndarray:
        out = self.empty(desc)
        out[...] = data
        return out

    def fill(self, tensor: np.ndarray, value: float) -> None:
        tensor[...] = value

    def to_numpy(self, tensor: Any) -> np.ndarray:
        arr = np.asarray(tensor)
        return arr.astype(np.float64) if arr.dtype.kind == "f" else arr.copy()


def input_data(problem: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float64 host data for every input of ``problem`` (never zeros).

    Values are standard normal, except where an op needs otherwise
    (positive variances for batch normalization, an attention mask: ``attention_mask``).
    """
    rng = np.random.default_rng(seed)
    data: dict[str, np.ndarray] = {}
    for tid in problem.input_ids:
        desc = problem.tensor(tid)
        if tid == "mask" and problem.op.startswith("sdpa"):
            values = attention_mask(desc.dims, desc.dtype)
        elif problem.op == "batchnorm_inference" and tid == "var":
            values = rng.uniform(0.5, 1.5, size=desc.dims)
        elif desc.dtype in ("int8", "int32"):
            values = rng.integers(-8, 8, size=desc.dims).astype(np.float64)
        else:
            values = rng.standard_normal(size=desc.dims)
        data[tid] = values
    return data


def attention_mask(dims: tuple[int, ...], dtype: str) -> np.ndarray:
    """A decode step's padding mask over a static KV cache: the last quarter of the keys not attended (False, or
    -inf added to a float mask), the first key always attended, so no row is wholly masked."""
    keys = dims[-1]
    attend = np.ones(dims, dtype=bool)
    attend[..., max(1, keys - keys // 4):] = False
    if dtype == "bool":
        return attend
    return np.where(attend, 0.0, -np.inf)


def make_tensors(problem: Problem, backend: ArrayBackend, seed: int = 0, *, poison: float = float("nan")) -> dict[str, Any]:
    """Device tensors for ``problem``: random inputs and poisoned outputs (drawn on the device where the backend
    can: ``make``; a decode step's weights are gigabytes, seconds to draw on the host)."""
    make = getattr(backend, "make", None)
    if make is not None:
        return make(problem, seed, poison=poison)
    tensors: dict[str, Any] = {}
    for tid, values in input_data(problem, seed).items():
        tensors[tid] = backend.from_numpy(values, problem.tensor(tid))
    for tid in problem.output_ids:
        out = backend.empty(problem.tensor(tid))
        backend.fill(out, poison)
        tensors[tid] = out
    return tensors


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| (inf when out has NaN or inf)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return float("inf")
    denom = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(out - ref))
    return num / denom if denom > 0 else num


def host_inputs(tensors: Mapping[str, Any], problem: Problem, backend: ArrayBackend) -> dict[str, np.ndarray]:
    return {tid: backend.to_numpy(tensors[tid]) for tid in problem.input_ids}


TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                "int32": "int32", "int8": "int8", "bool": "bool"}


class TorchArrays:
    """torch tensors on a GPU (CUDA or ROCm builds of torch both call it "cuda")."""

    name = "torch"

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self._torch: Any = None

    @property
    def torch(self) -> Any:
        if self._torch is None:
            try:
                import torch
            except ImportError:
                from farm.devices.runtimes.base import RuntimeUnavailable

                raise RuntimeUnavailable("GPU tensors need torch: pip install 'tunefarm[torch]'") from None
            self._torch = torch
        return self._torch

    def _dtype(self, desc: TensorDesc) -> Any:
        return getattr(self.torch, TORCH_DTYPES[desc.dtype])

    def empty(self, desc: TensorDesc) -> Any:
        return self.torch.empty_strided(desc.dims, desc.strides, dtype=self._dtype(desc), device=f"cuda:{self.index}")

    def from_numpy(self, data: np.ndarray, desc: TensorDesc) -> Any:
        out = self.empty(desc)
        out.copy_(self.torch.from_numpy(np.ascontiguousarray(data)).to(out.dtype))
        return out

    def fill(self, tensor: Any, value: float) -> None:
        tensor.fill_(value)

    def make(self, problem: Problem, seed: int = 0, *, poison: float = float("nan")) -> dict[str, Any]:
        """Random inputs drawn on the device (as ``input_data`` draws them on the host: standard normal, small
        integers, positive variances) and poisoned outputs: a problem with gigabytes of inputs costs
        milliseconds here, where drawing float64 numbers on the host and copying them took seconds a task."""
        torch = self.torch
        gen = torch.Generator(device=f"cuda:{self.index}")
        gen.manual_seed(int(seed))
        tensors: dict[str, Any] = {}
        for tid in problem.input_ids:
            desc = problem.tensor(tid)
            out = self.empty(desc)
            kw = {"generator": gen, "device": out.device}
            if tid == "mask" and problem.op.startswith("sdpa"):
                values = torch.from_numpy(attention_mask(desc.dims, desc.dtype)).to(out.device)
            elif problem.op == "batchnorm_inference" and tid == "var":
                values = torch.rand(desc.dims, dtype=torch.float32, **kw) + 0.5
            elif desc.dtype in ("int8", "int32"):
                values = torch.randint(-8, 8, desc.dims, dtype=torch.int32, **kw)
            else:
                values = torch.randn(desc.dims, dtype=torch.float32, **kw)
            out.copy_(values)
            tensors[tid] = out
        for tid in problem.output_ids:
            out = self.empty(problem.tensor(tid))
            out.fill_(poison)
            tensors[tid] = out
        return tensors

    def to_numpy(self, tensor: Any) -> np.ndarray:
        t = tensor.detach()
        if t.is_floating_point():
            t = t.to(self.torch.float64)
        return t.cpu().numpy()

    def clone(self, tensor: Any) -> Any:
        """A copy in other memory with the same strides (``Tensor.clone`` makes a padded layout dense)."""
        t = tensor.detach()
        out = self.torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(t)
        return out

    def relative_error(self, out: Any, ref: Any) -> float:
        """||out - ref|| / ||ref|| computed on the device (inf for NaN/inf); no copy to the host."""
        torch = self.torch
        o, r = out.detach().float(), ref.detach().float()
        if not bool(torch.isfinite(o).all()):
            return float("inf")
        denom = float(torch.linalg.vector_norm(r))
        num = float(torch.linalg.vector_norm(o - r))
        return num / denom if denom > 0 else num
