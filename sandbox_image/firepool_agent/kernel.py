"""Agent kernel mode: start an ipykernel in this pod and report how to reach it.

A kernel job (`kernel: true`) runs `python3 -m firepool_agent.kernel`. The launcher makes a fresh HMAC
key and a CurveZMQ key pair (every channel is encrypted: on a shared host network another sandbox could
otherwise subscribe to the kernel's output), lets ipykernel bind five ports of its choice, and writes one
JSON line to the pipe the agent named in FIREPOOL_KERNEL_REPORT_FD:

    {"ip": ..., "transport": "tcp", "shell_port": ..., "key": ..., "curve_secretkey": ..., ...}

Never to stdout or stderr: a job's log is stored, copied and shown, and a key in it would let whoever
reads the log run code in the kernel. The agent keeps the line for the attempt and serves it to the broker,
which serves it to the job's owner alone (`GET /v1/jobs/{id}/kernel`). Without that pipe (the launcher run
by hand) nothing is reported; the connection file stays in the pod's private TMPDIR (mode 0600) either way.
Importing this module is cheap: the agent uses `prepare_env` and never imports ipykernel itself.

On an isolated local pod the broker forwards five host ports on 127.0.0.1 to fixed ports in the pod's
namespace and says so in FIREPOOL_KERNEL_PORTS (`guest:host,...`): the kernel then binds those guest
ports on every address of its namespace and reports 127.0.0.1 and the host ports.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
from collections.abc import MutableMapping
from typing import Any

from firepool_agent.kernel_bind import REPORT_FD_ENV

PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
FORWARDED_ENV = "FIREPOOL_KERNEL_PORTS"
WORKING_DIR_ENV = "KERNEL_WORKING_DIR"
"""The kernel's cwd, relative to the job's, when that directory exists in the sandbox (Enterprise Gateway's
variable; a Jupyter server sends its own notebook directory, which a sandbox usually lacks: then ignored)."""
POD_IP_ENV = "FIREPOOL_KERNEL_IP"
"""Set by a backend whose pods have an address of their own (Kubernetes: the pod IP): the kernel binds and
reports it, whatever `--ip` a client asked for, since a pod's loopback is reachable from nowhere else."""


def forwarded_ports(raw: str) -> list[tuple[int, int]] | None:
    """FIREPOOL_KERNEL_PORTS as (guest, host) pairs, one per channel; None when unset or malformed."""
    try:
        pairs = [(int(g), int(h)) for g, _, h in (item.partition(":") for item in raw.split(",") if item)]
    except ValueError:
        return None
    return pairs if len(pairs) == len(PORTS) else None


def agent_root() -> str:
    """The directory that holds the `firepool_agent` package (what kernel jobs need on sys.path)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare_env(env: MutableMapping[str, str]) -> None:
    """A kernel job can import this launcher: the agent's package root goes first on PYTHONPATH."""
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = agent_root() + (os.pathsep + existing if existing else "")


def advertised_ip(bind: str, advertise: str) -> str:
    """The address the Jupyter server dials: given, the bind address, or this pod's own address."""
    if advertise:
        return advertise
    if bind not in ("0.0.0.0", "*", ""):
        return bind
    try:  # a Kubernetes pod's hostname resolves to its pod IP
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def connection_line(info: dict[str, Any]) -> bytes:
    return (json.dumps(info, separators=(",", ":"), sort_keys=True) + "\n").encode()


def take_report_fd(env: MutableMapping[str, str]) -> int:
    """The agent's report pipe, -1 when none; the variable is removed so the kernel's code never sees it."""
    raw = env.pop(REPORT_FD_ENV, "")
    try:
        fd = int(raw)
        os.fstat(fd)
        os.set_inheritable(fd, False)
    except (ValueError, OSError):
        return -1
    return fd


def curve_keys() -> dict[str, str]:
    """A fresh CurveZMQ key pair (Z85 text), or none when this libzmq lacks CURVE."""
    import zmq

    if not zmq.has("curve"):
        return {}
    public, secret = zmq.curve_keypair()
    return {"curve_publickey": public.decode("ascii"), "curve_secretkey": secret.decode("ascii")}


