"""What every CPU engine shares: applicability rules, plans, workspace views, BLAS threads."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Mapping

import numpy as np

from farm.plugin import Device, Knob, KnobValue, Problem, Support

NUMPY = {"fp64": np.float64, "fp32": np.float32, "fp16": np.float16}
HOST_VENDORS = frozenset({"cpu"})


class CpuEngine:
    """Base class: subclasses set name, ops, knobs and implement ``build``."""

    name: str = ""
    ops: frozenset[str] = frozenset()
    knobs: tuple[Knob, ...] = ()
    supports_exhaustive = False
    priority = 100
    storage_dtypes: frozenset[str] = frozenset({"fp64", "fp32", "fp16"})

    def applicable(self, problem: Problem, device: Device) -> Support:
        if device.vendor not in HOST_VENDORS:
            return Support.no(f"runs on the host CPU, not on a {device.vendor} device")
        for t in problem.tensors:
            if t.dtype not in self.storage_dtypes and not (t.id == "mask" and t.dtype == "bool"):
                return Support.no(f"tensor {t.id} is {t.dtype}; supports {', '.join(sorted(self.storage_dtypes))}")
        if problem.compute_dtype not in ("fp32", "fp64"):
            return Support.no(f"computes in fp32 or fp64, not {problem.compute_dtype}")
        return self.supports(problem)

    def supports(self, problem: Problem) -> Support:
        """Op-specific rules; the default accepts everything."""
        return Support.yes()

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        return 0

    def compile(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> "FunctionPlan":
        return self.build(problem, dict(knobs), device)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> "FunctionPlan":
        raise NotImplementedError  # pragma: no cover - every engine overrides it

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


@dataclass
class FunctionPlan:
    """A plan that calls ``fn(tensors, workspace)``, inside ``context`` (e.g. a BLAS thread limit).

    ``produce(inputs)``, given only for a plan with no context and no workspace, returns the
    library's own output (replay without ``out=`` calls it: the numpy call itself).
    """

    fn: Callable[[Mapping[str, Any], Any], None]
    workspace_size: int = 0
    context: Callable[[], ContextManager[Any]] | None = None
    produce: Callable[[Mapping[str, Any]], Any] | None = None

    def __post_init__(self) -> None:
        if self.produce is None or self.context is not None or self.workspace_size:
            self.produce = None  # type: ignore[assignment]
            del self.produce  # no attribute: callers look it up with getattr

    def run(self, tensors: Mapping[str, Any], workspace: Any, stream: Any) -> None:
        if self.context is None:
            self.fn(tensors, workspace)
        else:
            with self.context():
                self.fn(tensors, workspace)


def compute_dtype(problem: Problem) -> Any:
    return np.float64 if problem.compute_dtype == "fp64" else np.float32


def workspace_view(workspace: Any, shape: tuple[int, ...], dtype: Any, offset: int = 0) -> np.ndarray:
    """An array of ``shape`` carved out of the byte workspace at ``offset`` bytes."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    if workspace is None or workspace.nbytes < offset + n:
        have = 0 if workspace is None else workspace.nbytes
        raise MemoryError(f"workspace of {have} B too small: need {offset + n} B")
    return workspace[offset:offset + n].view(dt).reshape(shape)


def nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # threadpoolctl is a dependency; keep engines usable without it
        return None
    return ThreadpoolController().select(user_api="blas")


def blas_threads(threads: int) -> Callable[[], ContextManager[Any]] | None:
    """A context factory limiting BLAS to ``threads``, or None for 0 (the threads in force: production's).

    The default plan runs as production calls numpy, with no context at all; a thread-count
    variant pays for its limit on every call, as it would in production.
    """
    if threads <= 0:
        return None
    controller = _blas_controller()
    if controller is None or not controller.lib_controllers:
        return None
    return functools.partial(controller.limit, limits=threads)


THREADS_KNOB = Knob.int("threads", 0, min=0, max=256, doc="BLAS threads (0 = library default)")


def chunks(total: int, size: int) -> Iterator[tuple[int, int]]:
    size = total if size <= 0 else size
    for start in range(0, total, size):
        yield start, min(total, start + size)
