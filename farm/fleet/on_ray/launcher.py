"""Starting the device workers (Ray actors): one per device, pinned to its node where devices belong to nodes.

GPUs, and simulated devices a node declares (farm.fleet.on_ray.nodes), get one worker per device pinned to that node
(a hard node affinity), so the fleet follows the cluster's nodes as they join and go; ``poll`` lists the nodes
and ``fill`` starts workers on the devices of nodes that joined (within ``--max-devices``). CPU workers
(``cpu:N``) and simulated devices no node declares run where Ray places them, started once.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any, Sequence

from farm.errors import FarmError
from farm.fleet.on_ray.nodes import LOST, NodeTable, Slot, cluster_nodes, placed_sim, slots_of
from farm.fleet.options import DeviceRequest, FarmOptions
from farm.fleet.on_ray.worker import DeviceWorkerImpl, WorkerInfo
from farm.model.workload import WorkloadProblem

log = logging.getLogger("farm.fleet.on_ray.launcher")


class FarmFailed(FarmError, RuntimeError):
    """The farm could not run (no devices, workers that never start...)."""


WORKER_NICENESS_ENV = "RAY_worker_niceness"  # read by Ray where it starts the worker process of an actor


def _niceness() -> int:
    try:
        return os.nice(0)
    except OSError:
        return 0


class WorkerLauncher:
    """Starts the device workers (Ray actors). GPUs and simulated devices placed on nodes (farm.fleet.on_ray.nodes) get
    one worker per device, pinned to its node: the fleet follows the cluster's nodes as they join and go. CPU
    workers (``cpu:N``) and simulated devices no node declares run where Ray puts them, started once."""

    def __init__(self, request: DeviceRequest, options: FarmOptions, problems: Sequence[WorkloadProblem] = ()) -> None:
        import ray

        self.request, self.options, self.problems = request, options, list(problems)
        self.actor = ray.remote(DeviceWorkerImpl)
        kind = request.kind
        if kind == "auto":
            kind = "gpu" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"
        self.kind = kind
        self.nodes = NodeTable()
        self.placed = kind == "gpu" or (kind == "sim" and placed_sim(request.sim, cluster_nodes()))
        self.handles: list[Any] = []  # every worker started, in order
        self.starting: dict[Any, tuple[Any, Slot]] = {}  # info() call of a worker starting -> (its handle, slot)
        self._started_at: dict[Any, float] = {}  # info() call -> when its worker was started
        self.spare: list[Slot] = []  # devices of live nodes left unused by --max-devices
        self._sim_slots = itertools.count()
        # Ray starts workers at niceness 15; a worker measures what production runs, at the driver's priority (else
        # on a busy machine anything at nice 0 starves the measured kernels: 50x slower 2-thread BLAS calls, seen)
        self._opts: dict[str, Any] = {"max_restarts": -1, "max_task_retries": 0,
                                      "runtime_env": {"env_vars": {WORKER_NICENESS_ENV: str(_niceness())}}}

    @property
    def cap(self) -> int:
        return self.options.max_devices or 1 << 30

    def start_initial(self) -> tuple[list[Any], list[WorkerInfo]]:
        """The workers of the devices the cluster has now; -> their handles and infos (all started)."""
        import ray

        if self.placed:
            views = cluster_nodes()
            self.nodes.observe(views, 0.0)
            self.spare = [slot for v in views for slot in slots_of(v, self.kind, self.request.sim)]
            if not self.spare:
                raise FarmFailed("--devices gpu: the cluster has no GPUs")
            refs = self.fill(live=0)
        else:
            refs = self._start_unplaced()
        n, kind = len(refs), self.kind
        try:
            infos = ray.get(refs, timeout=self.options.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise FarmFailed(f"{n} {kind} worker(s) did not start within {self.options.startup_timeout_s:.0f} s "
                             f"(cluster resources: {ray.cluster_resources()})") from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError) as exc:
            raise FarmFailed(f"a {kind} worker failed to start: {exc}") from None
        handles = [self.take(ref)[0] for ref in refs]
        if kind == "gpu":
            seen = [(i.host, i.properties.uuid) for i in infos]
            if len(set(seen)) != len(seen):
                raise FarmFailed(f"two GPU workers share a GPU: {seen}")
        for info in infos:
            self.nodes.add_worker(info.node_id, info.name, info.signature)
        log.info("farm: %d worker(s): %s", len(infos), ", ".join(f"{i.name}@{i.host} {i.signature}" for i in infos))
        return handles, infos

    def poll(self, now_s: float) -> list[str]:
        """List the nodes (new ones' devices become spare); -> the nodes lost since the last poll."""
        joined, lost = self.nodes.observe(cluster_nodes(), now_s)
        gone = {r.node_id for r in self.nodes.records.values() if r.state == LOST}
        self.spare = [s for s in self.spare if s.node_id not in gone]
        for view in joined:
            self.spare += slots_of(view, self.kind, self.request.sim)
        if joined:
            log.info("farm: node(s) joined: %s", ", ".join(f"{v.node_id[:8]}@{v.host}" for v in joined))
        return lost

    def node_alive(self, node_id: str) -> bool:
        """Whether the cluster still lists ``node_id`` alive (asked now: a worker's error came first)."""
        return any(v.node_id == node_id and v.alive for v in cluster_nodes())

    def fill(self, live: int) -> list[Any]:
        """Start workers on spare devices while fewer than --max-devices are up or starting; -> their info() calls."""
        refs = []
        while self.spare and live + len(self.starting) < self.cap:
            refs.append(self.start(self.spare.pop(0)))
        return refs

    def start(self, slot: Slot) -> Any:
        """A worker for ``slot``, pinned to its node; -> its info() call (it answers once the worker is up)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        pin = NodeAffinitySchedulingStrategy(slot.node_id, soft=False)
        if slot.kind == "gpu":
            handle = self.actor.options(num_gpus=1, num_cpus=1, scheduling_strategy=pin, **self._opts).remote(
                "gpu", 0, None, self.problems, log_level=self.options.log_level)
        else:
            assert slot.group is not None and self.request.sim is not None
            handle = self.actor.options(num_cpus=0, resources={slot.resource: 1}, scheduling_strategy=pin,
                                        **self._opts).remote("sim", next(self._sim_slots), self.request.sim,
                                                             log_level=self.options.log_level, sim_group=slot.group)
        self.handles.append(handle)
        ref = handle.info.remote()
        self.starting[ref] = (handle, slot)
        self._started_at[ref] = time.monotonic()
        return ref

    def take(self, ref: Any) -> tuple[Any, Slot]:
        """The worker behind a start's info() call, which is no longer waited on."""
        self._started_at.pop(ref, None)
        return self.starting.pop(ref)

    def late(self, timeout_s: float) -> list[Any]:
        """info() calls of workers starting for longer than ``timeout_s`` (the caller gives them up)."""
        now = time.monotonic()
        return [ref for ref in self.starting if now - self._started_at.get(ref, now) > timeout_s]

    def _start_unplaced(self) -> list[Any]:
        request, options = self.request, self.options
        if self.kind == "cpu":
            n = min(request.count or 1, self.cap)
            handles = [self.actor.options(num_cpus=1, **self._opts).remote(
                "cpu", i, None, (), None, options.cpu_threads, log_level=options.log_level) for i in range(n)]
        else:
            assert request.sim is not None
            handles = [self.actor.options(num_cpus=0, **self._opts).remote("sim", i, request.sim,
                                                                           log_level=options.log_level)
                       for i in range(min(request.sim.device_count, self.cap))]
        refs = []
        for h in handles:
            self.handles.append(h)
            ref = h.info.remote()
            self.starting[ref] = (h, Slot("", self.kind))
            refs.append(ref)
        return refs
