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
import threading
from typing import Any, Callable

from farm.devices.device import Device
from farm.devices.open import open_device
from farm.dispatch.binding import Bound
from farm.dispatch.calls import OpCalls
from farm.dispatch.frameworks import Placement
from farm.model.problem import Problem
from farm.replay.tunable_runtime import TunableRuntime
from farm.replay.tunable_settings import TunableSettings, parse_budget_ms, parse_budget_samples

__all__ = ["matmul", "sdpa", "conv2d", "layernorm", "rmsnorm", "bind_matmul", "bind_conv2d", "bind_sdpa",
           "enable", "disable", "is_enabled", "tuning_enable", "tuning_disable", "tuning_is_enabled",
           "record_untuned_enable", "record_untuned_disable", "record_untuned_is_enabled", "set_verbose",
           "set_max_tuning_duration", "get_max_tuning_duration", "set_max_tuning_samples", "get_max_tuning_samples",
           "set_filename", "get_filename", "read_file", "write_file", "get_results", "runtime", "choices", "reset"]


class RuntimeRegistry:
    """One TunableRuntime per (runtime kind, device index), created on first use, with shared setting changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtimes: dict[tuple[str, int], TunableRuntime] = {}
        self._changes: dict[str, Any] = {}
        self.on_change: list[Callable[[], None]] = []  # called when cached choices must be made again

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
            for forget in self.on_change:
                forget()

    def runtimes(self) -> list[TunableRuntime]:
        return list(self._runtimes.values())

    def reset(self) -> None:
        with self._lock:
            self._runtimes.clear()
            self._changes.clear()
            for forget in self.on_change:
                forget()


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
    RUNTIMES.configure(max_tuning_duration_ms=parse_budget_ms(str(ms)))


def get_max_tuning_duration() -> float:
    return RUNTIMES.settings().max_tuning_duration_ms


def set_max_tuning_samples(samples: int) -> None:
    """Per candidate; 0 turns the sample limit off."""
    RUNTIMES.configure(max_tuning_samples=parse_budget_samples(str(samples)))


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


# -- the per-call path -------------------------------------------------------------------------
def _bind(problem: Problem, where: Placement) -> tuple[Bound, Bound | None, Callable[[], bool] | None]:
    """farm.ops' binder: the device's replay runtime chooses (recorded winners, the selection policies), and
    a separate graph decision is bound beside it where a file records one."""
    return RUNTIMES.get(where.kind, where.index).bind_for_ops(problem)


CALLS = OpCalls(_bind)
RUNTIMES.on_change.append(CALLS.clear)

# the ops (bound methods of CALLS: a call is the lookup and the library call)
matmul = CALLS.matmul
sdpa = CALLS.sdpa
conv2d = CALLS.conv2d
layernorm = CALLS.layernorm
rmsnorm = CALLS.rmsnorm
bind_matmul = CALLS.bind_matmul
bind_conv2d = CALLS.bind_conv2d
bind_sdpa = CALLS.bind_sdpa
