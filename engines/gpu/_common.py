"""What the GPU engines share: lazy torch, applicability, streams, dtypes.

The GPU engines use PyTorch (and Triton) tensors on the device's own stream,
so the farm's event timer sees exactly their work. PyTorch and Triton expose the
same Python API on ROCm (``cuda`` device strings, hipBLASLt where cuBLASLt is),
so the engines are written once for both vendors.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import Any, Callable, Iterator, Mapping

from farm.plugin import Device, Knob, KnobValue, Problem, Support, gil_heavy_section, itemsize

from .triton_pad import PadAB

log = logging.getLogger("farm.engines.gpu")

GPU_VENDORS = frozenset({"nvidia", "amd"})
TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8",
                "int32": "int32"}
# One Triton compile at a time in this process: the compiler holds the GIL and its in-process
# caches are not meant for concurrent writers.
TRITON_COMPILE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def torch_module() -> Any:
    import torch

    return torch


def torch_or_reason() -> tuple[Any, str]:
    try:
        return torch_module(), ""
    except ImportError:
        return None, "torch is not installed (pip install 'tunefarm[torch]')"


def torch_dtype(name: str) -> Any:
    return getattr(torch_module(), TORCH_DTYPES[name])


class GpuEngine:
    """Base class: applicability on GPU devices with torch; subclasses add op rules and ``build``."""

    name = ""
    ops: frozenset[str] = frozenset()
    knobs: tuple[Knob, ...] = ()
    supports_exhaustive = False
    priority = 100
    storage_dtypes = frozenset({"fp32", "fp16", "bf16"})

    def applicable(self, problem: Problem, device: Device) -> Support:
        if device.vendor not in GPU_VENDORS:
            return Support.no(f"runs on NVIDIA or AMD GPUs, not on a {device.vendor} device")
        torch, reason = torch_or_reason()
        if torch is None:
            return Support.no(reason)
        for t in problem.tensors:
            if t.dtype not in self.storage_dtypes:
                return Support.no(f"tensor {t.id} is {t.dtype}; supports {', '.join(sorted(self.storage_dtypes))}")
        return self.supports(problem, device)

    def supports(self, problem: Problem, device: Device) -> Support:
        return Support.yes()

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        return 0

    def compile(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> "TorchPlan":
        return self.build(problem, dict(knobs), device)

    def build(self, problem: Problem, knobs: dict[str, KnobValue], device: Device) -> "TorchPlan":
        raise NotImplementedError  # pragma: no cover

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


def current_raw_stream(torch: Any) -> Callable[[int], int]:
    """``f(device index)`` -> the caller's current CUDA stream as an integer handle: torch's raw getter
    (what Inductor's generated code calls, no Stream object made) where this torch has it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def device_stream(device: Device) -> Any:
    """The device's runtime stream as a torch stream, or None for "torch's current stream at run time"."""
    torch = torch_module()
    if device.stream is None:
        return None
    return torch.cuda.ExternalStream(int(device.stream), device=torch.device("cuda", device.index))


class TorchPlan:
    """Runs ``fn(tensors)`` on the device stream, inside ``context()`` when given (flags, backend choice).

    A device without a stream (the replay runtime's) runs on the caller's current torch stream.
    ``produce(inputs)``, where an engine gives it, returns the library's own output instead of
    writing into a given one (replay without ``out=`` hands it back: no extra copy). With
    ``copies_output`` (``fn`` copies that output into the given one) the tuner times ``produce``,
    what replay runs; otherwise ``fn`` writes in place (``out=``) and is timed. A context
    with a ``needed()`` method (:class:`Flags`) is entered only when it would change something,
    so a plan with default knobs costs a few flag reads per call, not a context switch.
    """

    def __init__(self, fn: Callable[[Mapping[str, Any]], None], device: Device, workspace_size: int = 0,
                 context: Callable[[], Any] | None = None,
                 produce: Callable[[Mapping[str, Any]], Any] | None = None, copies_output: bool = False) -> None:
        self.fn = fn
        self.copies_output = copies_output and produce is not None
        self.workspace_size = workspace_size
        self.context = context
        self._needed = getattr(context, "needed", None)
        self.stream = device_stream(device)
        self._torch = torch_module()
        if produce is not None:
            self.produce = self._producer(produce)

    def run(self, tensors: Mapping[str, Any], workspace: Any, stream: Any) -> None:
        if self.stream is None:
            self._call(self.fn, tensors)
            return
        with self._torch.cuda.stream(self.stream):
            self._call(self.fn, tensors)

    def _producer(self, produce: Callable[[Mapping[str, Any]], Any]) -> Callable[[Mapping[str, Any]], Any]:
        if self.stream is None and self.context is None:
            return produce  # the replay path: the library call itself

        def call(tensors: Mapping[str, Any]) -> Any:
            if self.stream is None:
                return self._call(produce, tensors)
            with self._torch.cuda.stream(self.stream):
                return self._call(produce, tensors)

        return call

    def _call(self, fn: Callable[[Mapping[str, Any]], Any], tensors: Mapping[str, Any]) -> Any:
        if self.context is None or (self._needed is not None and not self._needed()):
            return fn(tensors)
        with self.context():
            return fn(tensors)


class Flags:
    """A context factory setting attributes of a torch flags object for a call; ``needed()`` says
    whether any differs from the value in force (TorchPlan skips the context when none does)."""

    def __init__(self, obj: Any, **values: Any) -> None:
        self.obj = obj
        self.values = values
        self._items = tuple(values.items())

    def needed(self) -> bool:
        obj = self.obj
        for k, v in self._items:
            if getattr(obj, k) != v:
                return True
        return False

    def __call__(self) -> Any:
        return flags(self.obj, **self.values)


@contextlib.contextmanager
def flags(obj: Any, **values: Any) -> Iterator[None]:
    """Set attributes of a torch flags object for the duration (restored after, even on error)."""
    old = {k: getattr(obj, k) for k in values}
    try:
        for k, v in values.items():
            setattr(obj, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


def empty_like_desc(problem: Problem, tid: str, device: Device) -> Any:
    """An uninitialised tensor with the layout of ``problem``'s tensor ``tid`` (for capability queries)."""
    torch = torch_module()
    t = problem.tensor(tid)
    return torch.empty_strided(t.dims, t.strides, dtype=torch_dtype(t.dtype), device=torch.device("cuda", device.index))


def gemm_mkn(problem: Problem) -> tuple[int, int, int]:
    """M, K, N of a matmul problem."""
    a, c = problem.tensor("A").dims, problem.tensor("C").dims
    return a[-2], a[-1], c[-1]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class ZeroPaddedAB:
    """A and B copied into zero-filled device buffers of larger K and N extents (Inductor's pad_mm).

    The zeros in the K padding leave the product over the padded K exact, and the
    buffers' rows start aligned, so GEMM kernels can use vector loads. The buffers
    are allocated once, when the plan is built; every run copies A and B in: with the
    Triton pad kernel (one launch, vector stores; ``use_pad_kernel``) where Triton is
    there, else with torch's ``copy_``. ``b_shape``'s N extent may be smaller than B's
    for a split GEMM (only the first columns are copied).
    """

    def __init__(self, problem: Problem, device: Device, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
        torch = torch_module()
        where = torch.device("cuda", device.index)
        self.problem = problem
        self.a = torch.zeros(a_shape, dtype=torch_dtype(problem.tensor("A").dtype), device=where)
        self.b = torch.zeros(b_shape, dtype=torch_dtype(problem.tensor("B").dtype), device=where)
        torch.cuda.current_stream(where).synchronize()  # the zeros are in place before any stream uses them
        m, k, n = gemm_mkn(problem)
        self._a_in, self._b_in = self.a[..., :m, :k], self.b[..., :k, :min(n, b_shape[-1])]
        self._kernel: PadAB | None = None

    @staticmethod
    def nbytes(problem: Problem, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
        return (elements(a_shape) * itemsize(problem.tensor("A").dtype)
                + elements(b_shape) * itemsize(problem.tensor("B").dtype))

    def use_pad_kernel(self, tail_from: int | None = None) -> bool:
        """Copy with the Triton pad kernel, compiled now; False (torch copies stay) without Triton.

        With ``tail_from``, ``copy_in`` also writes C's columns from there on (a split GEMM's tail).
        """
        if self.a.dim() > 3 or self.b.dim() > 3:
            return False  # the kernel takes one batch dimension; torch's copy_ takes any
        try:
            import triton  # noqa: F401
        except ImportError:
            log.debug("no Triton: padded copies use torch's copy_")
            return False
        kernel = PadAB(self.problem, self.a, self.b, tail_from)
        with TRITON_COMPILE_LOCK, gil_heavy_section():
            kernel.compile(torch_dtype(self.problem.tensor("C").dtype))
        self._kernel = kernel
        return True

    def copy_in(self, tensors: Mapping[str, Any]) -> None:
        """A and B into the buffers (and C's tail columns, where ``use_pad_kernel`` was given one)."""
        if self._kernel is not None:
            self._kernel(tensors["A"], tensors["B"], tensors["C"], tensors.get("bias"))
            return
        self._a_in.copy_(tensors["A"])
        self._b_in.copy_(tensors["B"][..., :self._b_in.shape[-1]])

    def keep_until_done(self, plan: "TorchPlan", *more: Any) -> None:
        """The buffers are freed only after the plan's device stream is done with them."""
        keep_until_done(plan, self.a, self.b, *more)


def keep_until_done(plan: TorchPlan, *buffers: Any) -> None:
    """A plan's own device buffers are freed only after its device stream is done with them."""
    if plan.stream is not None:
        for buf in buffers:
            if buf is not None:
                buf.record_stream(plan.stream)


def elements(shape: tuple[int, ...]) -> int:
    out = 1 if shape else 0
    for v in shape:
        out *= v
    return out
