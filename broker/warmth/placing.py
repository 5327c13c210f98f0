"""Where the pool controller creates pods: the fleet as the tracker sees it, and placement over it.

The backend reports nodes; the tracked pods say what is taken on each (a starting pod counts its pool's
GPUs on the node placement chose for it; standbys share their active pod's GPUs and count once). A
pool sees the nodes its `node_selector` admits and, when nodes report its accelerator as their model,
only those. New pods of one reconcile pass are placed as one set with the pool's `topology`
(broker.fleet.placement: best-fit over topology sets, shape-aligned), so a gang's pods are made together.
A set made for one confined gang (`where_set`) is placed strictly: on one node (or in one domain), beside
the pods already made for it, or not now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from broker.fleet.nodes import Fleet, Node
from broker.fleet.placement import Ask, Topology, apply, place
from broker.pods import Pod, PodState, SessionKey
from broker.pools import PoolSpec


def fleet_of(nodes: Iterable[Node], pods: Iterable[Pod], pools: Mapping[str, PoolSpec],
             avoid: Iterable[str] = ()) -> Fleet:
    """The nodes with the GPUs these pods hold on them; a GPU in `avoid` (quarantined) counts as taken."""
    nodes = list(nodes)
    node_of = {key: node.id for node in nodes for key in node.gpus}
    allocations = []
    held: set[str] = set()
    for pod in pods:
        if pod.state is PodState.GONE or pod.standby:
            continue
        held.update(pod.gpus)
        node = pod.node or (node_of.get(pod.gpus[0], "") if pod.gpus else "")
        spec = pools.get(pod.pool)
        gpus = len(pod.gpus) or (spec.gpus if spec is not None else 0)
        if node and gpus:
            allocations.append((node, gpus))
    allocations.extend((node_of[key], 1) for key in avoid if key in node_of and key not in held)
    return Fleet.of(nodes, allocations)


def pool_fleet(fleet: Fleet, spec: PoolSpec) -> Fleet:
    """The nodes a pool may use: its `node_selector`, and its accelerator when nodes report that model."""
    models = {load.node.model for load in fleet.loads.values()}
    return fleet.subset(spec.node_selector or None, spec.accelerator if spec.accelerator in models else None)


def where(fleet: Fleet, spec: PoolSpec, pods: int) -> list[str]:
    """The node of each of up to `pods` new pods, placed as one set with the pool's topology, else as many
    as fit one by one. "" lets the backend choose (no nodes, a CPU pool, or no room placement can see: the
    backend decides, and refuses when full), except for a pool with a `node_selector`: its pods never
    leave its node set, so the list is shorter when the set is full."""
    if pods <= 0:
        return []
    mine = pool_fleet(fleet, spec)
    if spec.gpus <= 0 or (not len(mine) and not spec.node_selector):
        return [""] * pods
    placed = place(mine, Ask(pods, spec.gpus, spec.topology))
    if placed is None and spec.topology != "any":
        placed = place(mine, Ask(pods, spec.gpus, "any"))
    if placed is not None:
        return placed.nodes()
    nodes: list[str] = []
    for _ in range(pods):  # one by one, each best-fit, while any fits
        one = place(mine, Ask(1, spec.gpus, "node"))
        if one is None:
            break
        apply(mine, one)
        nodes += one.nodes()
    for node in nodes:  # `mine` shares its loads with the caller's fleet: leave it as it was
        mine.loads[node].remove(spec.gpus)
    return nodes if spec.node_selector else nodes + [""] * (pods - len(nodes))


def where_set(fleet: Fleet, spec: PoolSpec, pods: int, topology: str, near: Iterable[str] = ()) -> list[str]:
    """The node of each of `pods` new pods of one set that must stay on one node (or in one domain), joining
    the nodes `near` its pods already made are on; [] when it cannot be placed now (it waits, never splits).
    "" each where nodes do not matter: a CPU pool, or no nodes reported (the backend decides)."""
    if pods <= 0:
        return []
    mine = pool_fleet(fleet, spec)
    if spec.gpus <= 0 or (not len(mine) and not spec.node_selector):
        return [""] * pods
    joined = {n for n in near if n in mine.loads}
    if joined:
        domains = {mine.loads[n].node.domain_key for n in joined}
        keep = {n: load for n, load in mine.loads.items()
                if (n in joined if topology == "node" else load.node.domain_key in domains)}
        mine = Fleet(())
        mine.loads.update(keep)
        if topology == "node" and len(joined) > 1:
            return []  # made apart (a backend that chose otherwise): nothing joins both
    placed = place(mine, Ask(pods, spec.gpus, cast(Topology, topology)))
    return placed.nodes() if placed is not None else []


def held_beside(fleet: Fleet, pods: Iterable[Pod], owner: tuple[SessionKey, bool], topology: str,
                near: Sequence[str], now: float) -> list[Pod]:
    """The idle pods held for a waiting confined gang's caller that its claim takes before never-used ones
    (broker.claiming.setsearch: its session's, and with `recycle` its caller's other sessions'), within one group
    (node, or domain): the group of the pods already made for the set (`near`), else the one holding most of
    them. The set made for the gang is only the rest, made beside them."""
    key, recycle = owner
    held = [p for p in pods if p.state is PodState.IDLE and p.key is not None and p.key[0] == key[0]
            and (recycle or p.key == key) and p.hold_until > now and not p.standby and not p.image
            and p.reserved_for is None]
    if not held:
        return []

    def group(node: str) -> str:
        load = fleet.loads.get(node)
        return load.node.domain_key if topology == "domain" and load is not None else node

    by_group: dict[str, list[Pod]] = {}
    for pod in held:
        by_group.setdefault(group(pod.node), []).append(pod)
    if near:
        return by_group.get(group(near[0]), [])
    return max(by_group.values(), key=len)


def set_ceilings(nodes: Iterable[Node], pools: Mapping[str, PoolSpec],
                 seen: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, dict[str, int]]:
    """pool -> {`node`: n, `domain`: m}: the most pods of the pool one node, or one topology domain, can ever hold
    (every GPU of the pool's nodes counted, busy or free; never two pods on one card). A pool whose nodes say
    nothing (a CPU pool, no nodes reported, none match its `node_selector`) is left out: its limit is unknown.
    `seen`: the ceilings measured before under the same catalog; a ceiling never drops below them, so a large node
    that is briefly out (NotReady, cordoned for maintenance) fails no gang that only it can hold."""
    fleet = Fleet(nodes)
    out: dict[str, dict[str, int]] = {}
    for name, spec in pools.items():
        mine = pool_fleet(fleet, spec) if spec.gpus > 0 else Fleet(())
        before = (seen or {}).get(name, {})
        if not len(mine):
            if before:
                out[name] = dict(before)
            continue
        per_domain: dict[str, int] = {}
        for load in mine.loads.values():
            per_domain[load.node.domain_key] = per_domain.get(load.node.domain_key, 0) + load.node.size // spec.gpus
        out[name] = {"node": max(max(load.node.size for load in mine.loads.values()) // spec.gpus,
                                 before.get("node", 0)),
                     "domain": max(max(per_domain.values()), before.get("domain", 0))}
    return out


def largest_names(nodes: Iterable[Node], pools: Mapping[str, PoolSpec], ceilings: Mapping[str, Mapping[str, int]],
                  seen: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, dict[str, str]]:
    """pool -> {`node`: the node, `domain`: the domain that holds the pool's ceiling (`set_ceilings`), first by
    name}, for the refusal to name what the operator would have to grow; a ceiling that stands from an earlier
    pass (its node briefly out) keeps the name seen then."""
    fleet = Fleet(nodes)
    out: dict[str, dict[str, str]] = {}
    for name, ceiling in ceilings.items():
        spec = pools.get(name)
        names = dict((seen or {}).get(name, {}))
        if spec is not None and spec.gpus > 0:
            loads = sorted(pool_fleet(fleet, spec).loads.values(), key=lambda load: load.node.id)
            per_domain: dict[str, int] = {}
            for load in loads:
                per_domain[load.node.domain_key] = per_domain.get(load.node.domain_key, 0) + load.node.size // spec.gpus
            node = next((load.node.id for load in loads if load.node.size // spec.gpus == ceiling.get("node")), "")
            domain = next((d for d in sorted(per_domain) if per_domain[d] == ceiling.get("domain")), "")
            names.update({k: v for k, v in (("node", node), ("domain", domain)) if v})
        if names:
            out[name] = names
    return out


def never_fits(ceilings: Mapping[str, Mapping[str, int]], spec: PoolSpec, pods: int, topology: str,
               names: Mapping[str, Mapping[str, str]] | None = None) -> str | None:
    """Why a set of `pods` confined to one `topology` (node | domain) can never be placed in the pool, or None
    when it could be (or the pool's limit is unknown: then it waits). `names` (`largest_names`) names it."""
    most = ceilings.get(spec.name, {}).get(topology)
    if most is None or pods <= most:
        return None
    named = (names or {}).get(spec.name, {}).get(topology, "")
    return (f"{pods} pods of {spec.gpus} GPUs must share one {topology} (topology: {topology}), but the largest "
            f"{topology} of pool {spec.name!r} holds {most} such pods" + (f" ({topology} {named})" if named else ""))
