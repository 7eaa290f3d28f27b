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

from farm.plugin import Device, Knob, KnobValue, Problem, Support, gil_heavy_section, graph_pool_active, itemsize

from .triton_pad import PadAB

log = logging.getLogger("farm.engines.gpu")

GPU_VENDORS = frozenset({"nvidia", "amd"})
TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8",
                "int32": "int32", "bool": "bool"}
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
            if t.dtype not in self.storage_dtypes and not (t.id == "mask" and t.dtype == "bool"):
                return Support.no(f"tensor {t.id} is {t.dtype}; supports {', '.join(sorted(self.storage_dtypes))}")
        if problem.has_tensor("mask") and not getattr(self, "takes_mask", False):
            return Support.no("an attention mask: this engine attends without one")
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
        self.context = None if isinstance(context, Flags) and not context else context  # no flag to set
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
        context = self.context
        if self.stream is None and isinstance(context, Flags):
            checks = context._checks  # the replay path with flags: their reads inline, no frame of ours between

            def flagged(tensors: Mapping[str, Any]) -> Any:
                for get, value in checks:
                    if get() != value:
                        with context():
                            return produce(tensors)
                return produce(tensors)

            return flagged

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
    whether any differs from the value in force (TorchPlan skips the context when none does).

    ``needed()`` runs on every replayed call, so it reads each flag through the C function behind it where
    torch has one (``torch.backends.cudnn.benchmark`` is a property over ``torch._C._get_cudnn_benchmark``;
    ``torch.backends.cuda.matmul.allow_tf32`` a module ``__getattr__`` comparing strings before it calls
    ``torch._C._get_cublas_allow_tf32``): tens of nanoseconds a flag instead of hundreds."""

    def __init__(self, obj: Any, **values: Any) -> None:
        self.obj = obj
        self.values = values
        self._checks = tuple((_flag_getter(obj, k), v) for k, v in values.items())

    def __bool__(self) -> bool:
        return bool(self.values)

    def needed(self) -> bool:
        for get, v in self._checks:
            if get() != v:
                return True
        return False

    def __call__(self) -> Any:
        return flags(self.obj, **self.values)


# torch.backends.cuda.matmul's flags and the C getters its __getattr__ calls for them
_CUBLAS_GETTERS = {"allow_tf32": "_get_cublas_allow_tf32"}


def _flag_getter(obj: Any, name: str) -> Callable[[], Any]:
    """A function of no arguments returning ``getattr(obj, name)``, as cheap as torch allows; the fast one is
    used only where it gives the same value as the attribute now."""
    slow = functools.partial(getattr, obj, name)
    # torch.backends' ContextProp, read off the class without calling it (its __get__ returns the value)
    prop = next((vars(k)[name] for k in type(obj).__mro__ if name in vars(k)), None)
    fast = getattr(prop, "getter", None)
    if fast is None and name in _CUBLAS_GETTERS and type(obj).__name__ == "cuBLASModule":
        fast = getattr(torch_module()._C, _CUBLAS_GETTERS[name], None)
    if callable(fast):
        try:
            if fast() == slow():
                return fast
        except Exception:  # a getter of another signature: the attribute is read
            pass
    return slow


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


def triton_compile_key(kernel: str, device: Device, dtypes: tuple[str, ...], meta: Mapping[str, Any],
                       scalars: tuple[int, ...]) -> str:
    """Names a kernel binary in Triton's disk cache, which every worker of a host reads: the kernel, the
    dtypes, the constexprs and the integer arguments' specialisation (==1, divisible by 16), not the shape
    itself. Engines return it from ``compile_key`` so workers of one host compile each binary once."""
    import os

    import triton

    spec = "".join("1" if v == 1 else "D" if v % 16 == 0 else "." for v in scalars)
    cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return "|".join((kernel, triton.__version__, cache, device.properties.arch, ",".join(dtypes),
                     ",".join(f"{k}={v}" for k, v in sorted(meta.items())), spec))


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class PerStream:
    """Buffers a plan keeps per CUDA stream: ``make()`` runs on a stream's first call, on that stream.

    Calls on two streams at once must not share scratch buffers (torch keeps cuBLAS's workspace per
    stream for the same reason): one stream's copy would overwrite what the other's kernel is reading.
    A buffer made and used on one stream needs no ``record_stream`` when the plan is dropped. Where a CUDA
    graph's pool takes what is allocated (``graph_pool_active``), the buffers are made for that call alone and
    dropped when it returns (inside a graph: its pool's memory, which the graph's replays reuse), never kept.
    """

    def __init__(self, make: Callable[[], Any], device_index: int) -> None:
        self._make = make
        self._index = device_index
        self._raw_stream = current_raw_stream(torch_module())
        self._by_stream: dict[int, Any] = {}
        self._lock = threading.Lock()

    def get(self, stream: int | None = None) -> Any:
        """The current stream's buffers (``stream``: its raw handle, where the caller has it already)."""
        if stream is None:
            stream = self._raw_stream(self._index)
        found = self._by_stream.get(stream)
        if found is None:
            if graph_pool_active(self._index):
                return self._make()  # this call's alone: kept, it would outlive the recording in the graph's pool
            with self._lock:
                found = self._by_stream.get(stream)
                if found is None:
                    found = self._by_stream[stream] = self._make()
        return found

    def made(self) -> list[Any]:
        """What ``make()`` made so far, a stream's each."""
        with self._lock:
            return list(self._by_stream.values())


