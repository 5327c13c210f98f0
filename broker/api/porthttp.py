"""One HTTP request, forwarded over a tunnel to a server in a sandbox and its answer streamed back.

Bodies flow chunk by chunk both ways (never buffered whole): the request's up to the proxy's own cap
(`PortSettings.max_body_bytes`, a 413 above it), the response's as the server writes it, with back-pressure
from the client's socket. Hop-by-hop headers are dropped both ways; the caller's `Authorization` and the
broker's own cookies never reach the sandbox, and a `Set-Cookie` of the broker's cookie names from the
sandbox never reaches the browser. A redirect to an absolute path is kept under the port's prefix.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import h11

from broker.errors import BackendError, InvalidRequest, RequestTooLarge

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

CHUNK = 256 << 10
HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
                 b"te", b"trailer", b"transfer-encoding", b"upgrade"})
"""Hop-by-hop headers (RFC 9110 7.6.1): they describe one connection, not the message."""
BROKER_COOKIES = ("firepool_",)
"""Cookie names that are the broker's (dashboard session, port grants): never passed to or from a sandbox."""
_NOT_FORWARDED = frozenset({b"authorization", b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-prefix",
                            b"x-forwarded-port", b"forwarded"})


@dataclass(frozen=True)
class Forward:
    """Where a request goes in the sandbox and how the app learns where it is served."""

    port: int
    prefix: str
    """The port's root as the client sees it (`/v1/sessions/{tag}/ports/{port}`, or "" in the host form)."""
    target: str
    """The path and query the sandbox's server gets."""


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """Headers a `Connection` header names as hop-by-hop for this message."""
    names: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            names |= {t.strip().lower() for t in value.split(b",") if t.strip()}
    return names


def without_broker_cookies(value: bytes) -> bytes:
    kept = [c.strip() for c in value.split(b";") if c.strip() and
            not c.strip().decode("latin-1").startswith(BROKER_COOKIES)]
    return b"; ".join(kept)


def upstream_headers(scope: Scope, fwd: Forward, drop: frozenset[bytes] = frozenset()) -> list[tuple[bytes, bytes]]:
    """The client's headers as the sandbox's server should see them, with `X-Forwarded-*` set."""
    raw = [(bytes(k).lower(), bytes(v)) for k, v in scope.get("headers", ())]
    listed = _connection_tokens(raw)
    out: list[tuple[bytes, bytes]] = []
    host = next((value for name, value in raw if name == b"host"), b"")
    prior_for = b""
    for name, value in raw:
        if name in HOP or name in listed or name in _NOT_FORWARDED or name in drop:
            continue
        if name == b"x-forwarded-for":
            prior_for = value
            continue
        if name == b"cookie":
            value = without_broker_cookies(value)
            if not value:
                continue
        out.append((name, value))
    if not host:
        host = b"localhost"
        if b"host" not in drop:
            out.insert(0, (b"host", host))
    client = scope.get("client") or ("", 0)
    scheme = str(scope.get("scheme") or "http")
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    out.append((b"x-forwarded-for", (prior_for + b", " if prior_for else b"") + str(client[0]).encode("latin-1")))
    out.append((b"x-forwarded-proto", scheme.encode("latin-1")))
    out.append((b"x-forwarded-host", host))
    if fwd.prefix:
        out.append((b"x-forwarded-prefix", fwd.prefix.encode("latin-1")))
    return out


def downstream_headers(headers: list[tuple[bytes, bytes]], fwd: Forward) -> list[tuple[bytes, bytes]]:
    """The server's response headers as the client gets them."""
    listed = _connection_tokens(headers)
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        name = name.lower()
        if name in HOP or name in listed:
            continue
        if name == b"set-cookie" and value.decode("latin-1").strip().startswith(BROKER_COOKIES):
            continue
        if name == b"location" and fwd.prefix and value.startswith(b"/") and not value.startswith(b"//") \
                and not value.startswith(fwd.prefix.encode("latin-1") + b"/"):
            value = fwd.prefix.encode("latin-1") + value
        out.append((name, value))
    return out


