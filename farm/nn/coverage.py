"""What share of a step's time the farm's problems cover, and what the rest of the step is, by kind.

Before tuning, a user should see what tuning can reach: a decode step whose matmuls are 70 % of its device time
can gain at most that part. ``step_coverage`` runs the step once with every top-level torch call sorted by kind,
and sums each kind's time: on a GPU the device time of the kernels its calls launch (torch's profiler, a range
a call), on a CPU the host's time of its calls:

* the farm's problems: ``tuned: matmul``, ``tuned: convolution``, ``tuned: attention``, ``tuned: norm``;
* calls of those operations the farm cannot run as called (``not captured: ...``: masks of other ranks, eps...);
* the rest, by what makes them: ``norms (hand-written)`` (a module named ...Norm computing it from elementwise
  calls, as Llama's and Qwen2's RMSNorm), ``rotary``, ``masks`` (functions building attention masks),
  ``elementwise``, ``copies and reshapes``, ``reductions and softmax``, ``embedding``, ``batch norm``, ``pooling``,
  ``other``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from farm.nn.hand_written import rmsnorm_shaped
from farm.nn.torch_calls import OpCall, Skipped, read_call, torch_module

log = logging.getLogger("farm.nn.coverage")
RANGE = "farm.kind:"
TUNED = {"matmul": "tuned: matmul", "conv_fprop": "tuned: convolution", "sdpa_fwd": "tuned: attention",
         "layernorm": "tuned: norm", "rmsnorm": "tuned: norm"}
_ELEMENTWISE = {"add", "sub", "mul", "div", "true_divide", "pow", "rsqrt", "sqrt", "exp", "log", "neg", "silu", "gelu",
                "relu", "tanh", "sigmoid", "where", "clamp", "abs", "square", "reciprocal", "masked_fill", "dropout",
                "erf", "sin", "cos", "rsub", "radd", "rmul", "iadd", "imul", "isub", "idiv", "truediv", "floordiv",
                "hardtanh", "relu6", "hardswish", "leaky_relu", "softplus", "mish", "gelu_tanh", "fill", "zero"}
_COPIES = {"view", "reshape", "transpose", "permute", "contiguous", "cat", "stack", "split", "chunk", "expand",
           "index_copy", "copy", "to", "clone", "flatten", "unsqueeze", "squeeze", "narrow", "getitem", "setitem",
           "index_select", "repeat", "repeat_interleave", "type_as", "float", "half", "bfloat16", "t", "unflatten",
           "expand_as", "view_as", "gather", "scatter", "roll", "pad", "unbind", "select", "slice", "as_strided"}
_REDUCTIONS = {"mean", "sum", "max", "min", "softmax", "log_softmax", "var", "std", "norm", "amax", "amin",
               "argmax", "topk", "cumsum", "var_mean", "logsumexp"}
_MASK_WORDS = ("mask",)
_ROTARY_WORDS = ("rotary", "rope", "rotate_half")
ORDER = ("tuned: matmul", "tuned: convolution", "tuned: attention", "tuned: norm", "norms (hand-written)", "rotary",
         "masks", "elementwise", "copies and reshapes", "reductions and softmax", "embedding", "batch norm",
         "pooling", "other")


@dataclass(frozen=True)
class KindShare:
    """One kind of call in a step: its time a step (ms) and share of the step's time, its calls a step."""

    kind: str
    ms: float
    share: float
    calls: int

    @property
    def tuned(self) -> bool:
        return self.kind.startswith("tuned: ")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "ms": round(self.ms, 6), "share": round(self.share, 4), "calls": self.calls}


@dataclass(frozen=True)
class StepCoverage:
    """A step's time by kind of call (``time`` says what was measured: "device" or "host")."""

    step: str
    time: str
    kinds: tuple[KindShare, ...]

    @property
    def covered(self) -> float:
        """The share of the step's time the farm's problems take."""
        return sum(k.share for k in self.kinds if k.tuned)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "time": self.time, "covered": round(self.covered, 4),
                "kinds": [k.to_dict() for k in self.kinds]}


