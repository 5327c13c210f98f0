"""A local pod's network: `none`, `isolated` (the default) or `host`, and the user-mode stack of `isolated`.

`isolated` gives each sandbox its own network namespace (bwrap `--unshare-net`) and plugs a tap device
into it, served by slirp4netns from the host side: outbound TCP/UDP leaves through ordinary sockets of
the helper (NAT), DNS goes to slirp's resolver at 10.0.2.3, and `--disable-host-loopback` refuses every
connection to the host's 127.0.0.0/8, so a job cannot reach the job store, the broker, MCP or Jupyter
listening there. What listens on the host's other addresses is reachable like any other host on the
network; firewall it if it must not be (docs/networking.md).

The helper dies with the pod: its `--exit-fd` is a pidfd of the sandbox's PID 1, which polls readable
when that process exits, and the pod's tear-down kills it too (by pid and start time, as pods are).
It is started once the agent answers: bwrap configures the namespace's loopback after it reports the
sandbox's pid, and slirp4netns bringing `lo` up at the same moment fails one of them.

Kernel ports: a pod whose pool serves Jupyter kernels gets five host ports on 127.0.0.1 forwarded (slirp's
`add_hostfwd`) to fixed ports in its namespace, so the host's Jupyter and MCP servers can dial its kernel.
The helper's API socket lives only while the forwards are added (a private temporary directory: unix
socket paths are short), so nothing adds forwards later. The host ports close when the helper exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.errors import BackendError
from firepool_agent import proctree

STACK = "slirp4netns"
DNS_SERVER = "10.0.2.3"
"""slirp4netns's built-in resolver (the namespace's /etc/resolv.conf names it)."""
READY_TIMEOUT_S = 10.0
_EXIT_FD = 3
_READY_FD = 4
KERNEL_GUEST_PORTS = (47101, 47102, 47103, 47104, 47105)
"""The ports a kernel binds in its pod's own namespace (every pod has its own, so these never collide)."""
KERNEL_PORTS_ENV = "FIREPOOL_KERNEL_PORTS"
"""`guest:host,...` for a kernel job on a pod with forwarded ports (set by the broker, never by a caller)."""
API_TIMEOUT_S = 5.0


def unshares(mode: str) -> bool:
    """True when the sandbox gets its own network namespace (every mode but `host`)."""
    return mode != "host"


def stack_path() -> str | None:
    return shutil.which(STACK)


def install_hint() -> str:
    return f"{STACK} is not installed (apt-get install {STACK}); or give the pool `network: host` or `none`"


def resolv_conf() -> str:
    return f"nameserver {DNS_SERVER}\n"


async def attach(pid: int, log_path: Path, api_socket: Path | None = None) -> tuple[int, int | None]:
    """Plug a slirp4netns tap into the network namespace of `pid`; returns the helper's pid and start time
    once the namespace has its address and default route. BackendError when it cannot. With `api_socket`
    the helper listens there for `forward`."""
    stack = stack_path()
    if stack is None:
        raise BackendError(install_hint())
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise BackendError(f"the sandbox {pid} is gone before its network came up: {exc}") from exc
    ready_r, ready_w = os.pipe()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    moved: list[int] = []
    argv = [stack, "--configure", "--disable-host-loopback", "--mtu", "65520", "--enable-sandbox", "--enable-seccomp",
            "--exit-fd", str(_EXIT_FD), "--ready-fd", str(_READY_FD),
            *(["--api-socket", str(api_socket)] if api_socket is not None else []), str(pid), "tap0"]
    try:
        actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2),
                   (os.POSIX_SPAWN_DUP2, _away(pidfd, moved), _EXIT_FD),
                   (os.POSIX_SPAWN_DUP2, _away(ready_w, moved), _READY_FD)]
        # Its own session: a broker restart (or a signal to the broker's group) leaves pods' networks up.
        helper = os.posix_spawn(stack, argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, file_actions=actions,
                                setsid=True, setsigdef=(signal.SIGPIPE,), setsigmask=())
    except OSError as exc:
        os.close(ready_r)
        raise BackendError(f"cannot start {STACK}: {exc}") from exc
    finally:
        for fd in (pidfd, ready_w, log_fd, *moved):
            os.close(fd)
    start = _starttime(helper)
    try:
        if not await _ready(ready_r, helper):
            raise BackendError(f"{STACK} did not configure the sandbox's network: {_tail(log_path)}")
    except BaseException:
        detach(helper, start)
        raise
    return helper, start


def api_dir() -> Path:
    """A private, short directory for one helper's API socket (a unix socket path has ~107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="fp-net-"))


def encode_ports(ports: dict[int, int]) -> str:
    return ",".join(f"{guest}:{host}" for guest, host in sorted(ports.items()))


def forward(api_socket: Path, guest_ports: tuple[int, ...], host: str = "127.0.0.1") -> dict[int, int]:
    """Forward a free port on the host's `host` to each guest port; returns guest -> host port. A port taken
    between the probe and slirp's bind is probed again. BackendError when the helper refuses."""
    mapping: dict[int, int] = {}
    for guest in guest_ports:
        for _ in range(8):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
                port = int(probe.getsockname()[1])
            answer = _api(api_socket, {"execute": "add_hostfwd", "arguments": {
                "proto": "tcp", "host_addr": host, "host_port": port, "guest_port": guest}})
            if "return" in answer:
                mapping[guest] = port
                break
        else:
            raise BackendError(f"{STACK} could not forward a host port to guest port {guest}: {answer}")
    return mapping


def _api(path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """One request on the helper's API socket (it answers one JSON object, then closes)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(API_TIMEOUT_S)
            _connect(s, path)
            s.sendall(json.dumps(request).encode())
            s.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError as exc:
        raise BackendError(f"{STACK}'s API at {path} failed: {exc}") from exc
    try:
        answer = json.loads(data)
    except ValueError as exc:
        raise BackendError(f"{STACK}'s API answered {data[:200]!r}") from exc
    return answer if isinstance(answer, dict) else {"error": answer}


def _connect(s: socket.socket, path: Path) -> None:
    """Connect, waiting briefly for the helper to listen (its ready signal may come first)."""
    deadline = time.monotonic() + API_TIMEOUT_S
    while True:
        try:
            s.connect(str(path))
            return
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


def detach(pid: int | None, start: int | None) -> None:
    """Kill the network helper (when it is still the process started at `start`) and reap it if ours."""
    if not pid:
        return
    proc = proctree.read_proc(pid)
    if proc is not None and (start is None or proc.starttime == start):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    """Wait briefly for our own child; a helper started by an earlier broker is reaped by init."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done == pid or time.monotonic() > deadline:
            return
        time.sleep(0.002)


async def _ready(fd: int, helper: int) -> bool:
    os.set_blocking(fd, False)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(fd, 16)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            return data.startswith(b"1")
        return False
    finally:
        os.close(fd)


def _away(fd: int, moved: list[int]) -> int:
    """`fd`, or a duplicate of it when it sits on a number the child's fds are dup2'ed to."""
    while fd in (_EXIT_FD, _READY_FD):
        fd = os.dup(fd)
        moved.append(fd)
    return fd


def _starttime(pid: int) -> int | None:
    proc = proctree.read_proc(pid)
    return proc.starttime if proc is not None else None


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-400:].strip() or "(no output)"
    return "(no output)"
