"""Gang topology: the rank and rendezvous variables each rank of a job gets, bound when the job starts.

Pods boot as generic workers; a job's topology arrives with its launch. Rank 0 is the coordinator:
`MASTER_ADDR:MASTER_PORT` is an address of rank 0's pod (reported by the backend) and a port the
backend found free there. Every pod runs one rank, so a pod is a torchrun "node": `NODE_RANK` is the
rank, `LOCAL_RANK` 0, and the `PET_*` variables let a plain `torchrun script.py` on each pod form the
gang (`--nproc-per-node` stays the caller's choice). These names are injected after the caller's env,
and admission drops them from it, so a caller can never steer a gang's rendezvous.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one attempt meet: rank 0's pod address and a port free there."""

    addr: str
    port: int
    env: tuple[tuple[str, str], ...] = ()
    """Further variables every rank needs to reach the others (e.g. GLOO_SOCKET_IFNAME for a gang link)."""
    kernel_env: tuple[tuple[str, str], ...] = ()
    """Variables a kernel job (`kernel: true`) on rank 0's pod gets: the host ports forwarded to its kernel."""


TOPOLOGY_NAMES: frozenset[str] = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
})
"""torch.distributed's rank and rendezvous variables; the caller may set none of them."""

TOPOLOGY_PREFIXES: tuple[str, ...] = ("PET_", "TORCHELASTIC_")
"""torchrun reads its flags from `PET_*` and its agent state from `TORCHELASTIC_*`."""


def topology_env(rank: int, world: int, rdzv: Rendezvous) -> dict[str, str]:
    """The variables rank `rank` of a `world`-pod gang gets (one rank per pod)."""
    r, w, addr, port = str(rank), str(world), rdzv.addr, str(rdzv.port)
    return {
        "MASTER_ADDR": addr, "MASTER_PORT": port, "RANK": r, "WORLD_SIZE": w,
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": r, "GROUP_RANK": r, "GROUP_WORLD_SIZE": w,
        "PET_NNODES": w, "PET_NODE_RANK": r, "PET_MASTER_ADDR": addr, "PET_MASTER_PORT": port,
        "FIREPOOL_RANK": r, "FIREPOOL_WORLD_SIZE": w, "FIREPOOL_NNODES": w, "FIREPOOL_NODE_RANK": r,
        "FIREPOOL_MASTER_ADDR": addr, "FIREPOOL_MASTER_PORT": port,
        "FIREPOOL_COORDINATOR": "1" if rank == 0 else "0", **dict(rdzv.env),
    }