class ZeroPaddedAB:
    """A and B copied into zero-filled device buffers of larger K and N extents (Inductor's pad_mm).

    The zeros in the K padding leave the product over the padded K exact, and the buffers' rows start
    aligned, so GEMM kernels can use vector loads. The buffers are a stream's own (``PerStream``), zeroed
    on that stream at its first call (inside a CUDA graph being captured, the zeroing is captured with it);
    every run copies A and B in: with the Triton pad kernel (one launch, vector stores;
    ``use_pad_kernel``) where Triton is there, else with torch's ``copy_``. ``b_shape``'s N extent may be
    smaller than B's for a split GEMM (only the first columns are copied). ``derive(a, b)`` adds, once per
    stream, what a caller keeps with the buffers (views of them, an output buffer): ``copy_in`` returns
    ``(a, b, *derive(a, b))``.
    """

    def __init__(self, problem: Problem, device: Device, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                 derive: Callable[[Any, Any], tuple[Any, ...]] | None = None) -> None:
        torch = torch_module()
        self.problem = problem
        self._where = torch.device("cuda", device.index)
        self._shapes = (a_shape, b_shape)
        self._dtypes = (torch_dtype(problem.tensor("A").dtype), torch_dtype(problem.tensor("B").dtype))
        self._derive = derive
        m, k, n = gemm_mkn(problem)
        self._a_in, self._b_in = (slice(0, m), slice(0, k)), (slice(0, k), slice(0, min(n, b_shape[-1])))
        self._buffers = PerStream(self._zeroed, device.index)
        self._kernel: PadAB | None = None

    def _zeroed(self) -> tuple[Any, ...]:
        torch = torch_module()
        a, b = (torch.zeros(shape, dtype=dtype, device=self._where) for shape, dtype in zip(self._shapes, self._dtypes))
        return (a, b, *(self._derive(a, b) if self._derive is not None else ()))

    @staticmethod
    def nbytes(problem: Problem, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
        return (elements(a_shape) * itemsize(problem.tensor("A").dtype)
                + elements(b_shape) * itemsize(problem.tensor("B").dtype))

    def use_pad_kernel(self, tail_from: int | None = None) -> bool:
        """Copy with the Triton pad kernel, compiled now; False (torch copies stay) without Triton.

        With ``tail_from``, ``copy_in`` also writes C's columns from there on (a split GEMM's tail).
        """
        if len(self._shapes[0]) > 3 or len(self._shapes[1]) > 3:
            return False  # the kernel takes one batch dimension; torch's copy_ takes any
        try:
            import triton  # noqa: F401
        except ImportError:
            log.debug("no Triton: padded copies use torch's copy_")
            return False
        kernel = PadAB(self.problem, self._shapes[0], self._shapes[1], tail_from)
        with TRITON_COMPILE_LOCK, gil_heavy_section():
            kernel.compile(*self._dtypes, torch_dtype(self.problem.tensor("C").dtype))
        self._kernel = kernel
        return True

    def copy_in(self, tensors: Mapping[str, Any]) -> tuple[Any, ...]:
        """A and B into this stream's buffers (and C's tail columns, where ``use_pad_kernel`` was given
        one); returns the buffers and what ``derive`` added."""
        buffers = self._buffers.get()
        a, b = buffers[0], buffers[1]
        if self._kernel is not None:
            self._kernel(tensors["A"], a, tensors["B"], b, tensors["C"], tensors.get("bias"))
        else:
            (am, ak), (bk, bn) = self._a_in, self._b_in
            a[..., am, ak].copy_(tensors["A"])
            b[..., bk, bn].copy_(tensors["B"][..., :bn.stop])
        return buffers


def elements(shape: tuple[int, ...]) -> int:
    out = 1 if shape else 0
    for v in shape:
        out *= v
    return out
