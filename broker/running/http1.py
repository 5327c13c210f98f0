"""A minimal keep-alive HTTP/1.1 client for the pod agent's small JSON calls (launch, wait, reset, ...).

The agent speaks a narrow dialect (`firepool_agent.server`): every reply carries Content-Length, no chunked
bodies, no redirects, no cookies. httpx handles all of those on every request, and under `bench throughput`
py-spy put a third of the broker's Python time in httpx and httpcore for two agent calls per job; this client
does only what the dialect needs, over asyncio streams. Failures raise `AgentUnreachable` (the caller turns it
into an `AgentError`); a reply with a status is never an exception here.

A connection idle longer than `IDLE_S` is dropped before reuse (the agent closes its idle ones after 300 s),
and one the agent closed meanwhile (EOF already seen) is never reused, so a request is never sent twice.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker import jsonwire

IDLE_S = 60.0
"""Idle connections older than this are closed rather than reused (below the agent's 300 s)."""
MAX_IDLE = 8
"""Idle connections kept per agent."""
MAX_HEADER = 64 << 10
STREAM_BUFFER = 1 << 20
"""An upgraded stream's read buffer (a port's download, a terminal's output): the transport stops reading
at twice this, so a small one would cut a fast stream into small reads."""


class AgentUnreachable(Exception):
    """No reply: the connection failed, broke, timed out or carried something that is not HTTP/1.1."""


@dataclass
class Reply:
    status_code: int
    headers: dict[str, str]
    """Lower-case names."""
    content: bytes

    def json(self) -> Any:
        return jsonwire.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0


class Http1Pool:
    """Keep-alive connections to one agent, on a Unix socket (`uds`) or TCP (`host`, `port`)."""

    def __init__(
        self, *, uds: str | None = None, host: str = "", port: int = 0, headers: dict[str, str],
        current: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """`headers` go with every request; so do `current()`'s, read anew for each (the sender's term grows)."""
        self.uds = uds
        self.host = host
        self.port = port
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host or "agent", **headers}.items())
        self._current = current
        self._idle: list[_Conn] = []
        self.closed = False

    def _head(self) -> str:
        if self._current is None:
            return self._fixed
        return self._fixed + "".join(f"{k}: {v}\r\n" for k, v in self._current().items())

    async def request(self, method: str, target: str, body: bytes | None, timeout: float) -> Reply:
        """One request and its reply; raises AgentUnreachable (or RuntimeError once closed)."""
        if self.closed:
            raise RuntimeError("the agent's client is closed")
        conn = self._take()
        try:
            async with asyncio.timeout(timeout):
                if conn is None:
                    conn = await self._connect()
                head = f"{method} {target} HTTP/1.1\r\n{self._head()}"
                if body is not None:
                    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                conn.writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
                reply, keep = await _read_reply(conn.reader)
        except (
            OSError,
            EOFError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ValueError,
        ) as exc:
            if conn is not None:
                conn.writer.close()
            raise AgentUnreachable(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:  # cancelled mid-request: the reply would confuse the next user
            if conn is not None:
                conn.writer.close()
            raise
        if keep and not self.closed and len(self._idle) < MAX_IDLE:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.writer.close()
        return reply

    async def upgrade(self, target: str, protocol: str, timeout: float
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | Reply:
        """A fresh connection switched to `protocol` (the agent answered 101), or the agent's refusal."""
        if self.closed:
            raise RuntimeError("the agent's client is closed")
        conn: _Conn | None = None
        try:
            async with asyncio.timeout(timeout):
                conn = await self._connect(STREAM_BUFFER)
                conn.writer.write(f"GET {target} HTTP/1.1\r\n{self._head()}Connection: Upgrade\r\n"
                                  f"Upgrade: {protocol}\r\n\r\n".encode("latin-1"))
                reply, _ = await _read_reply(conn.reader)
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError) as exc:
            if conn is not None:
                conn.writer.close()
            raise AgentUnreachable(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            if conn is not None:
                conn.writer.close()
            raise
        if reply.status_code == 101:
            sock = conn.writer.get_extra_info("socket")
            if sock is not None and sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn.reader, conn.writer
        conn.writer.close()
        return reply

    def _take(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_S and not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.writer.close()
        return None

    async def _connect(self, limit: int = MAX_HEADER) -> _Conn:
        if self.uds is not None:
            reader, writer = await asyncio.open_unix_connection(self.uds, limit=limit)
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=limit)
        return _Conn(reader, writer)

    async def aclose(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.writer.close()


async def _read_reply(reader: asyncio.StreamReader) -> tuple[Reply, bool]:
    """The status, headers and body of one reply, and whether the connection may carry another."""
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw[:-4].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x reply: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    if status == 101:  # the connection is the upgraded stream from here on
        return Reply(status, headers, b""), False
    if "transfer-encoding" in headers or "content-length" not in headers:
        raise ValueError("the agent's reply has no Content-Length")
    body = await reader.readexactly(int(headers["content-length"]))
    keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    return Reply(status, headers, body), keep
