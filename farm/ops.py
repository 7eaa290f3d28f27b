"""Entry points production code calls: the tuned engine runs, nothing is measured.

    import farm.ops
    c = farm.ops.matmul(a, b)                 # numpy on the CPU, torch tensors on their GPU
    o = farm.ops.sdpa(q, k, v, causal=True)
    y = farm.ops.conv2d(x, w, stride=2, padding=1)
    y = farm.ops.layernorm(x, scale, bias); y = farm.ops.rmsnorm(x, scale)

The first call for a shape builds its Problem and asks the device's
TunableRuntime for an engine (a recorded winner, a tuning run when tuning is
on, else the selection policies: FARM_HEUR_CONFIG_PATH's override file, then
StaticOrdering). The choice is cached per shape, so later calls cost a
dictionary lookup plus the engine itself. Torch tensors run on the caller's
current stream; CPU torch tensors are treated as numpy arrays (shared memory).

The runtime tuner's API (its design document's table, PyTorch TunableOp's names) is here at module level:
``enable``/``disable``/``is_enabled``, ``tuning_*``, ``record_untuned_*``, ``set_verbose``, the duration and
sample budgets, ``set_filename``/``get_filename``, ``read_file``, ``write_file``, ``get_results``; settings
apply to every device's runtime. ``runtime(...)`` gives one device's runtime; ``choices()`` says what runs.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from farm.devices.arrays import NUMPY_DTYPES
from farm.devices.device import Device
from farm.devices.open import open_device
from farm.errors import InputError
from farm.model.dtypes import canonical_dtype
from farm.model.problem import Problem, contiguous_strides
from farm.replay.tunable_runtime import Bound, TunableRuntime
from farm.replay.tunable_settings import TunableSettings, _budget_ms, _budget_samples

__all__ = ["matmul", "sdpa", "conv2d", "layernorm", "rmsnorm",
           "enable", "disable", "is_enabled", "tuning_enable", "tuning_disable", "tuning_is_enabled",
           "record_untuned_enable", "record_untuned_disable", "record_untuned_is_enabled", "set_verbose",
           "set_max_tuning_duration", "get_max_tuning_duration", "set_max_tuning_samples", "get_max_tuning_samples",
           "set_filename", "get_filename", "read_file", "write_file", "get_results", "runtime", "choices", "reset"]


@dataclass(frozen=True)
class _Cached:
    bound: Bound
    out_id: str
    out_dims: tuple[int, ...]
    out_dtype: str
    produce: Callable[[Mapping[str, Any]], Any] | None  # returns the library's own output (no out= given)
    framework: "_Framework"
    back: Callable[[Any], Any] | None  # results back to the caller's type (torch CPU tensors); None: as they are
    out_strides: tuple[int, ...] = ()
    # the engine recorded for calls inside a captured graph, when it is not ``bound``'s, and how to tell a capture
    graph: "_Cached | None" = None
    capturing: Callable[[], bool] | None = None
    alloc: Callable[[], Any] | None = None  # a fresh output of the bound layout (no per-call dtype or device lookup)


class RuntimeRegistry:
    """One TunableRuntime per (runtime kind, device index), created on first use, with shared setting changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtimes: dict[tuple[str, int], TunableRuntime] = {}
        self._changes: dict[str, Any] = {}
        self.cache: dict[tuple[Any, ...], _Cached] = {}

    def get(self, kind: str, index: int) -> TunableRuntime:
        rt = self._runtimes.get((kind, index))
        if rt is None:
            with self._lock:
                rt = self._runtimes.get((kind, index))
                if rt is None:
                    rt = TunableRuntime(*_devices(kind, index), settings=self._settings())
                    self._runtimes[(kind, index)] = rt
        return rt

    def _settings(self) -> TunableSettings:
        return dataclasses.replace(TunableSettings.from_env(), **self._changes)

    def settings(self) -> TunableSettings:
        """The settings a runtime created now would get (the environment, then every change made)."""
        with self._lock:
            return self._settings()

    def configure(self, **changes: Any) -> None:
        """Change settings for every runtime, present and future; cached choices are made again."""
        with self._lock:
            self._changes.update(changes)
            for rt in self._runtimes.values():
                rt.configure(**changes)
            self.cache.clear()

    def runtimes(self) -> list[TunableRuntime]:
        return list(self._runtimes.values())

    def reset(self) -> None:
        with self._lock:
            self._runtimes.clear()
            self._changes.clear()
            self.cache.clear()


def _devices(kind: str, index: int) -> tuple[Device, Device]:
    """(the device tuning measures on, the device plans run on)."""
    if kind == "cpu":
        d = open_device("cpu", index)
        return d, d
    tuning = open_device(kind, index)
    # replayed plans run on the caller's current torch stream, not the tuner's private one
    return tuning, dataclasses.replace(tuning, stream=None)


