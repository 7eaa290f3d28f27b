"""Simulated devices: test the farm at scale on a CPU machine.

A simulated device has a configurable model name (so a signature), a speed, a
virtual clock, and runs the ``sim.*`` engines (engines/sim.py), whose timings
come from a deterministic cost model plus noise. Nothing is computed; time is
slept only when ``sleep`` asks for it (a fraction of the simulated time), so
scheduling can be studied with real wall time or none. Faults can be injected
per candidate: ``crash`` ends the worker process (as kill -9 or a segfault
would), ``hang`` blocks forever, ``slow_replay`` makes a plan that a replaying
process compiles (farm.ops, farm verify) ``factor`` times slower than the one
the farm measured (a decision that does not hold where it is replayed), and
``hang_replay`` one that blocks forever only there (a winner that hangs where
it is replayed).

    devices:
      - {name: Sim A100, count: 4, speed: 1.0}
      - {name: Sim H200, count: 4, speed: 2.0}
    noise: 0.02
    sleep: 0.0
    faults:
      - {kind: crash, engine: sim.gemm, knobs: {block: 64}}
      - {kind: hang, engine: sim.vendor, knobs: {algo: 3}, problem: 1f0c2a3b4d5e6f70}
      - {kind: slow_replay, engine: sim.gemm, knobs: {block: 128}, factor: 1.5}
    compile: {ms: 40, build_ms: 5, setup_ms: 20, cache: host}

``compile`` models what a GPU worker pays before it measures (wall time, not scaled by ``sleep``): ``ms`` per
kernel compiled, for the JIT engine (sim.gemm), whose kernels are specialised by knobs and dtype, not by shape
(as Triton's are), so problems of one dtype share them; ``build_ms`` per plan built, every time (a library plan
such as cuDNN's, or loading a kernel into the context); ``setup_ms`` per problem a worker builds plans for
the first time (a library's plan list, as cuDNN's graph and heuristics); ``cache``: ``host`` keeps compiled
kernels in one folder every worker of the host reads (Triton's cache directory; a load costs 5 % of a
compile), ``worker`` in each worker's memory (a cache directory per worker).
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from farm.devices.device import Device
from farm.devices.properties import DeviceProperties
from farm.devices.runtimes.cpu import HostRuntime
from farm.devices.timing import EventTimer
from farm.errors import InputError
from farm.model.problem import Problem, TensorDesc


FAULT_KINDS = ("crash", "hang", "slow_replay", "hang_replay")


@dataclass(frozen=True)
class SimGroup:
    name: str
    count: int = 1
    speed: float = 1.0
    compute_units: int = 100


@dataclass(frozen=True)
class SimFault:
    kind: str  # "crash" | "hang" | "slow_replay" | "hang_replay"
    engine: str
    knobs: tuple[tuple[str, Any], ...] = ()
    problem: str = ""  # problem key (see farm tune --dry-run); "" = any problem
    factor: float = 1.0  # slow_replay: how much slower a plan a replaying process compiles runs

    def matches(self, engine: str, knobs: Mapping[str, Any], problem_key: str) -> bool:
        return (engine == self.engine and all(knobs.get(k) == v for k, v in self.knobs)
                and (not self.problem or self.problem == problem_key))


@dataclass(frozen=True)
class SimCompile:
    """The cost of compiles and plan setup on simulated devices (see the module's text)."""

    ms: float = 0.0
    setup_ms: float = 0.0
    cache: str = "host"  # "host" | "worker"
    build_ms: float = 0.0
    cache_dir: str = ""  # the host cache's folder (made when the config is read)

    LOAD_SHARE = 0.05  # a cache hit's cost, of a compile's

    @property
    def active(self) -> bool:
        return self.ms > 0 or self.setup_ms > 0 or self.build_ms > 0


@dataclass(frozen=True)
class SimConfig:
    groups: tuple[SimGroup, ...] = (SimGroup("Sim GPU", 1),)
    noise: float = 0.02
    sleep: float = 0.0
    faults: tuple[SimFault, ...] = ()
    source: str = ""
    compile: SimCompile = SimCompile()

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
        if not isinstance(data.get("devices") or [], list):
            raise bad("expected a list of {name, count, speed}", "devices", data.get("devices"))
        for i, g in enumerate(data.get("devices") or [{"name": "Sim GPU", "count": 1}]):
            if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
                raise bad("expected {name, count, speed}", f"devices[{i}]", g)
            count, speed = g.get("count", 1), g.get("speed", 1.0)
            if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 4096:
                raise bad("must be an integer from 1 to 4096", f"devices[{i}].count", count)
            if not isinstance(speed, (int, float)) or isinstance(speed, bool) or not 0 < speed < float("inf"):
                raise bad("must be a finite number > 0", f"devices[{i}].speed", speed)
            units = g.get("compute_units", 100)
            if not isinstance(units, int) or isinstance(units, bool) or not 1 <= units <= 1_000_000:
                raise bad("must be an integer from 1 to 1000000", f"devices[{i}].compute_units", units)
            groups.append(SimGroup(g["name"], count, float(speed), units))
        if not isinstance(data.get("faults") or [], list):
            raise bad("expected a list of faults", "faults", data.get("faults"))
        faults = []
        for i, f in enumerate(data.get("faults") or []):
            if not isinstance(f, Mapping) or f.get("kind") not in FAULT_KINDS or not isinstance(f.get("engine"), str) \
                    or not isinstance(f.get("knobs") or {}, Mapping) or not isinstance(f.get("problem", ""), str):
                raise bad("expected {kind: crash|hang|slow_replay|hang_replay, engine, knobs: {...}, problem: KEY, "
                          "factor: X}",
                          f"faults[{i}]", f)
            factor = f.get("factor", 1.0)
            if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor < float("inf"):
                raise bad("must be a finite number > 0", f"faults[{i}].factor", factor)
            faults.append(SimFault(f["kind"], f["engine"], tuple(sorted((f.get("knobs") or {}).items())),
                                   f.get("problem", ""), float(factor)))
        noise, sleep = data.get("noise", 0.02), data.get("sleep", 0.0)
        for name, v in (("noise", noise), ("sleep", sleep)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
                raise bad("must be a finite number >= 0", name, v)
        return SimConfig(tuple(groups), float(noise), float(sleep), tuple(faults), source,
                         _parse_compile(data.get("compile"), bad))

    @staticmethod
    def load(path: str | Path) -> "SimConfig":
        from farm.fsutil import read_text_file

        text = read_text_file(path, "simulation config")
        try:
            data = yaml.safe_load(text)
        except RecursionError:
            raise InputError("not valid here: nested too deeply", source=str(path)) from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise InputError(f"not valid YAML: {getattr(exc, 'problem', None) or exc}", source=where) from None
        return SimConfig.parse(data, str(path))


def _parse_compile(data: Any, bad: Any) -> SimCompile:
    if data is None:
        return SimCompile()
    if not isinstance(data, Mapping) or set(data) - {"ms", "build_ms", "setup_ms", "cache", "cache_dir"}:
        raise bad("expected {ms, build_ms, setup_ms, cache: host|worker, cache_dir}", "compile", data)
    values = {}
    for name in ("ms", "build_ms", "setup_ms"):
        v = data.get(name, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 600_000:
            raise bad("must be a number of milliseconds from 0 to 600000", f"compile.{name}", v)
        values[name] = float(v)
    cache = data.get("cache", "host")
    if cache not in ("host", "worker"):
        raise bad("must be host or worker", "compile.cache", cache)
    folder = data.get("cache_dir", "")
    if not isinstance(folder, str):
        raise bad("expected a folder", "compile.cache_dir", folder)
    if cache == "host" and values["ms"] > 0 and not folder:
        import tempfile

        folder = tempfile.mkdtemp(prefix="tunefarm-sim-kernels-")  # cold for this config, shared by its workers
    return SimCompile(ms=values["ms"], setup_ms=values["setup_ms"], cache=cache, cache_dir=folder,
                      build_ms=values["build_ms"])


@dataclass
class SimEvent:
    t: float = 0.0


class SimRuntime(HostRuntime):
    """A runtime with a virtual clock (ms) that sim plans advance; memory is not allocated."""

    name = "sim"

    def __init__(self, props: DeviceProperties) -> None:
        self._props = props
        self.clock_ms = 0.0
        self.kernels: set[str] = set()  # kernels this worker compiled or loaded
        self.set_up: set[str] = set()  # problems whose plans this worker has set up

    def properties(self, index: int = 0) -> DeviceProperties:
        return self._props

    def create_event(self) -> SimEvent:
        return SimEvent()

    def record_event(self, event: SimEvent, stream: Any) -> None:
        event.t = self.clock_ms

    def elapsed_ms(self, start: SimEvent, end: SimEvent) -> float:
        return end.t - start.t

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
    """A tensor that has a shape and nothing else (and torch's two layout methods a per-call key reads)."""

    shape: tuple[int, ...]
    dtype: str

    def stride(self) -> tuple[int, ...]:
        found = self.__dict__.get("_strides")  # kept beside the fields: a per-call key reads it every call
        if found is None:
            from farm.model.problem import contiguous_strides

            found = self.__dict__["_strides"] = contiguous_strides(self.shape)
        return found

    def get_device(self) -> int:
        return 0


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

    def make(self, problem: Problem, seed: int = 0, *, poison: float = float("nan")) -> dict[str, SimTensor]:
        """Shapes only: a simulated device holds no values (nothing to draw or poison)."""
        return {t.id: SimTensor(t.dims, t.dtype) for t in problem.tensors}

    def clone(self, tensor: SimTensor) -> SimTensor:
        return SimTensor(tensor.shape, tensor.dtype)


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
    return Device(runtime, index, props, SimArrays(), EventTimer(runtime, None), checks_numerics=False,
                  extras={"sim": config, "sim_group": group})


def unit_hash(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64
