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
Python (`firepool[ray]`); without it the attempt fails with a LaunchError-like exit and says why.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
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
    from firepool_agent.attempts import LaunchSpec

JOIN_TIMEOUT_S = 120.0
"""How long the head waits for every rank's node, and a worker for the head."""
POLL_S = 0.1
HEAD_GONE_AFTER = 3
"""Failed connects in a row to the head's GCS port after which a worker leaves."""
OBJECT_STORE_BYTES = 100 * (1 << 20)
"""A small object store (Ray's minimum is 75 MiB): a pod's /dev/shm is capped; jobs may raise it with
FIREPOOL_RAY_OBJECT_STORE_BYTES."""
NO_RAY_EXIT = 127


def wrap(argv: Sequence[str], env: Mapping[str, str], extra: Mapping[str, Any], run_dir: str) -> tuple[str, ...] | None:
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
    boot = (f"import sys; sys.path.insert(0, {_agent_root()!r}); "
            "from firepool_agent.raymode import main; sys.exit(main())")
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
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    store = int(os.environ.get("FIREPOOL_RAY_OBJECT_STORE_BYTES", OBJECT_STORE_BYTES))
    return ["--block", "--node-ip-address", node_ip, "--num-cpus", str(cpus), "--object-store-memory", str(store),
            "--disable-usage-stats", "--temp-dir", temp_dir]


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*_ray_cli(), "start", *args], env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """Stop a `ray start --block` and every daemon of its process group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _wait_nodes(address: str, world: int, deadline: float) -> int:
    """Connect as a client until `world` nodes are alive; the count seen."""
    ray: Any = importlib.import_module("ray")  # only in the wrapper's process, never in the agent's
    while True:
        try:  # the GCS answers before the head's own node has registered: a client needs that node
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
            break
        except (ConnectionError, RuntimeError):
            if time.monotonic() > deadline:
                return 0
            time.sleep(POLL_S * 5)
    try:
        alive = 0
        while time.monotonic() < deadline:
            alive = sum(1 for n in ray.nodes() if n.get("Alive"))
            if alive >= world:
                break
            time.sleep(POLL_S)
        return alive
    finally:
        ray.shutdown()


def head(command: Sequence[str], temp_dir: str) -> int:
    env = dict(os.environ)
    addr, port, world = env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env.get("WORLD_SIZE", "1"))
    node_ip = own_address(addr)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    proc = _spawn(["--head", "--port", str(port), "--include-dashboard", "false",
                   *_start_args(node_ip, temp_dir)], env)
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while not reachable(node_ip, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                print(f"firepool ray: the head did not start (ray start exited {proc.poll()})", file=sys.stderr)
                return 1
            time.sleep(POLL_S)
        address = f"{node_ip}:{port}"
        alive = _wait_nodes(address, world, deadline)
        if alive < world:
            print(f"firepool ray: {alive} of {world} nodes joined within {JOIN_TIMEOUT_S:.0f} s", file=sys.stderr)
            return 1
        print(f"firepool ray: {world} node(s) up at {address}; driver starts", file=sys.stderr, flush=True)
        driver_env = {**env, "RAY_ADDRESS": address, "FIREPOOL_RAY_ADDRESS": address}
        return subprocess.call(list(command), env=driver_env)
    finally:
        _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def worker(temp_dir: str) -> int:
    env = dict(os.environ)
    addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    node_ip = own_address(addr)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not reachable(addr, port):
        if time.monotonic() > deadline:
            print(f"firepool ray: the head at {addr}:{port} never answered", file=sys.stderr)
            return 1
        time.sleep(POLL_S)
    args = ["--address", f"{addr}:{port}", *_start_args(node_ip, temp_dir)]
    proc = _spawn(args, env)
    try:
        misses = 0
        while misses < HEAD_GONE_AFTER:
            if proc.poll() is not None:
                if _goes_away(addr, port):
                    return 0  # the node stopped with the head: the driver finished
                if time.monotonic() > deadline:
                    print(f"firepool ray: this node could not join {addr}:{port} (ray start exited "
                          f"{proc.returncode})", file=sys.stderr)
                    return proc.returncode or 1
                # The head is up but would not take the node yet (a loaded GCS): join again.
                proc = _spawn(args, env)
            misses = 0 if reachable(addr, port) else misses + 1
            time.sleep(POLL_S * 2)
        return 0  # the head went away: the driver finished
    finally:
        _stop(proc, grace_s=5.0)
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
    try:
        importlib.import_module("ray")
    except ImportError:
        print("firepool ray: `mode: ray` needs Ray in the pod's Python (pip install 'firepool[ray]')",
              file=sys.stderr)
        return NO_RAY_EXIT
    return head(args[3:], args[1]) if args[0] == "head" else worker(args[1])


def wrapped(spec: LaunchSpec, run_dir: str) -> LaunchSpec:
    """`spec` (a LaunchSpec) with its argv wrapped for Ray mode, or unchanged."""
    argv = wrap(spec.argv, spec.env, spec.extra, run_dir)
    return spec if argv is None else dataclasses.replace(spec, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
