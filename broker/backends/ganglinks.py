"""A gang's private link between the network namespaces of its pods (local backend, broker as root).

Ranks of torch.distributed (gloo, NCCL's socket bootstrap) do not only dial MASTER_ADDR: each listens on
a port of its own choosing and advertises its interface address, and every pair connects directly. So
the ranks of one job get one L2 segment and nothing else: a bridge `gang0` inside rank 0's namespace
(10.213.0.1/24) and, for every other rank, a veth pair whose inner end is `gang0` in that rank's namespace
(10.213.0.k+1/24) and whose outer end is a port of the bridge. Nothing of the segment is in the host's
namespace, and the jobs (no capabilities) cannot change it. The same subnet serves every gang: each
lives only inside its own pods' namespaces.

A link outlives its job while the pods sit idle (no process runs in a reset pod); `unlink` removes a
pod's side before its next job starts, which cuts the pair (deleting a veth end deletes its peer, and
deleting rank 0's bridge side takes every pair with it). Rank 0 binds torch's store on all addresses.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from broker.errors import BackendError

IFNAME = "gang0"
SUBNET = "10.213.0"
MAX_WORLD = 250
_TIMEOUT_S = 10.0


def address(rank: int) -> str:
    return f"{SUBNET}.{rank + 1}"


def env() -> tuple[tuple[str, str], ...]:
    """What every rank needs to bind the link, not the slirp tap or lo (gloo and NCCL pick by name)."""
    return (("GLOO_SOCKET_IFNAME", IFNAME), ("NCCL_SOCKET_IFNAME", IFNAME), ("TP_SOCKET_IFNAME", IFNAME))


def link(pids: Sequence[int], tag: str) -> None:
    """Join the namespaces of `pids` (rank order) into one segment; `tag` (a few hex digits) keeps the
    bridge ports' names unique in rank 0's namespace. BackendError when a step fails."""
    if len(pids) > MAX_WORLD:
        raise BackendError(f"a gang link holds at most {MAX_WORLD} ranks, not {len(pids)}")
    ip = shutil.which("ip") or "/usr/sbin/ip"
    root = pids[0]
    _in(root, ip, [f"link add {IFNAME} type bridge", f"addr add {address(0)}/24 dev {IFNAME}", f"link set {IFNAME} up"])
    for rank, pid in enumerate(pids[1:], start=1):
        port = f"g{tag[:8]}p{rank}"[:15]
        # Made in the host's namespace with both ends placed at once: it is never up there.
        _run([ip, "link", "add", port, "netns", str(root), "type", "veth", "peer", "name", IFNAME, "netns", str(pid)])
        _in(root, ip, [f"link set {port} master {IFNAME}", f"link set {port} up"])
        _in(pid, ip, [f"addr add {address(rank)}/24 dev {IFNAME}", f"link set {IFNAME} up"])


def unlink(pid: int) -> None:
    """Remove this pod's side of a gang link (its bridge or its veth end), if it has one."""
    ip = shutil.which("ip") or "/usr/sbin/ip"
    try:
        result = subprocess.run([_nsenter(), "-t", str(pid), "-n", ip, "link", "del", IFNAME], capture_output=True,
                                timeout=_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"cannot remove the gang link of sandbox {pid}: {exc}") from exc
    if result.returncode != 0 and b"Cannot find device" not in result.stderr:
        raise BackendError(f"cannot remove the gang link of sandbox {pid}: {result.stderr.decode(errors='replace')}")


def _in(pid: int, ip: str, commands: list[str]) -> None:
    """`ip -batch` inside the network namespace of `pid`: one process for several changes."""
    _run([_nsenter(), "-t", str(pid), "-n", ip, "-batch", "-"], "\n".join(commands) + "\n")


def _nsenter() -> str:
    return shutil.which("nsenter") or "/usr/bin/nsenter"


def _run(argv: list[str], stdin: str | None = None) -> None:
    try:
        result = subprocess.run(argv, input=stdin.encode() if stdin is not None else None, capture_output=True,
                                timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"gang link: {' '.join(argv[:6])}: {exc}") from exc
    if result.returncode != 0:
        raise BackendError(f"gang link: {' '.join(argv)}: {result.stderr.decode(errors='replace').strip()[:300]}")