RUNTIMES = RuntimeRegistry()


# -- the runtime tuner's API (its design document's table; PyTorch TunableOp's names) ---------------------------
# Settings apply to every device's runtime, present and future; the results calls to every runtime in use
# (the CPU's when none is yet).
def enable(on: bool = True) -> None:
    RUNTIMES.configure(enabled=on)


def disable() -> None:
    enable(False)


def is_enabled() -> bool:
    return RUNTIMES.settings().enabled


def tuning_enable(on: bool = True) -> None:
    RUNTIMES.configure(tuning=on)


def tuning_disable() -> None:
    tuning_enable(False)


def tuning_is_enabled() -> bool:
    return RUNTIMES.settings().tuning


def record_untuned_enable(on: bool = True) -> None:
    RUNTIMES.configure(record_untuned=on)


def record_untuned_disable() -> None:
    record_untuned_enable(False)


def record_untuned_is_enabled() -> bool:
    return RUNTIMES.settings().record_untuned


def set_verbose(on: bool = True) -> None:
    RUNTIMES.configure(verbose=on)


def set_max_tuning_duration(ms: float) -> None:
    """Per candidate, in ms; 0 turns the time limit off."""
    RUNTIMES.configure(max_tuning_duration_ms=_budget_ms(str(ms)))


def get_max_tuning_duration() -> float:
    return RUNTIMES.settings().max_tuning_duration_ms


def set_max_tuning_samples(samples: int) -> None:
    """Per candidate; 0 turns the sample limit off."""
    RUNTIMES.configure(max_tuning_samples=_budget_samples(str(samples)))


def get_max_tuning_samples() -> int:
    return RUNTIMES.settings().max_tuning_samples


set_max_tuning_iterations = set_max_tuning_samples  # PyTorch TunableOp's names of the same setting
get_max_tuning_iterations = get_max_tuning_samples


def set_filename(filename: str) -> None:
    RUNTIMES.configure(filename=filename)


def get_filename() -> str:
    """The results file of the first runtime in use (each device's gets its ordinal); empty until set or used."""
    return _in_use()[0].get_filename()


def read_file(filename: str | None = None) -> bool:
    """Load recorded winners into every runtime in use; False when no runtime could use the file (its
    validators name another device or build: the reason is logged under verbose, and the file is left as it is)."""
    return any([rt.read_file(filename) for rt in _in_use()])


def write_file(filename: str | None = None) -> None:
    for rt in _in_use():
        rt.write_file(filename)


def get_results() -> list[tuple[str, str, str, float]]:
    """Every recorded winner as ``(op, params, kernel, time_ms)``."""
    return [r for rt in _in_use() for r in rt.get_results()]


def _in_use() -> list[TunableRuntime]:
    return RUNTIMES.runtimes() or [RUNTIMES.get("cpu", 0)]


def runtime(kind: str = "cpu", index: int = 0) -> TunableRuntime:
    """The runtime of one device ("cpu", "cuda" or "hip"; index)."""
    return RUNTIMES.get(kind, index)


def choices() -> list[dict[str, Any]]:
    """What each problem seen so far runs: problem, engine, knobs, and where the choice came from."""
    out = []
    for rt in RUNTIMES.runtimes():
        for b in rt.bound():
            out.append({"device": rt.device.signature, "problem": b.problem.label(), "problem_key": b.problem.key,
                        "engine": b.engine_name, "knobs": dict(b.knobs), "source": b.source})
    return out


def reset() -> None:
    """Forget every runtime, setting change and cached choice (tests; a new results file)."""
    RUNTIMES.reset()