class _Disconnected(Exception):
    pass


async def _send_body(conn: h11.Connection, writer: asyncio.StreamWriter, receive: Receive, limit: int) -> None:
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        body = message.get("body", b"")
        total += len(body)
        if total > limit:
            raise RequestTooLarge(f"the request body is larger than {limit} bytes (the broker's "
                                  f"--port-max-body-bytes)", {"limit": limit})
        if body:
            writer.write(conn.send(h11.Data(data=body)) or b"")
            await writer.drain()
        if not message.get("more_body", False):
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
            return


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def forward(scope: Scope, receive: Receive, send: Send, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter, fwd: Forward, max_body: int) -> None:
    """Forward one request; a FirepoolError raised before the response started is the caller's to send."""
    conn = h11.Connection(h11.CLIENT)
    headers = upstream_headers(scope, fwd)
    incoming = {bytes(k).lower(): bytes(v) for k, v in scope.get("headers", ())}
    if b"transfer-encoding" in incoming and b"content-length" not in incoming:
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"connection", b"close"))  # one request per tunnel
    try:
        head = conn.send(h11.Request(method=scope["method"], target=fwd.target, headers=headers)) or b""
    except h11.LocalProtocolError as exc:
        raise InvalidRequest(f"this request cannot be passed on to the server: {exc}", {"field": "request"}) from exc
    try:
        writer.write(head)
        await _send_body(conn, writer, receive, max_body)
    except (OSError, h11.LocalProtocolError) as exc:
        raise BackendError(f"the server on port {fwd.port} closed the connection before reading the request "
                           f"({type(exc).__name__})", {"port": fwd.port}) from exc
    except _Disconnected:
        return
    respond = asyncio.ensure_future(_respond(conn, reader, send, fwd, scope["method"] == "HEAD"))
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({respond, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (respond, watch):
            task.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    if not respond.cancelled():
        respond.result()  # its FirepoolError (nothing sent yet) goes to the caller


def _raw_length(conn: h11.Connection, response: h11.Response) -> int | None:
    """Bytes of the body when it can be copied as is (a Content-Length), else None (chunked: h11 decodes)."""
    if conn.our_state is not h11.DONE or response.status_code in (204, 304) or conn.their_http_version is None:
        return None
    lengths = [v for k, v in response.headers if k == b"content-length"]
    if any(k == b"transfer-encoding" for k, _ in response.headers) or len(lengths) != 1 or not lengths[0].isdigit():
        return None
    return int(lengths[0])


async def _respond(conn: h11.Connection, reader: asyncio.StreamReader, send: Send, fwd: Forward,
                   head: bool) -> None:
    started = False
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(CHUNK))
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                await send({"type": "http.response.start", "status": event.status_code,
                            "headers": downstream_headers(list(event.headers), fwd)})
                started = True
                left = None if head else _raw_length(conn, event)
                if left is not None:  # copy the body as it comes, past h11's buffer (the fast path)
                    await _copy(bytes(conn.trailing_data[0]), left, reader, send)
                    return
            elif isinstance(event, h11.Data):
                await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
            elif isinstance(event, h11.EndOfMessage):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("the server closed the connection mid-response")
    except (OSError, h11.RemoteProtocolError, asyncio.IncompleteReadError) as exc:
        if not started:
            raise BackendError(f"the server on port {fwd.port} sent no valid HTTP response ({exc})",
                               {"port": fwd.port}) from exc
        raise ResponseCut(str(exc)) from exc  # the status is out: all the client can learn is a cut-off body


async def _copy(first: bytes, left: int, reader: asyncio.StreamReader, send: Send) -> None:
    chunk = first[:left]
    while True:
        left -= len(chunk)
        if left <= 0:
            await send({"type": "http.response.body", "body": chunk, "more_body": False})
            return
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        chunk = await reader.read(min(left, CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", left)


class ResponseCut(Exception):
    """A response cut off after it started: the client sees its connection end early."""
