"""The backend port: create, delete, list and annotate pods; reach each pod's agent.

A backend owns where pods run (bubblewrap sandboxes here, Kubernetes pods in a cluster) and which
devices they get; the control plane never schedules nodes or devices itself. Pod records carry
annotations (owner, hold) that the backend persists so a restarted broker rebuilds its tracker.
`FakeBackend` keeps pods in memory with `FakeAgent`s and a configurable start delay in clock time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.clock import Clock
from broker.errors import BackendError
from broker.fleet.nodes import Node
from broker.pods import Origin
from broker.pools import PoolSpec
from broker.ports.agent import AgentClient, FakeAgent
from broker.running.topology import Rendezvous


@dataclass(frozen=True)
class Device:
    """One accelerator the backend can bind; `key` is unique across the cluster (e.g. a GPU UUID)."""

    key: str
    index: int
    model: str
    memory_mb: int = 0


@dataclass(frozen=True)
class PodRequest:
    name: str
    pool: PoolSpec
    origin: Origin = Origin.DEMAND
    annotations: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] = ()
    """Pin to these devices, shared with the pool's active pod there (a standby); empty: exclusive ones."""
    node: str = ""
    """Place the pod's exclusive GPUs on this node (placement chose it: broker.fleet); empty: the backend picks."""
    gang: str = ""
    """Placement hint: the gang (multi-pod job) this pod is made for; a cluster backend keeps a gang's pods
    together (on one node when `gang_size` pods fit one, else on the fewest). Empty: no gang."""
    gang_size: int = 1
    """The gang's world size (pods)."""
    gang_topology: str = ""
    """`node` when the gang must run on one node (its `topology`): a cluster backend then requires it of the
    scheduler, never just prefers it. Empty: placement's hint only."""
    gang_batch: tuple[str, int] = ("", 0)
    """(batch id, pods) of the gang's pods created in one pass, which a gang scheduler (Volcano's PodGroup
    minMember) starts all or none of. Fewer than `gang_size` when warm pods serve the rest: a group waiting
    for members never made would wait for ever. ("", 0): not a gang pod."""
    image: str = ""
    """A job's custom image (broker.images) in place of the pool template's; only backends with
    `runs_images = True` are ever asked for one."""
    avoid: frozenset[str] = frozenset()
    """Devices the pod must not get (quarantined, broker.health.quarantine), and `node:<id>` for each node it must
    not go to (a quarantined node, GPUs or not: a cluster backend keeps it out of the pod's node affinity)."""


@dataclass(frozen=True)
class PodInfo:
    name: str
    pool: str
    gpus: tuple[str, ...]
    """Device keys bound to the pod."""
    template: str
    """The pool template hash the pod was built from."""
    created_at: float
    isolated: bool
    annotations: Mapping[str, str] = field(default_factory=dict)
    endpoint: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific; `incarnation` is the agent incarnation the backend started (broker.health.epochs)."""
    node: str = ""
    """The node the pod runs on; empty when the backend has no nodes (CPU-only)."""


AVOID_NODE = "node:"
"""Prefix of a node's key in `PodRequest.avoid` (the quarantine record's key of a node)."""


def avoided_node_ids(avoid: frozenset[str]) -> set[str]:
    """The nodes `avoid` names by key (`node:<id>`)."""
    return {key[len(AVOID_NODE):] for key in avoid if key.startswith(AVOID_NODE)}


NODE_LABEL = "firepool.dev/node"
DOMAIN_LABEL = "firepool.dev/domain"
"""Labels of the nodes a backend makes up (virtual, fake): a pool's `node_selector` can name them."""


def split_nodes(devices: Sequence[Device], per_node: int | None, prefix: str, *, domain_size: int = 0,
                epoch: str = "") -> list[Node]:
    """Devices grouped into nodes of `per_node` GPUs (None: one node with all of them), named `<prefix>-<i>`;
    `domain_size` nodes share a topology domain (0: one domain for all)."""
    if not devices:
        return []
    size = per_node or len(devices)
    nodes = []
    for i in range(0, len(devices), size):
        chunk = devices[i:i + size]
        n = i // size
        node_id, domain = f"{prefix}-{n}", f"{prefix}-domain-{n // domain_size if domain_size else 0}"
        nodes.append(Node(id=node_id, gpus=tuple(d.key for d in chunk), model=chunk[0].model, domain=domain,
                          boot_epoch=epoch, labels={NODE_LABEL: node_id, DOMAIN_LABEL: domain}))
    return nodes


