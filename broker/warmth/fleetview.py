"""What an operator sees of the fleet: nodes, and `largest_placeable` per pool and per accelerator.

`largest_placeable` is the primary capacity figure (design §9.1): for each shape (1, 2, 4, 8 GPUs on one
node, and whole nodes) how many allocations could be placed now. A pool sees the nodes its
`node_selector` and accelerator admit; a CPU pool has none. `GET /v1/pools` and `/metrics` show these.
"""

from __future__ import annotations

from typing import Any

from broker.fleet.capacity import largest_placeable, largest_set
from broker.fleet.nodes import Fleet
from broker.pools import PoolSpec
from broker.warmth.placing import pool_fleet


def placeable_view(fleet: Fleet, spec: PoolSpec) -> dict[str, Any]:
    """A pool's `largest_placeable` (empty for a CPU pool or without nodes), its topology and node count."""
    mine = pool_fleet(fleet, spec) if spec.gpus > 0 else Fleet(())
    return {"topology": spec.topology, "node_selector": dict(spec.node_selector), "nodes": len(mine),
            "largest_placeable": largest_placeable(mine) if len(mine) else {},
            "largest_set": largest_set(mine) if len(mine) else {}}


def fleet_view(fleet: Fleet) -> dict[str, Any]:
    """Every node (id, domain, model, GPUs, free, boot epoch) and per accelerator `largest_placeable`."""
    nodes = [{"id": load.node.id, "domain": load.node.domain, "model": load.node.model, "gpus": load.node.size,
              "free": load.free, "boot_epoch": load.node.boot_epoch, "shape_affinity": load.affinity}
             for load in fleet.loads.values()]
    models = sorted({load.node.model for load in fleet.loads.values()})
    by_model = {m: fleet.subset(model=m) for m in models}
    return {"nodes": nodes,
            "accelerators": {m: {"nodes": len(f), "gpus": f.total, "free": f.free,
                                 "largest_placeable": largest_placeable(f), "largest_set": largest_set(f)}
                             for m, f in by_model.items()}}