def write_seed(path: str, bind: str, key: str, curve: dict[str, str], ports: list[int] | None = None) -> None:
    """A connection file with the given ports, or port 0 everywhere: ipykernel binds ports it picks and
    rewrites it."""
    seed = {"ip": bind, "transport": "tcp", "key": key, "signature_scheme": "hmac-sha256",
            **curve, **{name: (ports[i] if ports else 0) for i, name in enumerate(PORTS)}}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(seed, f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="firepool_agent.kernel", description=__doc__)
    parser.add_argument("--ip", default="127.0.0.1",
                        help="address the kernel binds (127.0.0.1 on a host-network local pod, 0.0.0.0 in a cluster)")
    parser.add_argument("--advertise", default="", help="address reported to the Jupyter server (default: derived)")
    parser.add_argument("--no-encryption", action="store_true", help="plain (HMAC-signed only) ZeroMQ channels")
    parser.add_argument("--prestarted", type=int, metavar="FD", default=None,
                        help="(the agent's) import now, then wait on this socket to be bound to a job")
    parser.add_argument("--restartable", action="store_true",
                        help="run the kernel in a child that SIGHUP replaces in place (firepool_agent.kernel_supervise)")
    parser.add_argument("--watch", default="", metavar="DIRS",
                        help="(the agent's, with --prestarted) report what the imports open or list under these")
    args, rest = parser.parse_known_args(argv)
    if args.prestarted is not None:
        from firepool_agent import kernel_bind

        watch = [d for d in args.watch.split(os.pathsep) if d]
        return main(kernel_bind.wait_for_bind(args.prestarted, watch))
    working_dir = os.environ.get(WORKING_DIR_ENV, "")
    if working_dir and os.path.isdir(working_dir):
        os.chdir(working_dir)  # a gateway client's KERNEL_WORKING_DIR, where the sandbox has it
    key = secrets.token_hex(32)
    curve = {} if args.no_encryption else curve_keys()
    tmp = os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(tmp, f"firepool-kernel-{os.getpid()}.json")
    forwarded = forwarded_ports(os.environ.get(FORWARDED_ENV, ""))
    pod_ip = os.environ.get(POD_IP_ENV, "")
    ip = pod_ip or args.ip
    bind = "0.0.0.0" if ip in ("*", "") or forwarded else ip  # slirp dials the namespace's tap address
    write_seed(path, bind, key, curve, [g for g, _ in forwarded] if forwarded else None)
    to_host = dict(forwarded or [])
    report_fd = take_report_fd(os.environ)
    if report_fd < 0:
        print(f"firepool kernel: no report pipe ({REPORT_FD_ENV}); connection file {path}", file=sys.stderr)
    advertise = args.advertise or ("127.0.0.1" if forwarded else pod_ip)
    base = {"ip": advertised_ip(ip, advertise), "key": key, "signature_scheme": "hmac-sha256",
            "pid": os.getpid(), "cwd": os.getcwd(), **curve}

    from ipykernel.kernelapp import IPKernelApp

    class ReportingApp(IPKernelApp):
        def write_connection_file(self, **kwargs: Any) -> None:
            # The ports are bound now: report them at once, so the Jupyter side connects while IPython is
            # still setting up its shell (messages wait in the bound sockets).
            super().write_connection_file(**kwargs)
            if report_fd >= 0:
                bound = {name: int(getattr(self, name)) for name in PORTS}
                info = {**base, "transport": self.transport, **{n: to_host.get(p, p) for n, p in bound.items()}}
                os.write(report_fd, connection_line(info))

    def run(report: bool) -> int:
        nonlocal report_fd
        if not report:
            report_fd = -1  # a restarted child: the broker holds the line already, and the pipe is closed
        app = ReportingApp.instance()
        try:
            app.initialize(["-f", path, *rest])  # type: ignore[no-untyped-call]
        finally:
            if report_fd >= 0:
                os.close(report_fd)  # EOF for the agent; no child of the kernel inherits it
        app.start()  # type: ignore[no-untyped-call]
        return 0

    if args.restartable:
        from firepool_agent.kernel_supervise import supervise

        return supervise(run, report_fd)
    return run(True)


if __name__ == "__main__":
    sys.exit(main())