class Backend(Protocol):
    kind: str

    def devices(self) -> list[Device]:
        """The accelerators this backend can bind."""
        ...

    def nodes(self) -> list[Node]:
        """The machines with GPUs: id, boot epoch, GPU keys and model, topology domain (broker.fleet)."""
        ...

    async def create(self, request: PodRequest) -> PodInfo:
        """Create a pod and return once its agent answers; raises BackendError."""
        ...

    async def delete(self, name: str) -> None:
        """Delete a pod and everything of it; idempotent."""
        ...

    async def list_pods(self) -> list[PodInfo]:
        """Every live pod this broker owns, with its annotations (for restart recovery)."""
        ...

    async def annotate(self, name: str, annotations: Mapping[str, str]) -> None:
        """Persist ownership annotations on the pod record (best effort for callers)."""
        ...

    def agent(self, name: str) -> AgentClient:
        """The agent client of a live pod."""
        ...

    def rendezvous(self, coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        """Where the `world` ranks of a job reach its rank-0 pod `coordinator`: an address of that
        pod the others can reach and a port free on it; raises BackendError when they cannot.
        `members` are the job's pods in rank order (the coordinator first); called before every launch."""
        ...

    async def close(self) -> None: ...


class FakeBackend:
    """Pods in memory: GPUs are numbered slots, starts take `start_delay` of clock time."""

    kind = "fake"
    runs_images = True
    """The fake records a custom image on the pod (`images`) as a container backend would run it."""

    def __init__(self, clock: Clock, gpus: int = 0, start_delay: float = 0.0, model: str = "fake-gpu",
                 memory_mb: int = 0, gpus_per_node: int | None = None) -> None:
        self.clock = clock
        self.start_delay = start_delay
        self._devices = [Device(key=f"fake-gpu-{i}", index=i, model=model, memory_mb=memory_mb) for i in range(gpus)]
        self._nodes = split_nodes(self._devices, gpus_per_node, "fake-node", epoch="boot-0")
        self._node_of = {key: node.id for node in self._nodes for key in node.gpus}
        self.fenced: dict[str, str] = {}
        """pod name -> why the control plane fenced it (its agent calls fail from then on)."""
        self.pods: dict[str, PodInfo] = {}
        self.agents: dict[str, FakeAgent] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.fail_creates = 0
        self.images: dict[str, str] = {}
        """pod name -> the custom image it was created with."""
        self.requests: dict[str, PodRequest] = {}
        """pod name -> the request it was created from (placement hints included)."""
        self.pin_gpu: str | None = None
        self._next_port = 29499
        """When set, every GPU pod lands on this device (to exercise the per-GPU gate)."""

    def devices(self) -> list[Device]:
        return list(self._devices)

    def nodes(self) -> list[Node]:
        return list(self._nodes)

    def reboot(self, node: str, epoch: str) -> None:
        """The node comes back with another boot epoch; its pods stay as they were (as a Kubernetes pod object
        and its UID outlive a reboot of its node): only the node's epoch tells that their work is gone."""
        self._nodes = [dataclasses.replace(n, boot_epoch=epoch) if n.id == node else n for n in self._nodes]

    def fence(self, name: str, why: str) -> None:
        """Fail every later call to the pod's agent (broker.health.monitor: a voided pod's attempt ends lost)."""
        if name in self.agents:
            self.fenced[name] = why

    def _node_epoch(self, node: str) -> str:
        return next((n.boot_epoch for n in self._nodes if n.id == node), "")

    def _free_devices(self, node: str = "", avoid: frozenset[str] = frozenset()) -> list[str]:
        used = {g for info in self.pods.values() for g in info.gpus}
        return [d.key for d in self._devices
                if d.key not in used and d.key not in avoid and (not node or self._node_of[d.key] == node)]

    async def create(self, request: PodRequest) -> PodInfo:
        gpus: tuple[str, ...] = ()
        if request.gpus:
            gpus = request.gpus
        elif request.pool.gpus:
            if self.pin_gpu is not None:
                gpus = (self.pin_gpu,)
            else:
                free = self._free_devices(request.node, request.avoid)
                if len(free) < request.pool.gpus:
                    raise BackendError(f"no free device for {request.name}")
                gpus = tuple(free[: request.pool.gpus])
        info = PodInfo(name=request.name, pool=request.pool.name, gpus=gpus, template=request.pool.template_hash,
                       created_at=self.clock.now(), isolated=True, annotations=dict(request.annotations),
                       node=self._node_of.get(gpus[0], "") if gpus else "",
                       details={"incarnation": 1})  # the incarnation its FakeAgent starts with
        if info.node:  # the node's boot epoch now (as listed later) and when the pod started (as recorded)
            epoch = self._node_epoch(info.node)
            info = dataclasses.replace(info, details={**info.details, "node_epoch": epoch, "started_node_epoch": epoch})
        self.pods[request.name] = info  # devices are bound from the create call on
        self.requests[request.name] = request
        if request.image:
            self.images[request.name] = request.image
        self.created.append(request.name)
        delay = float(request.pool.template.get("start_delay_s", self.start_delay))
        if delay:
            await self.clock.sleep(delay)
        if self.fail_creates > 0:
            self.fail_creates -= 1
            self.pods.pop(request.name, None)
            raise BackendError(f"injected create failure for {request.name}")
        self.agents[request.name] = FakeAgent(request.name, self.clock)
        return info

    async def delete(self, name: str) -> None:
        if self.pods.pop(name, None) is not None:
            self.deleted.append(name)
        self.agents.pop(name, None)
        self.fenced.pop(name, None)

    async def list_pods(self) -> list[PodInfo]:
        """The live pods, each with its node's boot epoch as it is now."""
        return [dataclasses.replace(p, details={**p.details, "node_epoch": self._node_epoch(p.node)}) if p.node else p
                for p in self.pods.values() if p.name in self.agents]

    async def annotate(self, name: str, annotations: Mapping[str, str]) -> None:
        info = self.pods.get(name)
        if info is not None:
            self.pods[name] = PodInfo(**{**info.__dict__, "annotations": {**info.annotations, **annotations}})

    def agent(self, name: str) -> AgentClient:
        if name in self.fenced:
            raise BackendError(f"pod {name} is fenced: {self.fenced[name]}")
        try:
            return self.agents[name]
        except KeyError:
            raise BackendError(f"pod {name} is gone") from None

    def rendezvous(self, coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        if coordinator not in self.pods:
            raise BackendError(f"pod {coordinator} is gone")
        self._next_port += 1
        return Rendezvous(f"{coordinator}.fake", self._next_port)

    async def close(self) -> None:
        pass
