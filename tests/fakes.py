"""Test doubles: call-counting fake engines and a scripted timer, on the real CPU runtime."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from farm.devices.arrays import NumpyArrays
from farm.devices.device import Device
from farm.model.engine import EngineRegistry, Support
from farm.model.knobs import Knob, KnobValue
from farm.model.problem import Problem
from farm.devices.runtimes.cpu import CpuRuntime


class ScriptedTimer:
    """Returns the next programmed time for each measurement (runs the function too)."""

    def __init__(self, times: Iterable[float] | Callable[[], float]) -> None:
        self._next = times if callable(times) else itertools.cycle(list(times)).__next__
        self.calls = 0

    def measure(self, fn: Callable[[], None]) -> float:
        fn()
        self.calls += 1
        return float(self._next())


# sim.gemm's 100 settings: the simulated workloads of the farm's tests and benchmarks (a problem of 100 candidates)
SIM_GEMM_SWEEP = {"block": [16, 32, 64, 128, 256], "stages": [1, 2, 3, 4, 5], "split_k": [1, 2, 4, 8]}


def fake_device(timer: Any = None) -> Device:
    runtime = CpuRuntime()
    from farm.devices.timing import HostTimer

    return Device(runtime, 0, runtime.properties(0), NumpyArrays(), timer or HostTimer())


@dataclass
class Calls:
    compile: list[dict[str, KnobValue]] = field(default_factory=list)
    run: int = 0
    finalize: int = 0
    closed: int = 0


class FakePlan:
    def __init__(self, engine: "FakeEngine", knobs: Mapping[str, KnobValue]) -> None:
        self.engine = engine
        self.knobs = dict(knobs)
        self.workspace_size = engine.actual_workspace(knobs)

    def finalize(self, workspace: Any) -> None:
        self.engine.calls.finalize += 1
        if self.engine.fail_at == "finalize":
            raise RuntimeError("cannot bind workspace")

    def run(self, tensors: Mapping[str, Any], workspace: Any, stream: Any) -> None:
        e = self.engine
        e.calls.run += 1
        if self.knobs.get("global.benchmarking"):
            e.primed_runs += 1
            if e.fail_at == "prime":
                raise RuntimeError("priming exploded")
            return
        if e.fail_at == "warmup" and e.calls.run == 1:
            raise RuntimeError("kernel launch failed")
        if e.fail_at == "run" and e.calls.run >= 3:
            raise RuntimeError("illegal memory access")
        # a correct matmul (optionally perturbed) so result checks have something to check
        out = tensors["A"] @ tensors["B"]
        if e.wrong:
            out = out + 1.0
        tensors["C"][...] = out

    def close(self) -> None:
        self.engine.calls.closed += 1


class FakeEngine:
    """A matmul engine whose failures, workspace and knobs are set by the test."""

    ops = frozenset({"matmul"})

    def __init__(self, name: str, *, knobs: tuple[Knob, ...] = (), exhaustive: bool = False,
                 fail_at: str = "", wrong: bool = False, estimate: int = 0, actual: int | None = None,
                 priority: int = 100, applicable: bool = True) -> None:
        self.name = name
        self.knobs = knobs
        self.supports_exhaustive = exhaustive
        self.fail_at = fail_at
        self.wrong = wrong
        self.estimate = estimate
        self.actual = estimate if actual is None else actual
        self.priority = priority
        self._applicable = applicable
        self.calls = Calls()
        self.primed_runs = 0

    def applicable(self, problem: Problem, device: Device) -> Support:
        return Support.yes() if self._applicable else Support.no("fake says no")

    def estimate_workspace(self, problem: Problem, knobs: Mapping[str, KnobValue]) -> int:
        return int(self.estimate) + int(knobs.get("extra", 0) or 0)

    def actual_workspace(self, knobs: Mapping[str, KnobValue]) -> int:
        return int(self.actual) + int(knobs.get("extra", 0) or 0)

    def compile(self, problem: Problem, knobs: Mapping[str, KnobValue], device: Device) -> FakePlan:
        self.calls.compile.append(dict(knobs))
        if self.fail_at == "compile":
            raise ValueError("unsupported tile")
        if self.fail_at == "prime_compile" and knobs.get("global.benchmarking"):
            raise ValueError("cannot build priming plan")
        return FakePlan(self, knobs)


def matmul_problem(m: int = 8, n: int = 6, k: int = 5) -> Problem:
    return Problem.create("matmul", {"A": [m, k], "B": [k, n]})


def registry_of(*engines: Any) -> EngineRegistry:
    return EngineRegistry(engines)


TILE = Knob.int("tile", 64, choices=(16, 32, 64, 128))
SPLIT = Knob.int("split_k", 1, min=1, max=16)
ALPHA = Knob.float("alpha", 1.0, min=0.0, max=2.0)
MODE = Knob.str("mode", "fast", choices=("fast", "exact"))
EXTRA = Knob.int("extra", 0, min=0, max=1 << 40, doc="extra workspace bytes (tests)")


def tensors_for(problem: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    from farm.devices.arrays import make_tensors

    return make_tensors(problem, NumpyArrays(), seed)


# -- synthetic results -----------------------------------------------------------------------
def fake_props(name: str = "Fake GPU", arch: str = "sm_90", units: int = 132, index: int = 0, driver: str = "580.1"):
    from farm.devices.properties import DeviceProperties

    return DeviceProperties(vendor="nvidia", name=name, arch=arch, compute_units=units, total_memory=141 * 2**30,
                            l2_bytes=60 * 2**20, clock_mhz=1980, warp_size=32, driver_version=driver,
                            runtime_version="13.0", libraries=(("torch", "2.11.0"),), index=index, host="test-host")


def fake_result(problem: Problem, engine: str, samples=(1.0, 1.0, 1.0), *, knobs=(), candidate: int = 0,
                disposition=None, strategy: str = "run_until_stable", started_at: str = "2026-11-30T00:00:00.000Z"):
    """An AutotuneResult with the given samples (statistics computed from them)."""
    from farm.model.records import AutotuneResult, Disposition, TuneMode
    from farm.model.ids import engine_name_to_id
    from farm.model.measurement import Strategy, summarize

    disposition = disposition or Disposition.SUCCEEDED
    ok = disposition is Disposition.SUCCEEDED
    st = summarize(list(samples) if ok else [])
    return AutotuneResult(
        problem_key=problem.key, engine_id=engine_name_to_id(engine), engine_name=engine, knobs=tuple(knobs),
        disposition=disposition, mode=TuneMode.STANDARD, strategy=Strategy(strategy), candidate=candidate,
        error="" if ok else "boom", min_ms=st.min, avg_ms=st.mean, stddev_ms=st.stddev, median_ms=st.median,
        mad_ms=st.mad, samples=tuple(samples) if ok else (), iterations=len(samples) if ok else 0,
        converged=ok, workspace_size=0, estimated_workspace=0, started_at=started_at,
    )


def write_results(root, rows_by_device, *, job_id="job1", round="main", flush_rows=1000, call="",
                  session_size=None):
    """Write rows: rows_by_device = {DeviceProperties: [(problem, name, [AutotuneResult...]), ...]}.
    ``round="confirm"`` writes each problem's results as one confirmation stage (``call``: its calling mode;
    ``session_size`` defaults to the rows given)."""
    from farm.store.results import MeasurementContext, ResultWriter, RunContext, result_row

    run = RunContext(job_id=job_id, workload_name="synthetic")
    with ResultWriter(root, run.run_id, flush_rows=flush_rows) as w:
        for props, problems in rows_by_device.items():
            for problem, name, results in problems:
                size = (session_size or len(results)) if round == "confirm" else None
                where = MeasurementContext(props, round=round, call=call or ("eager" if round == "confirm" else ""),
                                           session_size=size)
                w.append(result_row(r, problem, name, run, where) for r in results)
    return run


def gpu_like_device(units: int = 132) -> Device:
    """A CPU device with a GPU's properties: what a GPU engine's discovery and plan listing read, without a GPU."""
    cpu = fake_device()
    return Device(cpu.runtime, 0, fake_props(units=units), cpu.arrays, cpu.timer)


def gpu_engine_without_a_gpu(monkeypatch: Any, name: str) -> Any:
    """The registered GPU engine ``name``, with torch and triton looked for as present (their absence is each
    engine's first reason otherwise): its rules checked on the CPU."""
    import sys
    import types

    import engines.gpu._common as common
    from farm.model.engine import default_engine_registry

    monkeypatch.setattr(common, "torch_or_reason", lambda: (object(), ""))
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton") or types.ModuleType("triton"))
    return default_engine_registry().get(name)


def tune_in_process(out: Any, problems: Iterable[Any], device: Device, config: Any, registry: EngineRegistry,
                    **kwargs: Any) -> Any:
    """``problems`` (WorkloadProblems, indexed in order) tuned by farm tune --in-process's executor
    (farm.fleet.local_run.run_local) into the folder ``out``: its report (``outcomes``, ``summary``)."""
    import dataclasses as dc

    from farm.fleet.local_run import run_local
    from farm.model.workload import Workload

    wps = tuple(dc.replace(wp, index=i) for i, wp in enumerate(problems))
    return run_local(Workload("test", "tests", wps, config), out, device, registry, **kwargs)
