"""Simulated devices: test the farm at scale on a CPU machine.

A simulated device has a configurable model name (so a signature), a speed, a
virtual clock, and runs the ``sim.*`` engines (engines/sim.py), whose timings
come from a deterministic cost model plus noise. Nothing is computed; time is
slept only when ``sleep`` asks for it (a fraction of the simulated time), so
scheduling can be studied with real wall time or none. Faults can be injected
per candidate: ``crash`` ends the worker process (as kill -9 or a segfault
would), ``hang`` blocks forever.

    devices:
      - {name: Sim A100, count: 4, speed: 1.0}
      - {name: Sim H200, count: 4, speed: 2.0}
    noise: 0.02
    sleep: 0.0
    faults:
      - {kind: crash, engine: sim.gemm, knobs: {block: 64}}
      - {kind: hang, engine: sim.vendor, knobs: {algo: 3}, problem: 1f0c2a3b4d5e6f70}
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from .device import Device, DeviceProperties
from .errors import InputError
from .problem import Problem, TensorDesc
from .timing import EventTimer


@dataclass(frozen=True)
class SimGroup:
    name: str
    count: int = 1
    speed: float = 1.0
    compute_units: int = 100


@dataclass(frozen=True)
class SimFault:
    kind: str  # "crash" | "hang"
    engine: str
    knobs: tuple[tuple[str, Any], ...] = ()
    problem: str = ""  # problem key (see farm tune --dry-run); "" = any problem

    def matches(self, engine: str, knobs: Mapping[str, Any], problem_key: str) -> bool:
        return (engine == self.engine and all(knobs.get(k) == v for k, v in self.knobs)
                and (not self.problem or self.problem == problem_key))


@dataclass(frozen=True)
class SimConfig:
    groups: tuple[SimGroup, ...] = (SimGroup("Sim GPU", 1),)
    noise: float = 0.02
    sleep: float = 0.0
    faults: tuple[SimFault, ...] = ()
    source: str = ""

    @property
    def device_count(self) -> int:
        return sum(g.count for g in self.groups)

    def slots(self) -> list[tuple[SimGroup, int]]:
        """(group, index within the group) for every simulated device."""
        return [(g, i) for g in self.groups for i in range(g.count)]

    @staticmethod
    def parse(data: Any, source: str = "<sim>") -> "SimConfig":
        def bad(msg: str, fld: str, value: Any) -> InputError:
            return InputError(msg, field=fld, value=value, source=source)

        if not isinstance(data, Mapping):
            raise bad("expected a mapping with devices", "", data)
        groups = []
        for i, g in enumerate(data.get("devices") or [{"name": "Sim GPU", "count": 1}]):
            if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
                raise bad("expected {name, count, speed}", f"devices[{i}]", g)
            count, speed = g.get("count", 1), g.get("speed", 1.0)
            if not isinstance(count, int) or count < 1:
                raise bad("must be an integer >= 1", f"devices[{i}].count", count)
            if not isinstance(speed, (int, float)) or speed <= 0:
                raise bad("must be > 0", f"devices[{i}].speed", speed)
            groups.append(SimGroup(g["name"], count, float(speed), int(g.get("compute_units", 100))))
        faults = []
        for i, f in enumerate(data.get("faults") or []):
            if not isinstance(f, Mapping) or f.get("kind") not in ("crash", "hang") or not isinstance(f.get("engine"), str):
                raise bad("expected {kind: crash|hang, engine, knobs, problem}", f"faults[{i}]", f)
            faults.append(SimFault(f["kind"], f["engine"], tuple(sorted((f.get("knobs") or {}).items())), f.get("problem", "")))
        noise, sleep = data.get("noise", 0.02), data.get("sleep", 0.0)
        for name, v in (("noise", noise), ("sleep", sleep)):
            if not isinstance(v, (int, float)) or v < 0:
                raise bad("must be a number >= 0", name, v)
        return SimConfig(tuple(groups), float(noise), float(sleep), tuple(faults), source)

    @staticmethod
    def load(path: str | Path) -> "SimConfig":
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError("simulation config not found", source=str(path)) from None
        except yaml.YAMLError as exc:
            raise InputError(f"not valid YAML: {exc}", source=str(path)) from None
        return SimConfig.parse(data, str(path))


@dataclass
class SimEvent:
    t: float = 0.0


class SimRuntime:
    """A runtime with a virtual clock (ms) that sim plans advance; memory is not allocated."""

    name = "sim"

    def __init__(self, props: DeviceProperties) -> None:
        self._props = props
        self.clock_ms = 0.0

    def device_count(self) -> int:
        return 1

    def properties(self, index: int = 0) -> DeviceProperties:
        return self._props

    def set_device(self, index: int) -> None:
        pass

    def create_stream(self) -> None:
        return None

    def destroy_stream(self, stream: Any) -> None:
        pass

    def create_event(self) -> SimEvent:
        return SimEvent()

    def destroy_event(self, event: Any) -> None:
        pass

    def record_event(self, event: SimEvent, stream: Any) -> None:
        event.t = self.clock_ms

    def synchronize_event(self, event: Any) -> None:
        pass

    def elapsed_ms(self, start: SimEvent, end: SimEvent) -> float:
        return end.t - start.t

    def synchronize(self) -> None:
        pass

    def malloc(self, nbytes: int) -> int:
        return int(nbytes)  # a handle; simulated workspaces hold nothing

    def free(self, ptr: Any) -> None:
        pass

    def memset(self, ptr: Any, value: int, nbytes: int) -> None:
        pass

    def flush_l2(self, stream: Any) -> None:
        self.clock_ms += 0.001


@dataclass(frozen=True)
class SimTensor:
    """A tensor that has a shape and nothing else."""

    shape: tuple[int, ...]
    dtype: str


class SimArrays:
    name = "sim"

    def empty(self, desc: TensorDesc) -> SimTensor:
        return SimTensor(desc.dims, desc.dtype)

    def from_numpy(self, data: np.ndarray, desc: TensorDesc) -> SimTensor:
        return self.empty(desc)

    def fill(self, tensor: Any, value: float) -> None:
        pass

    def to_numpy(self, tensor: Any) -> np.ndarray:
        return np.zeros(tensor.shape)

    def make(self, problem: Problem, seed: int = 0) -> dict[str, SimTensor]:
        return {t.id: SimTensor(t.dims, t.dtype) for t in problem.tensors}


def sim_properties(group: SimGroup, index: int) -> DeviceProperties:
    return DeviceProperties(
        vendor="sim", name=group.name, arch="sim", compute_units=group.compute_units,
        total_memory=80 * 2**30, l2_bytes=50 * 2**20, clock_mhz=1000, warp_size=32,
        driver_version="1.0", runtime_version="1.0", libraries=(("simlib", "1.0"),),
        index=index, uuid=hashlib.sha256(f"{group.name}/{index}".encode()).hexdigest()[:32],
        host=socket.gethostname(),
    )


def sim_device(config: SimConfig, group: SimGroup, index: int) -> Device:
    props = sim_properties(group, index)
    runtime = SimRuntime(props)
    device = Device(runtime, index, props, SimArrays(), EventTimer(runtime, None))
    device.checks_numerics = False
    device.extras["sim"] = config
    device.extras["sim_group"] = group
    return device


def unit_hash(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64
