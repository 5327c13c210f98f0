"""Nodes as the backend port reports them, and the load on each: what placement reads and updates.

A `Node` is a machine: its id, boot epoch (a node that rebooted is a new node), its GPUs (keys and
model, in index order) and its topology domain (an NVLink island or rack: what `topology: domain`
keeps a set within). A `Fleet` is the nodes with the allocations on them, by size; each node's shape
affinity is the allocation size holding most of its GPUs (R1: halves pack with halves).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Node:
    """One machine with GPUs."""

    id: str
    gpus: tuple[str, ...]
    """Device keys in index order (GPU UUIDs on real hardware)."""
    model: str = ""
    domain: str = ""
    """Topology domain (NVLink island, rack); empty: the node is its own domain."""
    boot_epoch: str = ""
    """Changes when the node reboots or is replaced under the same name (design R5)."""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def domain_key(self) -> str:
        return self.domain or f"node:{self.id}"

    def matches(self, selector: Mapping[str, str]) -> bool:
        """A pool's `node_selector`: every label given must be on the node with that value."""
        return all(self.labels.get(k) == v for k, v in selector.items())


class NodeLoad:
    """A node and the allocations (sizes in GPUs) on it."""

    __slots__ = ("node", "allocs", "used")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.allocs: Counter[int] = Counter()
        self.used = 0

    @property
    def free(self) -> int:
        return self.node.size - self.used

    @property
    def empty(self) -> bool:
        return self.used == 0

    @property
    def affinity(self) -> int | None:
        """The allocation size holding most of this node's GPUs (the larger on a tie); None when empty."""
        if not self.allocs:
            return None
        return max(self.allocs, key=lambda size: (size * self.allocs[size], size))

    def add(self, gpus: int) -> None:
        if gpus > self.free:
            raise ValueError(f"node {self.node.id}: {gpus} GPUs asked, {self.free} free")
        self.allocs[gpus] += 1
        self.used += gpus

    def remove(self, gpus: int) -> None:
        if self.allocs[gpus] <= 0:
            raise ValueError(f"node {self.node.id}: no allocation of {gpus} GPUs to remove")
        self.allocs[gpus] -= 1
        if not self.allocs[gpus]:
            del self.allocs[gpus]
        self.used -= gpus


class Fleet:
    """Nodes in their reported order, with their loads; placement reads it, callers apply what it decides."""

    def __init__(self, nodes: Iterable[Node]) -> None:
        self.loads: dict[str, NodeLoad] = {}
        for node in nodes:
            if node.id in self.loads:
                raise ValueError(f"node {node.id} reported twice")
            self.loads[node.id] = NodeLoad(node)

    @classmethod
    def of(cls, nodes: Iterable[Node], allocations: Iterable[tuple[str, int]]) -> Fleet:
        """A fleet with these (node id, GPUs) allocations on it; allocations on unknown nodes are ignored."""
        fleet = cls(nodes)
        for node_id, gpus in allocations:
            load = fleet.loads.get(node_id)
            if load is not None and gpus > 0:
                load.add(min(gpus, load.free))
        return fleet

    def __len__(self) -> int:
        return len(self.loads)

    def subset(self, selector: Mapping[str, str] | None = None, model: str | None = None) -> Fleet:
        """The nodes a pool may use (its node selector and GPU model), sharing their loads with this fleet."""
        out = Fleet(())
        for node_id, load in self.loads.items():
            if (selector is None or load.node.matches(selector)) and (model is None or load.node.model == model):
                out.loads[node_id] = load
        return out

    def domains(self) -> dict[str, list[NodeLoad]]:
        """Nodes by topology domain, in node order."""
        out: dict[str, list[NodeLoad]] = {}
        for load in self.loads.values():
            out.setdefault(load.node.domain_key, []).append(load)
        return out

    @property
    def total(self) -> int:
        return sum(load.node.size for load in self.loads.values())

    @property
    def free(self) -> int:
        return sum(load.free for load in self.loads.values())

    def apply(self, node_ids: Iterable[str], gpus: int) -> None:
        """Record one `gpus`-GPU allocation on each of these nodes (a placement's pods)."""
        for node_id in node_ids:
            self.loads[node_id].add(gpus)

    def release(self, node_ids: Iterable[str], gpus: int) -> None:
        for node_id in node_ids:
            self.loads[node_id].remove(gpus)
