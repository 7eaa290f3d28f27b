"""How each tensor library's tensors are described and allocated: numpy (the CPU), torch (GPUs), simulated.

The per-call path (farm.dispatch.calls) asks a framework only when it binds a new layout; a bound call
keeps the allocator it made then.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from farm.devices.arrays import NUMPY_DTYPES, TORCH_DTYPES
from farm.devices.sim import SimTensor
from farm.errors import InputError
from farm.model.dtypes import canonical_dtype
from farm.model.problem import contiguous_strides


class Framework(Protocol):
    """How one tensor library describes and allocates tensors."""

    name: str

    def describe(self, t: Any) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        """(dims, strides in elements, canonical dtype)."""

    def empty(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Any:
        """A new tensor of this layout where ``like`` is."""

    def allocator(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Callable[[], Any]:
        """``empty`` of this layout with every argument bound now: what a call without ``out=`` runs.
        It keeps none of ``like`` but its device (a cache must not hold a caller's tensor alive)."""


class NumpyFramework:
    name = "numpy"

    def describe(self, t: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        item = t.dtype.itemsize
        if any(s % item or s < 0 for s in t.strides):
            raise InputError("strides must be non-negative multiples of the element size; pass np.ascontiguousarray(x)",
                             field="strides", value=t.strides)
        return t.shape, tuple(s // item for s in t.strides), canonical_dtype(t.dtype.name)

    def empty(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> np.ndarray:
        return np.empty(dims, dtype=NUMPY_DTYPES[dtype])  # numpy problems keep contiguous outputs

    def allocator(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Callable[[], Any]:
        return functools.partial(np.empty, dims, dtype=NUMPY_DTYPES[dtype])


class TorchFramework:
    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def _dtype(self, name: str) -> Any:
        return getattr(self.torch, TORCH_DTYPES[name])

    def describe(self, t: Any) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        return tuple(t.shape), tuple(t.stride()), canonical_dtype(str(t.dtype))

    def empty(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Any:
        return self.allocator(like, dims, dtype, strides)()

    def allocator(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Callable[[], Any]:
        if strides and tuple(strides) != contiguous_strides(dims):
            return functools.partial(self.torch.empty_strided, dims, strides, dtype=self._dtype(dtype), device=like.device)
        return functools.partial(self.torch.empty, dims, dtype=self._dtype(dtype), device=like.device)


class SimFramework:
    """Simulated devices' tensors (farm.devices.sim): a shape and a dtype, always contiguous."""

    name = "sim"

    def describe(self, t: SimTensor) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        return tuple(t.shape), contiguous_strides(tuple(t.shape)), t.dtype

    def empty(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> SimTensor:
        return SimTensor(tuple(dims), dtype)

    def allocator(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Callable[[], Any]:
        return functools.partial(SimTensor, tuple(dims), dtype)


NUMPY = NumpyFramework()
SIM = SimFramework()


@dataclass(frozen=True)
class Placement:
    """Where a call's tensors live: the runtime kind and device index that run it, the framework, and how
    results go back to the caller's type (None: as they are)."""

    kind: str
    index: int
    framework: Any
    back: Callable[[Any], Any] | None = None


def placement(t: Any) -> Placement:
    """The placement of a call whose first tensor is ``t``. CPU torch tensors run as numpy arrays (shared
    memory); GPU torch tensors on their device (ROCm builds of torch call it cuda too)."""
    if isinstance(t, np.ndarray):
        return Placement("cpu", 0, NUMPY)
    if isinstance(t, SimTensor):
        return Placement("sim", 0, SIM)
    torch = torch_if_tensor(t)
    if torch is None:
        raise InputError("expected a numpy array or a torch tensor", field="tensor", value=type(t).__name__)
    if t.device.type == "cpu":
        return Placement("cpu", 0, NUMPY, torch.from_numpy)
    kind = "hip" if getattr(torch.version, "hip", None) else "cuda"
    return Placement(kind, t.device.index or 0, torch_framework(torch))


@functools.lru_cache(maxsize=1)
def torch_framework(torch: Any) -> TorchFramework:
    return TorchFramework(torch)


def torch_if_tensor(t: Any) -> Any:
    """The torch module when ``t`` is a torch tensor (torch is imported only then), else None."""
    if not type(t).__module__.startswith("torch"):
        return None
    import torch

    return torch if isinstance(t, torch.Tensor) else None
