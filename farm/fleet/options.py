"""What a farm run is asked for: which devices (DeviceRequest) and how to run (FarmOptions, validated)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

from farm.devices.sim import SimConfig
from farm.errors import InputError


@dataclass(frozen=True)
class DeviceRequest:
    """Which device workers to start: ``auto``, ``gpu``, ``cpu[:N]``, ``sim:N`` or ``sim:FILE.yaml``."""

    kind: str = "auto"
    count: int | None = None
    sim: SimConfig | None = None

    @staticmethod
    def parse(text: str) -> "DeviceRequest":
        kind, _, arg = str(text).partition(":")
        if kind in ("auto", "gpu") and not arg:
            return DeviceRequest(kind)
        if kind == "cpu":
            return DeviceRequest("cpu", _count(arg or "1", text))
        if kind == "sim":
            if not arg:
                return DeviceRequest("sim", 1, SimConfig())
            if arg.isdigit():
                n = _count(arg, text)
                return DeviceRequest("sim", n, SimConfig.parse({"devices": [{"name": "Sim GPU", "count": n}]}))
            cfg = SimConfig.load(arg)
            return DeviceRequest("sim", cfg.device_count, cfg)
        raise InputError("expected auto, gpu, cpu[:N], sim:N or sim:FILE.yaml", field="--devices", value=text)


def _count(arg: str, text: str) -> int:
    if not arg.isdigit() or int(arg) < 1:
        raise InputError("the device count must be an integer >= 1", field="--devices", value=text)
    return int(arg)


@dataclass(frozen=True)
class FarmOptions:
    """How a farm run goes. Every value is checked when the options are made (InputError naming it)."""

    shard_size: int = 128  # a problem with more candidates is split across devices, then has a finalist round
    finalist_k: int = 3  # finalists per session
    candidate_timeout_s: float = 120.0  # a worker silent this long on a task is restarted
    max_strikes: int = 2  # a candidate that kills its worker this often is quarantined
    stream_interval_s: float = 0.02  # a worker sends what it has at least this often
    startup_timeout_s: float = 300.0  # workers must start (and a task must begin) within this
    cpu_threads: int | None = None  # BLAS threads of a CPU worker (None: what production uses, see run_farm)
    progress_interval_s: float = 0.5  # between progress callbacks
    reduce: bool = True  # write the override files at the end
    top_k: int = 3  # ranked candidates per override entry
    keep_results: bool = False  # keep every AutotuneResult in the report (the CLI's tables)
    incumbents: str | None = None  # an override file or published root whose winners are kept within noise
    # a problem the incumbents already decide is only checked: its winner and the default measured, nothing else
    check_decided: bool = False
    log_level: int = logging.WARNING  # what the workers log of farm.* (INFO: the tuner's autotune: lines)
    # after the reduce: ``verifier(device, override file text, problem keys)`` runs on a worker of each signature
    # and returns rows to record and decisions' records (farm.replay.verify.verify_for_job); None: no check
    verifier: Callable[..., Any] | None = None
    # a fleet that comes and goes (farm.fleet.on_ray.nodes): how often the driver lists the cluster's nodes (to start
    # workers on nodes that join and to notice lost ones); how long a signature with work left and no device
    # waits for a node of its kind before the job finishes without it; at most this many device workers
    node_poll_s: float = 2.0
    node_grace_s: float = 30.0  # a worker that died on a node still listed alive: how long its node has to be listed
    # dead (a node loss, charging nobody) before the loss counts as the worker's crash (Ray lists a dead node in
    # about 15-30 s with its default health checks; a worker restarted on its node answers in seconds)
    device_wait_s: float = 300.0
    max_devices: int | None = None

    def __post_init__(self) -> None:
        for name in ("shard_size", "finalist_k", "max_strikes", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError("must be an integer >= 1", field=name, value=value)
        for name in ("candidate_timeout_s", "stream_interval_s", "startup_timeout_s", "progress_interval_s",
                     "node_poll_s", "node_grace_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise InputError("must be a positive, finite number of seconds", field=name, value=value)
        wait = self.device_wait_s
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
            raise InputError("must be a finite number of seconds >= 0", field="device_wait_s", value=wait)
        cap = self.max_devices
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise InputError("must be an integer >= 1 (or None)", field="max_devices", value=cap)
        if isinstance(self.log_level, bool) or not isinstance(self.log_level, int):
            raise InputError("must be a logging level (an integer)", field="log_level", value=self.log_level)
        if self.cpu_threads is not None and (isinstance(self.cpu_threads, bool) or not isinstance(self.cpu_threads, int)
                                             or self.cpu_threads < 1):
            raise InputError("must be an integer >= 1 (or None)", field="cpu_threads", value=self.cpu_threads)


KEEP = "keep"  # TuneSettings.prune: the workload's own autotune.prune stays


@dataclass(frozen=True)
class TuneSettings:
    """One ``farm tune``'s settings, built once from the command line (farm.cli.tune.tune_settings) and passed
    down: how either executor runs (``options``: sharding, the candidate budget, the reduce, incumbents and which
    problems are only checked, the check after the reduce), the pruning the workload's autotune config gets
    (``prune``: a PruneSettings, None for none, KEEP for the workload's own) and whether confirmations left
    undecided are redone (``reconfirm``)."""

    options: FarmOptions = FarmOptions()
    prune: Any = KEEP
    reconfirm: bool = False

    def workload_for(self, workload: Any) -> Any:
        """``workload`` with these settings in its autotune config (what the workers read)."""
        import dataclasses

        auto = workload.autotune
        if self.prune != KEEP:
            auto = dataclasses.replace(auto, prune=self.prune)
        if self.reconfirm:
            auto = dataclasses.replace(auto, confirm=dataclasses.replace(auto.confirm, redo_undecided=True))
        return workload if auto is workload.autotune else dataclasses.replace(workload, autotune=auto)
