"""Ray mode for gangs (`mode: ray`): an ephemeral Ray cluster over the job's pods, formed at job start.

Rank 0 runs a Ray head at the gang's rendezvous (`MASTER_ADDR:MASTER_PORT` is the GCS address), waits
until every rank's node has registered, then runs the job's command as the driver with `RAY_ADDRESS`
set; its exit status is the job's. Every other rank runs a Ray worker node that joins the head and leaves
when the head goes away (the driver finished), exiting 0. Each `ray start --block` runs in its own
process group and is stopped with it; the pod's reset then kills whatever is left (a PID namespace holds
no daemon past it) and empties /tmp and /dev/shm, so the pods return to the pool as independent warm
workers and no Ray process survives (the reset proof counts them).

The agent wraps the launch (`wrap`, from `binding.prepare`); this module is also the wrapper's main:
`python -c <import this module's main> head|worker TEMP_DIR -- COMMAND...`. Ray must be installed in the pod's
Python (the `ray` extra); without it the attempt fails with a LaunchError-like exit and says why. The
daemons' flags and environment trim Ray's bootstrap; docs/health.md ("Bootstrap") says what and why.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from firepool_agent.attempt import LaunchSpec

JOIN_TIMEOUT_S = 120.0
"""How long the head waits for every rank's node, and a worker for the head."""
POLL_S = 0.1
HEAD_GONE_AFTER = 3
"""Failed connects in a row to the head's GCS port after which a worker leaves."""
OBJECT_STORE_BYTES = 100 * (1 << 20)
"""A small object store (Ray's minimum is 75 MiB): a pod's /dev/shm is capped; jobs may raise it with
FIREPOOL_RAY_OBJECT_STORE_BYTES."""
NO_RAY_EXIT = 127
TIMELINE = "firepool ray: timeline "
"""Prefix of the head's one line of phase times (epoch seconds) in the job's log; `firepool bench gangs` reads it."""

DAEMON_ENV = {
    # No usage report: a sandbox has nowhere to send it, and the head's API server only runs its reporter.
    "RAY_USAGE_STATS_ENABLED": "0",
    # Each raylet starts its num_cpus Python workers as soon as it is up (Ray PR 33591), so they boot while
    # the other nodes join and the driver starts, rather than when the driver registers: by default a raylet
    # holds the first driver's registration until those workers have started (Ray issue 40131).
    "RAY_enable_worker_prestart": "1",
    "RAY_prestart_worker_first_driver": "0",
}
"""Environment of the `ray start` daemons of every rank (Ray reads `RAY_<config>` at process start)."""


def pod_cpus() -> int:
    """CPUs this pod may use: its affinity, capped by its cgroup's CPU quota (a pod's limit, not the host's cores).

    Ray reads only the root cgroup's quota; a pod's limit sits on its own cgroup (a local-backend pod joins one
    below the root), so without this a raylet counts the host's cores and sizes its worker pool to them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpu_quota()
    return max(1, min(cpus, int(quota))) if quota is not None else cpus


def _cgroup_cpu_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The CPU quota (in CPUs) of this process's cgroup, v2 `cpu.max` or v1 `cpu.cfs_quota_us`; None when unlimited."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        path = path.lstrip("/")
        try:
            if controllers == "":  # v2: one unified tree
                with open(os.path.join(root, path, "cpu.max")) as f:
                    quota, period = f.read().split()
            elif "cpu" in controllers.split(","):
                base = os.path.join(root, controllers)
                with (
                    open(os.path.join(base, path, "cpu.cfs_quota_us")) as f,
                    open(os.path.join(base, path, "cpu.cfs_period_us")) as g,
                ):
                    quota, period = f.read().strip(), g.read().strip()
            else:
                continue
        except (OSError, ValueError):
            continue
        if quota not in ("max", "-1") and float(period) > 0:
            return float(quota) / float(period)
    return None


def wrap(
    argv: Sequence[str], env: Mapping[str, str], extra: Mapping[str, Any], run_dir: str
) -> tuple[str, ...] | None:
    """The launch argv of a `mode: ray` rank (head on rank 0, worker elsewhere); None when not in Ray mode.

    Ray's session directory goes under the agent's run dir, which every reset empties (the pod's /tmp is
    kept within a session): short enough for Ray's Unix socket paths, or a /tmp one the wrapper removes."""
    if extra.get("mode") != "ray":
        return None
    role = "head" if env.get("FIREPOOL_RANK", "0") == "0" else "worker"
    temp_dir = os.path.join(run_dir, "ray")
    if len(temp_dir) > 40:
        temp_dir = f"/tmp/fp-ray-{role}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    # The wrapper imports this module from the agent's root; the job's own env (and the driver's) does not
    # get the agent on its path.
    boot = (
        f"import sys; sys.path.insert(0, {_agent_root()!r}); "
        "from firepool_agent.raymode import main; sys.exit(main())"
    )
    return (sys.executable, "-c", boot, role, temp_dir, "--", *argv)


