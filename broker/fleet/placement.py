"""Where a pod set goes: best-fit over topology sets, shape-aligned (design §6 and revision R1).

A set of `pods` pods of `gpus` GPUs each, with `topology`:
- `node`: every pod on one node (an NVLink island), or nowhere;
- `domain`: every pod within one topology domain (a rack, a leaf switch), or nowhere;
- `any`: one node if one fits, else one domain, else spread pod by pod.

Among candidate nodes, best-fit takes the one with an exact fill first (nothing left over), then one
whose shape affinity is this shape (halves pack with halves), then the least remainder. An empty node
leaves the largest remainder, so it is taken last: whole nodes stay whole. A set whose size is a
multiple of a node's size takes whole empty nodes, never partial ones (a `node` or `domain` set fails
rather than take partial ones; an `any` set prefers whole nodes and spreads only when none are left).
`first_fit` (the first node in order that fits) and `worst_fit` (the node with the most free GPUs: what a
spreading scheduler such as Kubernetes' default LeastAllocated score does) are the topology-blind
baselines the fragmentation benchmark compares against (§10 rejects both).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from broker.fleet.nodes import Fleet, NodeLoad

Topology = Literal["node", "domain", "any"]
TOPOLOGIES: tuple[str, ...] = get_args(Topology)
Policy = Literal["best_fit", "first_fit", "worst_fit"]
POLICIES: tuple[str, ...] = get_args(Policy)


@dataclass(frozen=True)
class Ask:
    """A pod set to place: `pods` pods of `gpus` GPUs each."""

    pods: int
    gpus: int
    topology: Topology = "any"

    @property
    def total(self) -> int:
        return self.pods * self.gpus


@dataclass(frozen=True)
class Placement:
    """Pods per node, in rank order: ((node id, pods on it), ...)."""

    chunks: tuple[tuple[str, int], ...]
    gpus: int
    """GPUs per pod."""

    def nodes(self) -> list[str]:
        """The node of each pod, rank by rank (a set's ranks stay together on each node)."""
        return [node for node, n in self.chunks for _ in range(n)]

    @property
    def node_count(self) -> int:
        return len(self.chunks)


def score(load: NodeLoad, shape: int, free: int | None = None) -> tuple[int, int, int]:
    """R1's order for putting `shape` GPUs on a node: exact fill, then shape-aligned, then tightest."""
    remainder = (load.free if free is None else free) - shape
    return (0 if remainder == 0 else 1, 0 if load.affinity == shape else 1, remainder)


def place(fleet: Fleet, ask: Ask, policy: Policy = "best_fit") -> Placement | None:
    """Where the set goes, or None when it cannot be placed now; the fleet is not changed."""
    if ask.pods <= 0 or ask.gpus <= 0:
        return Placement((), max(ask.gpus, 0))
    loads = list(fleet.loads.values())
    if not any(load.node.size >= ask.gpus for load in loads):
        return None
    whole = _whole_size(loads, ask)
    if whole is not None:
        chosen = _whole_nodes(fleet, ask, whole, policy)
        if chosen is not None or ask.topology != "any":
            return chosen
    if ask.topology == "node":
        return _on_one_node(loads, ask, policy)
    if ask.topology == "domain":
        return _in_one_domain(fleet, ask, policy)
    if policy == "best_fit":
        one = _on_one_node(loads, ask, policy) or _in_one_domain(fleet, ask, policy)
        if one is not None:
            return one
    return _pack(loads, ask, policy)


def apply(fleet: Fleet, placement: Placement) -> None:
    """Record a placement on the fleet: one allocation per node of the pods placed there."""
    for node, n in placement.chunks:
        fleet.loads[node].add(n * placement.gpus)


def release(fleet: Fleet, placement: Placement) -> None:
    for node, n in placement.chunks:
        fleet.loads[node].remove(n * placement.gpus)


def _whole_size(loads: Sequence[NodeLoad], ask: Ask) -> int | None:
    """The node size this set is a whole multiple of (and whose nodes hold whole pods), if any."""
    for size in sorted({load.node.size for load in loads}, reverse=True):
        if size and ask.total >= size and ask.total % size == 0 and size % ask.gpus == 0:
            return size
    return None


def _whole_nodes(fleet: Fleet, ask: Ask, size: int, policy: Policy) -> Placement | None:
    """`total / size` empty nodes of that size (within one domain for `node` and `domain` sets)."""
    k = ask.total // size
    per = size // ask.gpus
    if ask.topology == "node" and k > 1:
        return None
    groups: Iterable[list[NodeLoad]]
    domains = fleet.domains()
    if ask.topology == "any":
        # Prefer one domain (the tightest that holds them), else any empty nodes.
        groups = [*_by_tightness(domains.values(), policy), list(fleet.loads.values())]
    else:
        groups = _by_tightness(domains.values(), policy)
    for group in groups:
        empty = [load for load in group if load.empty and load.node.size == size]
        if len(empty) >= k:
            return Placement(tuple((load.node.id, per) for load in empty[:k]), ask.gpus)
    return None


def _by_tightness(domains: Iterable[list[NodeLoad]], policy: Policy) -> list[list[NodeLoad]]:
    """Domains in the order a set tries them: least free first for best-fit, as listed for first-fit."""
    listed = list(domains)
    if policy != "best_fit":
        return listed
    return sorted(listed, key=lambda group: sum(load.free for load in group))


def _on_one_node(loads: Sequence[NodeLoad], ask: Ask, policy: Policy) -> Placement | None:
    fits = [load for load in loads if load.free >= ask.total]
    if not fits:
        return None
    order = {id(load): i for i, load in enumerate(loads)}
    if policy == "first_fit":
        best = fits[0]
    elif policy == "worst_fit":
        best = min(fits, key=lambda load: (-load.free, order[id(load)]))
    else:
        best = min(fits, key=lambda load: (score(load, ask.total), order[id(load)]))
    return Placement(((best.node.id, ask.pods),), ask.gpus)


def _in_one_domain(fleet: Fleet, ask: Ask, policy: Policy) -> Placement | None:
    for group in _by_tightness(fleet.domains().values(), policy):
        if sum(load.free for load in group) < ask.total:
            continue
        placed = _on_one_node(group, ask, policy) or _pack(group, ask, policy)
        if placed is not None:
            return placed
    return None


def _pack(loads: Sequence[NodeLoad], ask: Ask, policy: Policy) -> Placement | None:
    """Pod by pod: each on the best node for one pod (or the first that fits), on tentative free counts."""
    free = {id(load): load.free for load in loads}
    placed: dict[str, int] = {}
    order = {id(load): i for i, load in enumerate(loads)}
    for _ in range(ask.pods):
        fits = [load for load in loads if free[id(load)] >= ask.gpus]
        if not fits:
            return None
        if policy == "first_fit":
            best = fits[0]
        elif policy == "worst_fit":
            best = min(fits, key=lambda load: (-free[id(load)], order[id(load)]))
        else:
            best = min(fits, key=lambda load: (
                (0, 0, free[id(load)] - ask.gpus) if load.node.id in placed else score(load, ask.gpus, free[id(load)]),
                order[id(load)]))
        free[id(best)] -= ask.gpus
        placed[best.node.id] = placed.get(best.node.id, 0) + 1
    return Placement(tuple(placed.items()), ask.gpus)
