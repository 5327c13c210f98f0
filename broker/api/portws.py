"""A client's websocket, proxied to a websocket of a server in a sandbox over the agent's tunnel.

The broker opens the server's websocket first (the client's subprotocols offered, the forwarded headers
of broker.api.porthttp) and accepts the client's only once the server accepted, with the subprotocol the
server chose; a server that refuses gets the client a typed error response instead. Then messages flow
both ways as they come, pings are answered, a close on either side closes the other with its code. A
message over `PortSettings.max_ws_message` (either way) closes both with 1009 and a reason that says so.
"""

from __future__ import annotations

import asyncio
import json

from wsproto import WSConnection
from wsproto.connection import ConnectionState, ConnectionType
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from broker.api.porthttp import CHUNK, Forward, Receive, Scope, Send, upstream_headers
from broker.errors import BackendError, FirepoolError

_WS_HEADERS = frozenset({b"host", b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions",
                         b"sec-websocket-protocol"})
"""Set by the handshake itself (wsproto writes its own)."""
TOO_BIG = 1009


async def refuse(scope: Scope, send: Send, exc: FirepoolError) -> None:
    """Turn down a websocket before accepting it: a typed JSON error response where the server can send one
    (the ASGI websocket denial extension), else a close with policy-violation 1008 and the message."""
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps(exc.to_wire(), ensure_ascii=True, separators=(",", ":")).encode("ascii")
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if exc.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "websocket.http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": _reason(f"{exc.error_class}: {exc.message}")})


def _reason(text: str) -> str:
    return text.encode("utf-8")[:123].decode("utf-8", "ignore")


async def _handshake(ws: WSConnection, scope: Scope, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     fwd: Forward) -> AcceptConnection:
    headers = upstream_headers(scope, fwd, drop=_WS_HEADERS)
    host = next((bytes(v) for k, v in scope.get("headers", ()) if bytes(k).lower() == b"host"), b"localhost")
    writer.write(ws.send(Request(host=host.decode("latin-1"), target=fwd.target,
                                 subprotocols=list(scope.get("subprotocols", ())), extra_headers=headers)))
    await writer.drain()
    rejected: RejectConnection | None = None
    body = b""
    while True:
        data = await reader.read(CHUNK)
        ws.receive_data(data or None)
        done = not data
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                return event
            if isinstance(event, RejectConnection):
                rejected = event
                done = done or not event.has_body
            elif isinstance(event, RejectData):
                body += event.data
                done = done or event.body_finished
        if rejected is not None and done:
            err = BackendError(f"the server on port {fwd.port} refused the websocket with status "
                               f"{rejected.status_code}", {"port": fwd.port, "status": rejected.status_code,
                                                           "body": body[:500].decode("utf-8", "replace")})
            if 400 <= rejected.status_code < 500:
                err.status = rejected.status_code
            raise err
        if done:
            raise BackendError(f"the server on port {fwd.port} closed the connection during the websocket "
                               "handshake", {"port": fwd.port})


async def forward(scope: Scope, receive: Receive, send: Send, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter, fwd: Forward, max_message: int) -> None:
    """Proxy a websocket whose `websocket.connect` was received; FirepoolError before it is accepted."""
    ws = WSConnection(ConnectionType.CLIENT)
    try:
        accepted = await _handshake(ws, scope, reader, writer, fwd)
    except (OSError, RemoteProtocolError, LocalProtocolError) as exc:
        raise BackendError(f"the server on port {fwd.port} did not complete a websocket handshake ({exc})",
                           {"port": fwd.port}) from exc
    await send({"type": "websocket.accept", "subprotocol": accepted.subprotocol})
    tasks = {asyncio.ensure_future(_client_to_server(ws, receive, send, writer, max_message)),
             asyncio.ensure_future(_server_to_client(ws, reader, writer, send, fwd, max_message))}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _too_big(size: int, limit: int) -> str:
    return _reason(f"message of {size} bytes over the port proxy's limit of {limit} bytes (--port-max-ws-message)")


async def _close_server(ws: WSConnection, writer: asyncio.StreamWriter, code: int, reason: str = "") -> None:
    if ws.state is ConnectionState.OPEN:
        try:
            writer.write(ws.send(CloseConnection(code=code, reason=reason)))
            await writer.drain()
        except (OSError, LocalProtocolError):
            pass


async def _client_to_server(ws: WSConnection, receive: Receive, send: Send, writer: asyncio.StreamWriter,
                            limit: int) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            await _close_server(ws, writer, int(message.get("code", 1000)) if message.get("code") != 1006 else 1001)
            return
        if message["type"] != "websocket.receive":
            continue
        data: str | bytes = message["text"] if message.get("text") is not None else message.get("bytes") or b""
        size = len(data.encode("utf-8")) if isinstance(data, str) else len(data)
        if size > limit:
            reason = _too_big(size, limit)
            await send({"type": "websocket.close", "code": TOO_BIG, "reason": reason})
            await _close_server(ws, writer, TOO_BIG, reason)
            return
        if ws.state is not ConnectionState.OPEN:
            return
        writer.write(ws.send(TextMessage(data=data) if isinstance(data, str) else BytesMessage(data=data)))
        await writer.drain()


async def _server_to_client(ws: WSConnection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            send: Send, fwd: Forward, limit: int) -> None:
    parts: list[str | bytes] = []
    size = 0
    while True:
        data = await reader.read(CHUNK)
        ws.receive_data(data or None)
        for event in ws.events():
            if isinstance(event, Message):
                parts.append(event.data)
                size += len(event.data)
                if size > limit:
                    reason = _too_big(size, limit)
                    await _close_server(ws, writer, TOO_BIG, reason)
                    await send({"type": "websocket.close", "code": TOO_BIG, "reason": reason})
                    return
                if not event.message_finished:
                    continue
                if isinstance(event, TextMessage):
                    await send({"type": "websocket.send", "text": "".join(str(p) for p in parts)})
                else:
                    await send({"type": "websocket.send",
                                "bytes": b"".join(p for p in parts if isinstance(p, bytes))})
                parts, size = [], 0
            elif isinstance(event, Ping):
                writer.write(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if ws.state is ConnectionState.REMOTE_CLOSING:
                    writer.write(ws.send(event.response()))
                code = event.code if event.code not in (1005, 1006, 1015) else 1000
                await send({"type": "websocket.close", "code": code, "reason": _reason(event.reason or "")})
                return
        await writer.drain()
        if not data:
            await send({"type": "websocket.close", "code": 1011,
                        "reason": _reason(f"the server on port {fwd.port} closed its connection")})
            return