def _agent_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def own_address(peer: str) -> str:
    """The address of this pod's interface that reaches `peer` (rank 0's address: a gang link, a pod IP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, 9))  # UDP: no packet is sent, the kernel only picks the route
            return str(s.getsockname()[0])
        except OSError:
            return peer


def reachable(addr: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def _ray_cli() -> list[str]:
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def _start_args(node_ip: str, temp_dir: str) -> list[str]:
    store = int(os.environ.get("FIREPOOL_RAY_OBJECT_STORE_BYTES", OBJECT_STORE_BYTES))
    return [
        "--block",
        "--node-ip-address",
        node_ip,
        "--num-cpus",
        str(pod_cpus()),
        "--object-store-memory",
        str(store),
        "--disable-usage-stats",
        "--temp-dir",
        temp_dir,
    ]


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*_ray_cli(), "start", *args],
        env={**os.environ, **DAEMON_ENV},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a `ray start --block` and every daemon of its process group at once.

    No graceful stop: the cluster lives for one job, nothing in it is kept (the session directory is removed
    below and the reset empties /dev/shm), and a SIGTERM'd raylet first drains, holding the job's end for
    seconds."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _alive_nodes(address: str, world: int, deadline: float) -> int:
    """Read the GCS node table until `world` nodes are alive; the count seen.

    A plain GCS client, as `ray start` checks its own node: connecting as a driver (`ray.init`) would
    register a job and make the head's raylet start workers for it, in the driver's way."""
    state_mod: Any = importlib.import_module("ray._private.state")  # only in the wrapper, never in the agent
    services: Any = importlib.import_module("ray._private.services")
    state = state_mod.GlobalState()
    state._initialize_global_state(services._get_gcs_client_options(address))
    alive = 0
    while time.monotonic() < deadline:
        try:
            alive = sum(1 for n in state.node_table() if n.get("Alive"))
        except Exception:  # noqa: BLE001 - the GCS answers its port before its tables: ask again
            alive = 0
        if alive >= world:
            break
        time.sleep(POLL_S)
    return alive


def head(command: Sequence[str], temp_dir: str) -> int:
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    node_ip = own_address(addr)
    times = {"wrapper_at": time.time()}
    # The autoscaler's monitor has nothing to scale in a cluster of fixed size: --no-monitor (as KubeRay
    # starts heads whose autoscaler runs elsewhere).
    proc = _spawn(
        [
            "--head",
            "--port",
            str(port),
            "--include-dashboard",
            "false",
            "--no-monitor",
            *_start_args(node_ip, temp_dir),
        ]
    )
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not reachable(node_ip, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                print(
                    f"firepool ray: the head did not start (ray start exited {proc.poll()})", file=sys.stderr
                )
                return 1
            time.sleep(POLL_S)
        times["gcs_up_at"] = time.time()
        address = f"{node_ip}:{port}"
        alive = _alive_nodes(address, world, deadline)
        if alive < world:
            print(
                f"firepool ray: {alive} of {world} nodes joined within {JOIN_TIMEOUT_S:.0f} s",
                file=sys.stderr,
            )
            return 1
        times["nodes_up_at"] = time.time()
        print(f"firepool ray: {world} node(s) up at {address}; driver starts", file=sys.stderr)
        print(TIMELINE + json.dumps(times), file=sys.stderr, flush=True)
        driver_env = {**os.environ, "RAY_ADDRESS": address, "FIREPOOL_RAY_ADDRESS": address}
        return subprocess.call(list(command), env=driver_env)
    finally:
        _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def worker(temp_dir: str) -> int:
    """Join the head and stay until it goes away.

    `ray start` runs at once, beside the head's: its Python start-up (about as long as the head's) overlaps the
    head's, and Ray's own connect retries (NUM_REDIS_GET_RETRIES, 1 s apart) wait out a GCS not up yet."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    args = ["--address", f"{addr}:{port}", *_start_args(own_address(addr), temp_dir)]
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    proc = _spawn(args)
    try:
        seen = False
        misses = 0
        while True:
            up = reachable(addr, port)
            seen = seen or up
            misses = 0 if up else misses + 1
            if seen and misses >= HEAD_GONE_AFTER:
                return 0  # the head went away: the driver finished
            if proc.poll() is not None:
                if seen and _goes_away(addr, port):
                    return 0  # the node stopped with the head
                if time.monotonic() > deadline:
                    why = (
                        "never answered"
                        if not seen
                        else f"would not take this node (ray start exited {proc.returncode})"
                    )
                    print(f"firepool ray: the head at {addr}:{port} {why}", file=sys.stderr)
                    return proc.returncode or 1
                proc = _spawn(args)  # the head was not up yet, or would not take the node yet (a loaded GCS)
            time.sleep(POLL_S * 2)
    finally:
        _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _goes_away(addr: str, port: int, within_s: float = 3.0) -> bool:
    """Does the head stop answering within `within_s` (it is shutting down after the driver)?"""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not reachable(addr, port):
            return True
        time.sleep(POLL_S)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[0] not in ("head", "worker") or args[2] != "--":
        print("usage: raymode head|worker TEMP_DIR -- COMMAND...", file=sys.stderr)
        return 2
    if importlib.util.find_spec("ray") is None:  # not imported: `ray start` imports it, in parallel
        print(
            "firepool ray: `mode: ray` needs Ray in the pod's Python (the ray extra: pip install -e '.[ray]')",
            file=sys.stderr,
        )
        return NO_RAY_EXIT
    return head(args[3:], args[1]) if args[0] == "head" else worker(args[1])


def wrapped(spec: LaunchSpec, run_dir: str) -> LaunchSpec:
    """`spec` (a LaunchSpec) with its argv wrapped for Ray mode, or unchanged."""
    argv = wrap(spec.argv, spec.env, spec.extra, run_dir)
    return spec if argv is None else dataclasses.replace(spec, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
