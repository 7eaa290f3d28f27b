"""Capture a model's tunable operations into a workload: ``with farm.capture(model) as c: model(x)``.

While the block runs, a torch function mode sees every torch call (the model is not changed): the calls of
operations the farm tunes (farm.nn.torch_calls) are counted per problem, with their call sites (module paths,
from the model's own names when it is given) and calling mode (inside a CUDA graph capture: ``graph``). It works
on tensors of the ``meta`` device too (the shapes of a model too big for the machine: no time is measured).

``c.time_step(fn)`` then times the unmodified step on its device (the host's time to issue it and its wall time:
what bounds it) and each problem's direct library call, giving each problem's share of the step.
``c.workload()`` is a ``CapturedWorkload``: merge several (batch sizes) and ``write`` a workload file.
"""

from __future__ import annotations

import logging
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from farm.errors import UsageError
from farm.model.problem import Problem
from farm.model.model_steps import StepInfo, Use, bound_of
from farm.nn.captured import CapturedProblem, CapturedWorkload, SkippedCall
from farm.nn.coverage import StepCoverage, step_coverage
from farm.nn.hand_written import read_hand_rmsnorm
from farm.nn.module_sites import NORM_KINDS, routable_norm
from farm.nn.torch_calls import OpCall, Skipped, read_call, torch_module

log = logging.getLogger("farm.nn.capturing")
CALL_MODES = ("eager", "graph")
_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def site_pattern(path: str) -> str:
    """A module path with its layer numbers folded: ``layers.3.mlp.down`` -> ``layers.*.mlp.down``."""
    return _LAYER_INDEX.sub("*", path)


@dataclass
class _Seen:
    problem: Problem
    kind: str
    count: int = 0
    sites: dict[str, None] = field(default_factory=dict)
    modes: dict[str, None] = field(default_factory=dict)


