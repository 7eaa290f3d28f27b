"""The cluster's nodes as the farm sees them: the devices each offers, which joined, which were lost.

A GPU node offers its ``GPU`` resource; a node of simulated devices offers a custom resource per device
kind, ``sim:<name>`` (``ray start --resources='{"sim:Sim H200": 4}'``), so a node carries devices of
its own signature as a GPU node does. Each device worker is pinned to its node (a hard node affinity):
when the node goes, its workers go with it instead of being restarted elsewhere under another node's
devices. The driver polls the nodes (``NodeTable.observe``) and starts workers on nodes that join.

Ray-free except :func:`cluster_nodes`, so the bookkeeping is tested alone (tests/fleet/test_nodes.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from farm.devices.sim import SimConfig, SimGroup

log = logging.getLogger("farm.fleet.driver")
ACTIVE, LOST = "active", "lost"
SIM_RESOURCE_PREFIX = "sim:"


def sim_resource(group: str) -> str:
    """The custom resource a node declares for each simulated device of kind ``group`` it carries."""
    return f"{SIM_RESOURCE_PREFIX}{group}"


@dataclass(frozen=True)
class NodeView:
    """One node as Ray reports it (``ray.nodes()``)."""

    node_id: str
    host: str
    address: str
    alive: bool
    resources: Mapping[str, float] = field(default_factory=dict)

    @staticmethod
    def of(entry: Mapping[str, Any]) -> "NodeView":
        return NodeView(str(entry.get("NodeID", "")), str(entry.get("NodeManagerHostname", "")),
                        str(entry.get("NodeManagerAddress", "")), bool(entry.get("Alive")),
                        dict(entry.get("Resources") or {}))


@dataclass(frozen=True)
class Slot:
    """A device a node offers, for one worker: ``kind`` gpu or sim (``group``: the simulated device's kind)."""

    node_id: str
    kind: str
    group: SimGroup | None = None

    @property
    def resource(self) -> str:
        return sim_resource(self.group.name) if self.group is not None else "GPU"


def placed_sim(sim: SimConfig | None, nodes: Iterable[NodeView]) -> bool:
    """Simulated devices live on nodes (some node declares a ``sim:<name>`` resource of the config's kinds);
    else they all run beside the driver, ``count`` of each kind, as on one machine."""
    if sim is None:
        return False
    wanted = {sim_resource(g.name) for g in sim.groups}
    return any(n.alive and wanted & set(n.resources) for n in nodes)


def slots_of(node: NodeView, kind: str, sim: SimConfig | None = None) -> list[Slot]:
    """The devices ``node`` offers to workers of ``kind`` (``gpu`` or placed ``sim``)."""
    if not node.alive:
        return []
    if kind == "gpu":
        return [Slot(node.node_id, "gpu") for _ in range(int(node.resources.get("GPU", 0)))]
    if kind == "sim" and sim is not None:
        return [Slot(node.node_id, "sim", g) for g in sim.groups
                for _ in range(int(node.resources.get(sim_resource(g.name), 0)))]
    return []


@dataclass
class NodeRecord:
    """One node during a job: where it is, its workers, and when it joined or was lost (seconds into the job)."""

    node_id: str
    host: str
    address: str
    state: str = ACTIVE
    joined_s: float | None = None  # None: there when the job started
    lost_s: float | None = None
    workers: list[str] = field(default_factory=list)  # the device workers started on it
    signatures: list[str] = field(default_factory=list)
    rows: int = 0  # measurements its workers made (rows, every round: a candidate of a stage counts again)
    failures: int = 0

    @property
    def short_id(self) -> str:
        return self.node_id[:8]

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.host, "address": self.address, "state": self.state,
                "joined_s": self.joined_s, "lost_s": self.lost_s, "workers": list(self.workers),
                "signatures": sorted(self.signatures), "rows": self.rows, "failures": self.failures}


class NodeTable:
    """The nodes seen during a job. ``observe`` takes a fresh list of nodes and says which are new (alive,
    not seen before) and which were lost (seen alive, now dead or gone)."""

    def __init__(self) -> None:
        self.records: dict[str, NodeRecord] = {}
        self._started = False

    def observe(self, views: Sequence[NodeView], now_s: float) -> tuple[list[NodeView], list[str]]:
        joined: list[NodeView] = []
        lost: list[str] = []
        alive = {v.node_id: v for v in views if v.alive}
        for v in alive.values():
            if v.node_id not in self.records:
                self.records[v.node_id] = NodeRecord(v.node_id, v.host, v.address,
                                                     joined_s=round(now_s, 3) if self._started else None)
                joined.append(v)
        for rec in self.records.values():
            if rec.state == ACTIVE and rec.node_id not in alive:
                rec.state, rec.lost_s = LOST, round(now_s, 3)
                lost.append(rec.node_id)
        self._started = True
        return joined, lost

    def mark_lost(self, node_id: str, now_s: float) -> bool:
        """The node is gone (a worker's error said so before the node list did); False if known already."""
        rec = self.records.get(node_id)
        if rec is None or rec.state == LOST:
            return False
        rec.state, rec.lost_s = LOST, round(now_s, 3)
        return True

    def is_lost(self, node_id: str) -> bool:
        rec = self.records.get(node_id)
        return rec is not None and rec.state == LOST

    def add_worker(self, node_id: str, name: str, signature: str) -> None:
        rec = self.records.get(node_id)
        if rec is None:  # a worker Ray placed on a node this table has not listed yet
            rec = self.records[node_id] = NodeRecord(node_id, "", "")
        rec.workers.append(name)
        if signature not in rec.signatures:
            rec.signatures.append(signature)

    def with_workers(self) -> list[NodeRecord]:
        """The nodes that ran (or were to run) device workers, in the order they were seen."""
        return [r for r in self.records.values() if r.workers]


def cluster_nodes() -> list[NodeView]:
    """Every node the cluster knows, alive or dead (one call to the GCS)."""
    import ray

    return [NodeView.of(n) for n in ray.nodes()]


class DeviceWaits:
    """Signatures with work left and no device up: each waits up to ``wait_s`` for a node of its kind to join,
    then its work is given up (the job finishes what it can; a resume measures the rest)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self.since: dict[str, float] = {}  # signature -> when its last device went
        self.given_up: dict[str, list[int]] = {}  # signature -> problems (workload indices) left for a device

    def check(self, now: float, signatures: Sequence[str], has_device: Callable[[str], bool],
              has_work: Callable[[str], bool], abandon: Callable[[str], set[int]]) -> list[str]:
        """-> the signatures given up now (``abandon(signature)``: their problems left, taken from the queues)."""
        out = []
        for sig in signatures:
            if sig in self.given_up or has_device(sig):
                self.since.pop(sig, None)
                continue
            if not has_work(sig):
                continue
            since = self.since.setdefault(sig, now)
            if since == now:
                log.warning("farm: no device of %s is left; waiting up to %.0f s for a node with one", sig, self.wait_s)
            if now - since >= self.wait_s:
                self.given_up[sig] = sorted(abandon(sig))
                self.since.pop(sig, None)
                log.warning("farm: no device of %s joined within %.0f s: %d problem(s) wait for one (a resume "
                            "measures them)", sig, self.wait_s, len(self.given_up[sig]))
                out.append(sig)
        return out

    def left_s(self, now: float) -> dict[str, float]:
        """Signature -> seconds it waits yet for a device."""
        return {s: max(0.0, self.wait_s - (now - t)) for s, t in self.since.items()}
