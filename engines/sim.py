"""Simulated engines for simulated devices (farm.devices.sim): a cost model, noise, and injected faults.

They apply only to devices of vendor "sim", compute nothing, and advance the
device's virtual clock by the modelled time of each run.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from typing import Any, Mapping

import numpy as np

from farm.plugin import DirectCall, Device, Knob, KnobValue, Problem, Support, unit_hash

PEAK_FLOPS = 100e12  # a speed-1 simulated device
PEAK_BYTES = 2e12
LAUNCH_MS = 0.005


class SimPlan:
    def __init__(self, engine: str, problem: Problem, knobs: Mapping[str, KnobValue], device: Device,
                 workspace: int) -> None:
        cfg, group = device.extras["sim"], device.extras["sim_group"]
        self.runtime = device.runtime
        self.workspace_size = workspace
        self.priming = bool(knobs.get("global.benchmarking", 0))
        self.sleep = cfg.sleep
        self.noise = cfg.noise
        clean = {k: v for k, v in knobs.items() if k != "global.benchmarking"}
        key = (engine, sorted(clean.items()), problem.key)
        # mostly a property of the candidate, partly of the device model: signatures may disagree
        efficiency = 0.2 + 0.8 * (0.75 * unit_hash(*key) + 0.25 * unit_hash(*key, group.name))
        work = problem.flops / PEAK_FLOPS if problem.flops else sum(t.nbytes for t in problem.tensors) / PEAK_BYTES
        self.base_ms = work * 1e3 / (group.speed * efficiency) + LAUNCH_MS
        self.rng = np.random.default_rng(int(unit_hash(*key, group.name, "noise") * 2**32))
        fault = next((f for f in cfg.faults if f.matches(engine, clean, problem.key)), None)
        self.fault = fault.kind if fault is not None else ""
        if self.fault == "hang_replay" and device.extras.get("replay"):
            self.fault = "hang"  # compiled by a replaying process: it hangs there, and only there
        if self.fault == "slow_replay" and device.extras.get("replay"):
            # compiled by a replaying process (farm.ops, farm verify): slower than what was measured
            self.base_ms *= fault.factor

    def run(self, tensors: Mapping[str, Any], workspace: Any, stream: Any) -> None:
        if self.fault == "crash":
            os._exit(137)  # the worker dies as it would of SIGKILL or a segfault
        if self.fault == "hang":
            while True:
                time.sleep(3600)
        cost = 0.01 if self.priming else self.base_ms * math.exp(self.noise * self.rng.standard_normal())
        self.runtime.clock_ms += cost
        if self.sleep > 0:
            time.sleep(cost * self.sleep / 1e3)

    def call(self, *tensors: Any) -> None:
        """The plan as a library function of the inputs (a simulated direct call)."""
        self.run({}, None, None)


class SimEngine:
    ops: frozenset[str] = frozenset()
    knobs: tuple[Knob, ...] = ()
    supports_exhaustive = False
    priority = 100
    name = ""
    jit = False  # compiles a kernel per knob setting (sim.gemm), rather than picking a library's algorithm

    def applicable(self, problem: Problem, device: Device) -> Support:
        if device.vendor != "sim":
            return Support.no("runs on simulated devices only")
        return Support.yes()

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        return int(1024 * sum(v for v in knobs.values() if isinstance(v, int) and not isinstance(v, bool)))

    def compile(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> SimPlan:
        cost = device.extras["sim"].compile
        if cost.active:
            _pay_compile(self, problem, knobs, device, cost)
        return SimPlan(self.name, problem, knobs, device, self.estimate_workspace(problem, knobs))

    def compile_key(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> str | None:
        """The kernel a JIT engine compiles (knobs and dtype: shared by every shape), when workers share a cache."""
        cost = device.extras["sim"].compile
        if not self.jit or cost.ms <= 0 or cost.cache != "host":
            return None
        return _kernel_key(self.name, problem, knobs)


def _kernel_key(engine: str, problem: Problem, knobs: Mapping[str, KnobValue]) -> str:
    clean = sorted((k, v) for k, v in knobs.items() if k != "global.benchmarking")
    dtypes = sorted({t.dtype for t in problem.tensors})
    return hashlib.sha1(repr((engine, problem.op, dtypes, clean)).encode()).hexdigest()[:20]


def _pay_compile(engine: "SimEngine", problem: Problem, knobs: Mapping[str, KnobValue], device: Device,
                 cost: Any) -> None:
    """Sleep what this compile costs here: the problem's plan setup the first time this worker sees it, the plan's
    build, and a JIT kernel's compile (or its load from the host's cache)."""
    rt = device.runtime
    if cost.setup_ms and problem.key not in rt.set_up:
        rt.set_up.add(problem.key)
        time.sleep(cost.setup_ms / 1e3)
    if cost.build_ms:
        time.sleep(cost.build_ms / 1e3)
    if not engine.jit or cost.ms <= 0:
        return
    key = _kernel_key(engine.name, problem, knobs)
    if key in rt.kernels:  # loaded in this process already: free, as a JIT's in-memory cache is
        return
    rt.kernels.add(key)
    if cost.cache == "worker":
        time.sleep(cost.ms / 1e3)
        return
    path = os.path.join(cost.cache_dir, key)
    if os.path.exists(path):
        time.sleep(cost.ms * cost.LOAD_SHARE / 1e3)
        return
    time.sleep(cost.ms / 1e3)
    os.makedirs(cost.cache_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(engine.name)
    os.replace(tmp, path)  # whole or absent: a reader never sees half a kernel


class SimVendor(SimEngine):
    """The vendor library: serves every op; one knob picks among its algorithms."""

    name = "sim.vendor"
    ops = frozenset({"matmul", "conv_fprop", "sdpa_fwd", "layernorm", "rmsnorm", "batchnorm_inference", "pointwise"})
    priority = 10
    knobs = (Knob.int("algo", 0, min=0, max=15, doc="algorithm index"),)

    def direct_call(self, problem: Problem, device: Device) -> DirectCall:
        """The simulated library's own call with its default algorithm: what a caller without the farm makes."""
        plan = SimPlan(self.name, problem, {"algo": 0}, device, 0)
        return DirectCall(plan.call, problem.input_ids, label="sim.vendor's own call")


class SimGemm(SimEngine):
    """A JIT GEMM with a tile search space (5 x 5 x 4 = 100 configurations)."""

    name = "sim.gemm"
    ops = frozenset({"matmul"})
    priority = 50
    supports_exhaustive = True
    jit = True
    knobs = (
        Knob.int("block", 64, choices=(16, 32, 64, 128, 256)),
        Knob.int("stages", 3, choices=(1, 2, 3, 4, 5)),
        Knob.int("split_k", 1, choices=(1, 2, 4, 8)),
    )


class SimConv(SimEngine):
    name = "sim.conv"
    ops = frozenset({"conv_fprop"})
    priority = 40
    knobs = (
        Knob.int("tile", 64, choices=(32, 64, 128)),
        Knob.str("layout", "nchw", choices=("nchw", "nhwc")),
    )


ENGINES = (SimVendor(), SimGemm(), SimConv())
