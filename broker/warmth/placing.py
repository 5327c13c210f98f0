"""Where the pool controller creates pods: the fleet as the tracker sees it, and placement over it.

The backend reports nodes; the tracked pods say what is taken on each (a starting pod counts its pool's
GPUs on the node placement chose for it; standbys share their active pod's GPUs and count once). A
pool sees the nodes its `node_selector` admits and, when nodes report its accelerator as their model,
only those. New pods of one reconcile pass are placed as one set with the pool's `topology`
(broker.fleet.placement: best-fit over topology sets, shape-aligned), so a gang's pods are made together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker.fleet.nodes import Fleet, Node
from broker.fleet.placement import Ask, place
from broker.pods import Pod, PodState
from broker.pools import PoolSpec


def fleet_of(nodes: Iterable[Node], pods: Iterable[Pod], pools: Mapping[str, PoolSpec]) -> Fleet:
    """The nodes with the GPUs these pods hold on them."""
    nodes = list(nodes)
    node_of = {key: node.id for node in nodes for key in node.gpus}
    allocations = []
    for pod in pods:
        if pod.state is PodState.GONE or pod.standby:
            continue
        node = pod.node or (node_of.get(pod.gpus[0], "") if pod.gpus else "")
        spec = pools.get(pod.pool)
        gpus = len(pod.gpus) or (spec.gpus if spec is not None else 0)
        if node and gpus:
            allocations.append((node, gpus))
    return Fleet.of(nodes, allocations)


def pool_fleet(fleet: Fleet, spec: PoolSpec) -> Fleet:
    """The nodes a pool may use: its `node_selector`, and its accelerator when nodes report that model."""
    models = {load.node.model for load in fleet.loads.values()}
    return fleet.subset(spec.node_selector or None, spec.accelerator if spec.accelerator in models else None)


def where(fleet: Fleet, spec: PoolSpec, pods: int) -> list[str]:
    """The node of each of `pods` new pods, placed as one set with the pool's topology; "" lets the backend
    choose (no nodes, a CPU pool, or no room placement can see: the backend decides, and refuses when full)."""
    if pods <= 0:
        return []
    mine = pool_fleet(fleet, spec)
    if spec.gpus <= 0 or not len(mine):
        return [""] * pods
    placed = place(mine, Ask(pods, spec.gpus, spec.topology))
    if placed is None and spec.topology != "any":
        placed = place(mine, Ask(pods, spec.gpus, "any"))  # each pod still best-fit on its own
    return placed.nodes() if placed is not None else [""] * pods