class Capture:
    """Records the tunable calls of the steps run inside ``with``; one Capture is one step (``label``).

    ``model`` names the call sites (module paths); ``calls`` sets the calling modes recorded for every problem
    (default: the mode each call was made in, ``graph`` inside a CUDA graph capture); ``steps``: how many steps
    the block ran (calls per step = calls seen / steps).
    """

    def __init__(self, model: Any = None, *, label: str = "step", calls: Sequence[str] | str | None = None,
                 steps: int = 1, name: str | None = None) -> None:
        if isinstance(calls, str):
            calls = (calls,)
        for c in calls or ():
            if c not in CALL_MODES:
                raise UsageError(f"calls: expected eager and/or graph, got {c!r}")
        if not isinstance(steps, int) or steps < 1:
            raise UsageError(f"steps: expected an integer >= 1, got {steps!r}")
        self.model = model
        self.label = label
        self.calls = tuple(calls) if calls else None
        self.steps = steps
        self.name = name or (type(model).__name__.lower() if model is not None else "captured")
        self._seen: dict[str, _Seen] = {}
        self._skipped: dict[tuple[str, str], SkippedCall] = {}
        self._device = ""
        self._step: StepInfo | None = None
        self._times: dict[str, float] = {}
        self._coverage: StepCoverage | None = None
        self._undo: list[Any] = []
        self._stack: list[tuple[str, Any]] = []  # (the module's name, the module): innermost last

    # -- the block ------------------------------------------------------------------------------
    def __enter__(self) -> "Capture":
        torch = torch_module()
        names = {id(m): n for n, m in self.model.named_modules()} if self.model is not None else {}
        stack = self._stack

        def pre(module: Any, _args: Any) -> None:
            stack.append((names.get(id(module)) or type(module).__name__, module))

        def post(module: Any, args: Any, out: Any) -> None:
            if stack:
                stack.pop()
            got = read_hand_rmsnorm(module, args, out)  # a layer the model writes by hand, by what it computes
            if got is not None:
                with torch._C.DisableTorchFunction():  # nothing of the capture's own is recorded
                    self._note(got, names.get(id(module)) or type(module).__name__, args[0])

        hooks = torch.nn.modules.module
        self._undo = [hooks.register_module_forward_pre_hook(pre), hooks.register_module_forward_hook(post)]
        self._mode = _mode_class()(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for h in self._undo:
            h.remove()
        self._undo, self._stack[:] = [], []

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        got = read_call(func, args, kwargs)
        if got is None:
            return
        if isinstance(got, OpCall) and got.kind in NORM_KINDS:
            caller = self._stack[-1][1] if self._stack else None
            if not routable_norm(caller):  # farm.apply routes the norms of torch's own norm modules only
                who = type(caller).__name__ if caller is not None else "no module"
                got = Skipped(got.kind, f"a norm computed by {who} (farm.apply routes the calls of nn.LayerNorm and "
                                        "nn.RMSNorm themselves)")
        self._note(got, self._stack[-1][0] if self._stack else "(no module)", args[0] if args else None)

    def _note(self, got: OpCall | Skipped, where: str, first: Any) -> None:
        """One call (of the module at ``where``): its problem counted, or why it is not taken."""
        site = site_pattern(where)
        if isinstance(got, Skipped):
            key = (got.kind, got.reason)
            old = self._skipped.get(key)
            sites = tuple(dict.fromkeys((*(old.sites if old else ()), site)))
            self._skipped[key] = SkippedCall(got.kind, got.reason, (old.count if old else 0) + 1, sites)
            return
        if not self._device:
            self._device = _device_of(first)
        seen = self._seen.setdefault(got.problem.key, _Seen(got.problem, got.kind))
        seen.count += 1
        seen.sites[site] = None
        seen.modes[_mode_now(first)] = None

    # -- timing ---------------------------------------------------------------------------------
    def time_step(self, step: Callable[[], Any], *, repeats: int = 7, coverage: bool = True) -> StepInfo:
        """Time the unmodified step (``step()`` runs it) on its device: the host's time to issue one step and
        its wall time (median of ``repeats`` after a warm-up), and each captured problem's direct library call
        alone: its share of the step; with ``coverage``, the step's time by kind of call (farm.nn.coverage: what
        share the farm's problems cover, and what the rest is)."""
        if not self._seen:
            raise UsageError("nothing captured yet: run the step inside 'with farm.capture(...)' first")
        if self._device == "meta":
            raise UsageError("a capture on the meta device has no times: capture on the device the model runs on")
        sync = _synchronizer(self._device)
        step()
        sync()
        hosts, walls = [], []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            hosts.append((t1 - t0) * 1e3)
            walls.append((t2 - t0) * 1e3)
        host, wall = statistics.median(hosts), statistics.median(walls)
        self._step = StepInfo(self.label, self._device, host, wall, bound_of(host, wall))
        self._times = _direct_call_times([s.problem for s in self._seen.values()], self._device)
        if coverage:
            try:
                self._coverage = step_coverage(step, self.label, self._device, self.model)
            except Exception as exc:  # a share is information; the capture stands without it
                log.warning("capture: no coverage of step %s: %s", self.label, exc)
        return self._step

    # -- results --------------------------------------------------------------------------------
    def workload(self, name: str | None = None) -> CapturedWorkload:
        step = self._step or StepInfo(self.label, self._device)
        problems = []
        for seen in self._seen.values():
            calls = max(1, round(seen.count / self.steps))
            ms = self._times.get(seen.problem.key)
            share = calls * ms / step.wall_ms if ms is not None and step.wall_ms else None
            modes = self.calls or tuple(m for m in CALL_MODES if m in seen.modes)
            problems.append(CapturedProblem(seen.problem, seen.kind, (Use(self.label, calls, ms, share),),
                                            tuple(seen.sites), modes))
        return CapturedWorkload(name or self.name, (step,), tuple(problems), tuple(self._skipped.values()),
                                (self._coverage,) if self._coverage is not None else ())

    def write(self, path: str, template: dict[str, Any] | None = None) -> Any:
        """Write this step's workload file (see CapturedWorkload.write)."""
        return self.workload().write(path, template)


def _mode_class() -> type:
    torch = torch_module()

    class _CaptureMode(torch.overrides.TorchFunctionMode):
        def __init__(self, capture: Capture) -> None:
            super().__init__()
            self.capture = capture

        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            self.capture._record(func, args, kwargs)
            out = func(*args, **kwargs)
            return _as_on_a_device(func, args, out)

    return _CaptureMode


def _as_on_a_device(func: Any, args: tuple[Any, ...], out: Any) -> Any:
    """A convolution's output on ``meta`` in the layout a GPU's (or the CPU's) kernel gives it: channels-last when
    its input or weight is (torch's suggest_memory_format); torch's meta kernel gives NCHW, and every convolution
    of a channels-last network after the first would be captured in another layout than on the device."""
    torch = torch_module()
    if func not in (torch.nn.functional.conv2d, torch.conv2d) or getattr(out, "device", None) is None \
            or out.device.type != "meta" or out.dim() != 4 or len(args) < 2:
        return out
    last = torch.channels_last
    if any(t.dim() == 4 and t.is_contiguous(memory_format=last) and not t.is_contiguous() for t in args[:2]):
        return out.contiguous(memory_format=last)
    return out


def _device_of(t: Any) -> str:
    d = getattr(t, "device", None)
    if d is None:
        return "cpu"
    return f"{d.type}:{d.index or 0}" if d.type not in ("cpu", "meta") else d.type


def _mode_now(t: Any) -> str:
    torch = torch_module()
    if getattr(getattr(t, "device", None), "type", "") == "cuda" and torch.cuda.is_current_stream_capturing():
        return "graph"
    return "eager"


def _synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        torch = torch_module()
        index = int(device.split(":")[1])
        return lambda: torch.cuda.synchronize(index)
    return lambda: None


def _direct_call_times(problems: Iterable[Problem], device: str) -> dict[str, float]:
    """Each problem's direct library call (its default engine's), ms a call of back-to-back calls over input sets
    that keep it out of the cache: what the step pays for it alone."""
    from farm.devices.arrays import make_tensors
    from farm.devices.device import eager_device
    from farm.devices.open import open_device
    from farm.model.engine import default_engine_registry, settings_to_resolved
    from farm.tuner.callers import direct_caller, estimate_ms, input_set_count, input_sets, plan_caller

    kind, _, index = device.partition(":")
    # the direct call runs on the caller's stream: its timer is of that stream (farm.devices.device.eager_device)
    dev, timer = eager_device(open_device("cpu" if kind == "cpu" else "cuda", int(index or 0)))
    registry = default_engine_registry()
    out: dict[str, float] = {}
    for problem in problems:
        try:
            found = registry.discover(problem, dev)
            if not found:
                continue
            engine = registry.get(found[0].engine_id)
            tensors = make_tensors(problem, dev.arrays, 0)
            sets = input_sets(problem, dev, tensors, input_set_count(problem, dev, cold_cache=True))
            caller = direct_caller(problem, engine, dev, sets)
            if caller is None:
                plan = engine.compile(problem, settings_to_resolved(engine, ()), dev)
                size = int(getattr(plan, "workspace_size", 0) or 0)
                caller = plan_caller(problem, dev, engine.name, plan, dev.runtime.malloc(size) if size else None, sets)
            caller.calls[0]()
            out[problem.key] = estimate_ms(timer, caller, calls=max(16, len(sets)))
        except Exception as exc:  # a time is information; the capture stands without it
            log.warning("capture: no time for %s: %s", problem.label(), exc)
    return out


def capture(model: Any = None, *, label: str = "step", calls: Sequence[str] | str | None = None, steps: int = 1,
            name: str | None = None) -> Capture:
    """``with farm.capture(model) as c: model(x)``: record the farm-tunable operations of the steps run in the
    block (see Capture)."""
    return Capture(model, label=label, calls=calls, steps=steps, name=name)
