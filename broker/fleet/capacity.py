"""What the fleet could still place: `largest_placeable`, the primary capacity figure (design §9.1).

"204 GPUs free" is not an answer to "can this job run" (§3): a free count hides fragmentation. For each
shape (1, 2, 4, 8 GPUs on one node, and whole nodes) this counts how many allocations of that shape
could be placed right now, and `largest_set` gives the largest single set per topology
(`node`: the most free GPUs on one node, `domain`: in one domain, `any`: all free GPUs).
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.fleet.nodes import Fleet

SHAPES: tuple[int, ...] = (1, 2, 4, 8)


def largest_placeable(fleet: Fleet, shapes: Sequence[int] = SHAPES) -> dict[str, int]:
    """Allocations of each shape placeable now: {"1": n, "2": n, "4": n, "8": n, "node": whole free nodes}."""
    loads = list(fleet.loads.values())
    out = {str(shape): sum(load.free // shape for load in loads) for shape in shapes}
    out["node"] = sum(1 for load in loads if load.empty and load.node.size > 0)
    return out


def largest_set(fleet: Fleet) -> dict[str, int]:
    """The largest set placeable now per topology (the design's `GET /cluster/topology`, §3)."""
    loads = list(fleet.loads.values())
    return {
        "node": max((load.free for load in loads), default=0),
        "domain": max((sum(load.free for load in group) for group in fleet.domains().values()), default=0),
        "any": sum(load.free for load in loads),
    }


def summary(fleet: Fleet) -> dict[str, object]:
    """Nodes, GPUs, free GPUs, `largest_placeable` and `largest_set`: one view for the API and the CLI."""
    return {"nodes": len(fleet), "gpus": fleet.total, "free": fleet.free,
            "largest_placeable": largest_placeable(fleet), "largest_set": largest_set(fleet)}