# -- tensors ------------------------------------------------------------------------------------
class _Framework:
    """How one tensor library describes and allocates tensors."""

    def describe(self, t: Any) -> tuple[tuple[int, ...], tuple[int, ...], str]: ...
    def empty(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Any: ...

    def allocator(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Callable[[], Any]:
        """``empty`` of this layout with every argument bound now: what a call without ``out=`` runs.
        It keeps none of ``like`` but its device (the cache must not hold a caller's tensor alive)."""
        ...


class _Numpy(_Framework):
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


class _Torch(_Framework):
    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def describe(self, t: Any) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        return tuple(t.shape), tuple(t.stride()), canonical_dtype(str(t.dtype))

    def empty(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Any:
        from engines.gpu._common import torch_dtype

        if strides:
            return self.torch.empty_strided(dims, strides, dtype=torch_dtype(dtype), device=like.device)
        return self.torch.empty(dims, dtype=torch_dtype(dtype), device=like.device)

    def allocator(self, like: Any, dims: tuple[int, ...], dtype: str, strides: tuple[int, ...] = ()) -> Callable[[], Any]:
        from engines.gpu._common import torch_dtype

        if strides:
            return functools.partial(self.torch.empty_strided, dims, strides, dtype=torch_dtype(dtype), device=like.device)
        return functools.partial(self.torch.empty, dims, dtype=torch_dtype(dtype), device=like.device)


_NUMPY = _Numpy()


def _placement(t: Any) -> tuple[str, int, _Framework, Callable[[Any], Any] | None]:
    """(runtime kind, device index, framework, how results go back to the caller's type: None = as they are)."""
    if isinstance(t, np.ndarray):
        return "cpu", 0, _NUMPY, None
    torch = _torch_if_tensor(t)
    if torch is None:
        raise InputError("expected a numpy array or a torch tensor", field="tensor", value=type(t).__name__)
    if t.device.type == "cpu":
        return "cpu", 0, _NUMPY, torch.from_numpy
    kind = "hip" if getattr(torch.version, "hip", None) else "cuda"
    return kind, t.device.index or 0, _torch_framework(torch), None


@functools.lru_cache(maxsize=1)
def _torch_framework(torch: Any) -> "_Torch":
    return _Torch(torch)


def _torch_if_tensor(t: Any) -> Any:
    mod = type(t).__module__
    if not mod.startswith("torch"):
        return None
    import torch

    return torch if isinstance(t, torch.Tensor) else None


def _layout(t: Any) -> tuple[Any, ...]:
    """What a cached choice depends on, read as cheaply as the tensor library allows."""
    if type(t) is np.ndarray:
        return t.shape, t.strides, t.dtype
    try:
        return t.shape, t.stride(), t.dtype, t.device  # a torch tensor (its device names the runtime and index)
    except (AttributeError, TypeError):
        if isinstance(t, np.ndarray):
            return t.shape, t.strides, t.dtype
        raise InputError("expected a numpy array or a torch tensor", field="tensor", value=type(t).__name__) from None


def _run(op: str, tensors: Mapping[str, Any], params: Any, criteria: Callable[[], tuple[tuple[str, int], ...]],
         compute_dtype: str | None, out: Any, key: tuple[Any, ...] | None = None) -> Any:
    """The per-call path: one dictionary lookup on the tensors' layouts and the op's raw arguments
    (``params``), then the library call. ``criteria()`` is evaluated only when a new shape is bound.
    ``key``: the op's own flat key of torch tensors (see matmul), where it could make one."""
    if key is None:
        key = (op, params, compute_dtype, *[_layout(t) for t in tensors.values()])
    cached = RUNTIMES.cache.get(key)
    if cached is None:
        cached = _bind(op, tensors, criteria(), compute_dtype, key)
    if cached.graph is not None and cached.capturing():  # type: ignore[misc]
        cached = cached.graph  # a graph decision is asked for only where the file holds one apart
    if cached.back is not None:  # torch tensors on the CPU run as numpy arrays (shared memory)
        tensors = {k: v.numpy() for k, v in tensors.items()}
        out = out.numpy() if out is not None else None
    if out is None:
        if cached.produce is not None:
            result = cached.produce(tensors)
            return result if cached.back is None else cached.back(result)
        out = cached.alloc()  # type: ignore[misc]
    else:
        dims, strides, _ = cached.framework.describe(out)
        if dims != cached.out_dims:
            raise InputError(f"out must have shape {list(cached.out_dims)}", field="out", value=list(dims))
        if cached.back is None and isinstance(cached.framework, _Torch) and strides != cached.out_strides:
            # the plan writes the layout it was tuned for: into a buffer of that layout, then into out
            given, out = out, cached.framework.empty(out, cached.out_dims, cached.out_dtype, cached.out_strides)
            cached.bound.run({**tensors, cached.out_id: out})
            return given.copy_(out)
    cached.bound.run({**tensors, cached.out_id: out})
    return out if cached.back is None else cached.back(out)


def _bind(op: str, tensors: Mapping[str, Any], criteria: tuple[tuple[str, int], ...], compute_dtype: str | None,
          key: tuple[Any, ...]) -> _Cached:
    kind, index, fw, back = _placement(next(iter(tensors.values())))
    if back is not None:
        tensors = {k: v.numpy() for k, v in tensors.items()}
    described = {k: fw.describe(v) for k, v in tensors.items()}
    spec = {k: {"dims": d, "strides": s, "dtype": t} for k, (d, s, t) in described.items()}
    problem = Problem.create(op, spec, criteria=dict(criteria), compute_dtype=compute_dtype)
    if op == "conv_fprop" and isinstance(fw, _Torch) and _channels_last(*described["X"][:2]):
        # a channels-last input gives a channels-last output, as torch's conv2d does (and the engines are
        # tuned for: an NCHW output from NHWC inputs is another, slower problem)
        dims = problem.tensor("Y").dims
        spec["Y"] = {"dims": dims, "strides": _nhwc_strides(dims), "dtype": described["X"][2]}
        problem = Problem.create(op, spec, criteria=dict(criteria), compute_dtype=compute_dtype)
    rt = RUNTIMES.get(kind, index)
    bound = rt.bind(problem.key, problem)
    out_id = problem.output_ids[0]
    desc = problem.tensor(out_id)
    like = next(iter(tensors.values()))
    cached = _Cached(bound, out_id, desc.dims, desc.dtype, bound.produce, fw, back, desc.strides,
                     alloc=fw.allocator(like, desc.dims, desc.dtype, desc.strides))
    check = rt.exec_device.extras.get("is_capturing")
    graph = rt.bind_call(problem.key, problem, "graph") if check is not None else None
    if graph is not None and (graph.engine_name, graph.knobs) != (bound.engine_name, bound.knobs):
        probe = rt.exec_device.extras.get("capture_probe")
        cached = dataclasses.replace(cached, graph=dataclasses.replace(cached, bound=graph, produce=graph.produce),
                                     capturing=probe(rt.exec_device) if probe is not None
                                     else functools.partial(check, rt.exec_device))
    RUNTIMES.cache[key] = cached
    return cached


def _nhwc_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    n, c, h, w = dims
    return (c * h * w, 1, w * c, c)


def _channels_last(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Stored NHWC (and not also plain NCHW, as a 1x1 image or one channel is)."""
    return len(dims) == 4 and tuple(strides) == _nhwc_strides(tuple(dims)) and \
        tuple(strides) != contiguous_strides(tuple(dims))


def _pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    try:
        h, w = value
        return int(h), int(w)
    except (TypeError, ValueError):
        raise InputError("expected an int or a pair of ints", field=name, value=value) from None


# -- the ops ------------------------------------------------------------------------------------
def matmul(a: Any, b: Any, bias: Any = None, *, out: Any = None, compute_dtype: str | None = None) -> Any:
    """``a @ b (+ bias)``; batched when ``a`` has more than two dims. ``compute_dtype="tf32"`` allows TF32."""
    if bias is None:  # one flat key, no per-tensor tuples (a replayed small GEMM is host-bound)
        if type(a) is np.ndarray and type(b) is np.ndarray:
            key = (_MATMUL, compute_dtype, a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype)
        else:
            try:  # torch tensors
                key = (_MATMUL, compute_dtype, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype,
                       b.device)
            except (AttributeError, TypeError):  # anything else: the general key (and its clear error)
                key = None
        return _run("matmul", {"A": a, "B": b}, (), _no_criteria, compute_dtype, out, key)
    return _run("matmul", {"A": a, "B": b, "bias": bias}, (), _no_criteria, compute_dtype, out)


_MATMUL = ("matmul", "flat")  # the flat key's head: never equal to a general key's


def _no_criteria() -> tuple[tuple[str, int], ...]:
    return ()


def sdpa(q: Any, k: Any, v: Any, *, causal: bool = False, out: Any = None) -> Any:
    """softmax(q k^T / sqrt(d)) v on [batch, heads, seq, dim] tensors (grouped-query when k/v have fewer heads)."""
    return _run("sdpa_fwd", {"Q": q, "K": k, "V": v}, bool(causal), lambda: (("causal", int(bool(causal))),), None, out)


def conv2d(x: Any, w: Any, *, stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
           dilation: int | tuple[int, int] = 1, groups: int = 1, out: Any = None) -> Any:
    """2-D convolution, NCHW input, KCRS filter (no bias); a channels-last input gives a channels-last
    output, as torch's conv2d does."""
    params = (stride, padding, dilation, groups)
    try:
        hash(params)
    except TypeError:  # lists: made hashable (and checked) the slow way
        params = (_pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation"), groups)

    def criteria() -> tuple[tuple[str, int], ...]:
        sh, sw = _pair(stride, "stride")
        ph, pw = _pair(padding, "padding")
        dh, dw = _pair(dilation, "dilation")
        return (("dilation_h", dh), ("dilation_w", dw), ("groups", int(groups)), ("pad_h", ph), ("pad_w", pw),
                ("stride_h", sh), ("stride_w", sw))

    return _run("conv_fprop", {"X": x, "W": w}, params, criteria, None, out)


def layernorm(x: Any, scale: Any, bias: Any, *, out: Any = None) -> Any:
    """Layer normalization over the last dim (eps 1e-5): ``(x - mean) / sqrt(var + eps) * scale + bias``."""
    return _run("layernorm", {"X": x, "scale": scale, "bias": bias}, (), _no_criteria, None, out)


def rmsnorm(x: Any, scale: Any, *, out: Any = None) -> Any:
    """RMS normalization over the last dim (eps 1e-5): ``x / sqrt(mean(x^2) + eps) * scale``."""
    return _run("rmsnorm", {"X": x, "scale": scale}, (), _no_criteria, None, out)
