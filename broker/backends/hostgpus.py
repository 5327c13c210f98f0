"""This host's GPUs as the local backend hands them out: discovery, nodes, exclusive allocation, pinning.

Real GPUs come from NVML (`broker.backends.gpus`), virtual ones from `--virtual-gpus`, split into virtual
nodes by `--virtual-nodes`. A pod's GPUs are exclusive unless it is a standby pinned to its group's card;
the pod records are the ledger of what is taken, so nothing here survives apart from them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from broker.backends import gpus as gpu_discovery
from broker.errors import BackendError
from broker.health.gpuhealth import GpuHealth
from broker.ports.backend import Device


class HostGpus:
    """The GPUs of this host, grouped into nodes; which are free is read from the pod records passed in."""

    def __init__(self, virtual_gpus: int | None, gpus_per_node: int | None) -> None:
        self.gpus = {g.device.key: g for g in gpu_discovery.discover(virtual_gpus)}
        self.nodes = gpu_discovery.local_nodes([g.device for g in self.gpus.values()], gpus_per_node,
                                               virtual=virtual_gpus is not None)
        self.node_of = {key: node.id for node in self.nodes for key in node.gpus}

    def devices(self) -> list[Device]:
        return [g.device for g in self.gpus.values()]

    def node(self, keys: Sequence[str]) -> str:
        """The node of a pod with these GPUs ("" without any)."""
        return self.node_of.get(keys[0], "") if keys else ""

    async def health(self, keys: Sequence[str]) -> dict[str, GpuHealth]:
        """NVML's health of these real GPUs (broker.health.gpuhealth); virtual ones are left out."""
        real = [k for k in keys if k in self.gpus and not self.gpus[k].virtual]
        return await asyncio.to_thread(gpu_discovery.read_health, real) if real else {}

    def allocate(self, records: Iterable[Mapping[str, Any]], count: int, name: str, node: str = "",
                 avoid: frozenset[str] = frozenset()) -> list[str]:
        """Exclusive GPUs for a pod (on `node` when placement chose one), none that `records` hold; synchronous,
        so two concurrent creates never get the same one. `avoid`: quarantined GPUs, never given to a new pod."""
        if count <= 0:
            return []
        if node and node not in {n.id for n in self.nodes}:
            raise BackendError(f"pod {name}: no node {node}")
        used = {key for record in records for key in record["gpus"]}
        free = [key for key in self.gpus
                if key not in used and key not in avoid and (not node or self.node_of.get(key) == node)]
        if len(free) < count:
            where = f" on node {node}" if node else ""
            raise BackendError(f"pod {name} needs {count} GPU(s){where}, {len(free)} free of {len(self.gpus)}"
                               + (f" ({len(avoid)} quarantined)" if avoid else ""))
        return free[:count]

    def pin(self, records: Iterable[Mapping[str, Any]], keys: tuple[str, ...], pool: str, name: str) -> list[str]:
        """A standby's devices: each must exist and be shared only by pods of the same pool (its group)."""
        records = list(records)
        for key in keys:
            if key not in self.gpus:
                raise BackendError(f"pod {name}: no GPU {key} to pin to")
            others = {r["pool"] for r in records if key in r["gpus"]}
            if others - {pool}:
                raise BackendError(f"pod {name}: GPU {key} is shared with pool(s) {sorted(others - {pool})}")
        return list(keys)