def kind_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], modules: Sequence[Any]) -> str:
    """The kind of one top-level torch call, made inside ``modules`` (the module stack, innermost last)."""
    got = read_call(func, args, kwargs)
    if isinstance(got, OpCall):
        return TUNED.get(got.problem.op, "other")
    if isinstance(got, Skipped):
        return f"not captured: {got.kind}"
    inner = type(modules[-1]).__name__.lower() if modules else ""
    torch_norms = {"layernorm", "rmsnorm", "groupnorm", "batchnorm1d", "batchnorm2d", "batchnorm3d"}
    if modules and rmsnorm_shaped(modules[-1]) is not None:
        return "tuned: norm (hand-written)"  # captured as a problem where it computes an RMSNorm (farm.nn.hand_written)
    if "norm" in inner and inner not in torch_norms:
        return "norms (hand-written)"
    callers = _callers()
    if any(w in inner for w in _ROTARY_WORDS) or any(w in c for c in callers for w in _ROTARY_WORDS):
        return "rotary"
    if any(w in c for c in callers for w in _MASK_WORDS):
        return "masks"
    name = getattr(func, "__name__", "").strip("_").lower()
    if name.startswith("i") and name[1:] in _ELEMENTWISE:
        name = name[1:]
    if name in _ELEMENTWISE or name.rstrip("_") in _ELEMENTWISE:
        return "elementwise"
    if name in _COPIES or name.rstrip("_") in _COPIES:
        return "copies and reshapes"
    if name in _REDUCTIONS:
        return "reductions and softmax"
    if "embedding" in name:
        return "embedding"
    if "batch_norm" in name:
        return "batch norm"
    if "pool" in name:
        return "pooling"
    return "other"


def _callers(depth: int = 6) -> list[str]:
    """The names of the functions (outside torch and the farm) that led to this call, innermost first."""
    out: list[str] = []
    frame = sys._getframe(2)
    while frame is not None and len(out) < depth:
        where = frame.f_code.co_filename
        if "/torch/" not in where and "/farm/" not in where:
            out.append(f"{frame.f_code.co_name} {where.rsplit('/', 1)[-1]}".lower())
        frame = frame.f_back
    return out


def step_coverage(step: Callable[[], Any], label: str, device: str, model: Any = None) -> StepCoverage:
    """Profile one run of ``step`` (on ``device``: "cpu", "cuda:N") and sum its calls' time by kind."""
    torch = torch_module()
    gpu = device.startswith("cuda")
    mode = _mode_class()(model, gpu)
    step()  # warm: first calls bind, compile and allocate
    try:
        if not gpu:  # the host's time of each call is the CPU's time (the profiler's own cost is not)
            runs = []
            for _ in range(5):  # each kind's least time of five runs: a busy host's stalls are not the step's
                mode.times, mode.calls = defaultdict(float), defaultdict(int)
                with mode:
                    step()
                runs.append(mode.times)
            mode.times = defaultdict(float, {k: min(r.get(k, 0.0) for r in runs) for k in runs[-1]})
        else:
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=activities) as prof:
                with mode:
                    step()
                torch.cuda.synchronize()
            for e in prof.key_averages():
                if e.key.startswith(RANGE):
                    us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
                    mode.times[e.key[len(RANGE):]] += float(us) / 1e3
    finally:
        mode.close()
    times, calls = mode.times, mode.calls
    total = sum(times.values()) or 1.0
    rank = {k: i for i, k in enumerate(ORDER)}
    kinds = sorted(times, key=lambda k: (rank.get(k, len(ORDER) if k.startswith("not captured") else len(ORDER) + 1),
                                         k))
    return StepCoverage(label, "device" if gpu else "host",
                        tuple(KindShare(k, times[k], times[k] / total, calls[k]) for k in kinds))


def _mode_class() -> type:
    torch = torch_module()

    class KindMode(torch.overrides.TorchFunctionMode):
        """Each top-level torch call in a profiler range named for its kind; the module stack from hooks."""

        def __init__(self, model: Any, gpu: bool) -> None:
            super().__init__()
            self.gpu = gpu
            self.times: dict[str, float] = defaultdict(float)  # ms (the host's; a GPU's from the profiler)
            self.calls: dict[str, int] = defaultdict(int)
            self.stack: list[Any] = []
            self.hooks: list[Any] = []
            for m in (model.modules() if model is not None else ()):
                self.hooks += [m.register_forward_pre_hook(self._enter), m.register_forward_hook(self._leave)]

        def _enter(self, module: Any, _args: Any) -> None:
            self.stack.append(module)

        def _leave(self, _module: Any, _args: Any, _out: Any) -> None:
            if self.stack:
                self.stack.pop()

        def close(self) -> None:
            for h in self.hooks:
                h.remove()
            self.hooks.clear()

        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            try:
                kind = kind_of(func, args, kwargs, self.stack)
            except Exception:  # a kind is information: the call runs whatever its arguments
                kind = "other"
            self.calls[kind] += 1
            if self.gpu:
                with torch.profiler.record_function(RANGE + kind):
                    return func(*args, **kwargs)
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.times[kind] += (time.perf_counter() - start) * 1e3

    return KindMode
