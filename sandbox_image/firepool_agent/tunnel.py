"""Byte streams through the agent: the broker's one way into a server a job runs in the sandbox.

`GET /v1/tunnel?port=N` with `Connection: Upgrade` / `Upgrade: firepool-tcp` answers 101 and then splices
the broker's connection to 127.0.0.1:N in the sandbox's own network namespace: the sandbox keeps its network
isolation, and the broker (which holds the agent's secret) is the only door. Only a port that a process of
this sandbox listens on can be reached: on a pod that shares the host's network, 127.0.0.1:N could
otherwise be one of the host's own services (the broker's database, another pod's server).

The broker sends nothing after the upgrade request until it has read the 101, so no byte of the stream is
left in the request handler's read buffer. Other upgrades (terminals) reuse `switch_protocols`.
"""

from __future__ import annotations

import fcntl
import io
import os
import socket
import threading

from firepool_agent import proctree
from firepool_agent.wire import HttpError

PROTOCOL = "firepool-tcp"
CHUNK = 256 << 10
_LISTEN = "0A"
_ANY_OR_LOOPBACK = frozenset({
    "00000000", "0100007F",  # 0.0.0.0, 127.0.0.1 (little-endian hex in /proc/net/tcp)
    "00000000000000000000000000000000", "00000000000000000000000001000000",  # ::, ::1
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
})



def _listening_inodes(port: int, proc_root: str = "/proc") -> set[str]:
    """Socket inodes listening on `port` on a loopback or wildcard address of this network namespace."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and address in _ANY_OR_LOOPBACK:
                inodes.add(fields[9])
    return inodes


def listener_in_sandbox(port: int, proc_root: str = "/proc") -> bool:
    """Whether a process of this sandbox (a descendant of the agent) listens on `port`."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port, proc_root)}
    if not inodes:
        return False
    for proc in proctree.descendants(os.getpid()):
        fd_dir = f"{proc_root}/{proc.pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in inodes:
                    return True
            except OSError:
                continue
    return False


def switch_protocols(wfile: io.BufferedIOBase, protocol: str) -> None:
    wfile.write(f"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {protocol}\r\n\r\n"
                .encode("latin-1"))
    wfile.flush()


def open_port(port: int, agent_port: int | None, own_network: bool = False) -> socket.socket:
    """A connection to a server of this sandbox on `port`; HttpError (typed) when there is none.

    In a network namespace of the sandbox's own every listener is the sandbox's; in the host's, only one a
    process of the sandbox holds may be reached (reading /proc/net/tcp walks the host's whole socket table)."""
    if not 1 <= port <= 65535:
        raise HttpError(400, f"port must be 1-65535, got {port}")
    if port == agent_port:
        raise HttpError(403, f"port {port} is the agent's own")
    if not own_network and not listener_in_sandbox(port):
        raise HttpError(502, f"nothing in the sandbox listens on port {port} (on 127.0.0.1 or 0.0.0.0)")
    for address in ("127.0.0.1", "::1"):
        try:
            conn = socket.create_connection((address, port), timeout=5)
        except OSError:
            continue
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn
    raise HttpError(502, f"port {port} in the sandbox refused the connection")


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy src to dst until src ends, then half-close dst; an error cuts both sockets (so the other
    direction's blocking read returns too). In the kernel (splice(2) through a pipe) where it can."""
    quickack = src.family != socket.AF_UNIX and hasattr(socket, "TCP_QUICKACK")
    try:
        if quickack:
            src.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        if hasattr(os, "splice"):
            r, w = os.pipe()
            try:
                try:
                    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, CHUNK)
                except OSError:
                    pass  # the default 64 KiB pipe still works
                while n := os.splice(src.fileno(), w, CHUNK, flags=os.SPLICE_F_MOVE):
                    if quickack:  # the kernel drops back to delayed ACKs: ask again after every read
                        src.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                    while n:
                        n -= os.splice(r, dst.fileno(), n, flags=os.SPLICE_F_MOVE)
            finally:
                os.close(r)
                os.close(w)
        else:
            while data := src.recv(CHUNK):
                if quickack:
                    src.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides have ended; a half-close is passed on as one. A thread per
    direction on blocking sockets: a slow reader slows its writer (back-pressure), no poll loop per chunk."""
    a.setblocking(True)
    b.setblocking(True)
    back = threading.Thread(target=_pump, args=(b, a), name="tunnel-back", daemon=True)
    back.start()
    _pump(a, b)
    back.join()
