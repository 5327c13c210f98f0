"""One websocket joined to a gateway kernel's ZeroMQ channels, across the kernel's restarts.

Per connection the bridge opens the channels a Jupyter client would (shell, control and stdin DEALERs with
one identity, so the kernel's input requests come back to this connection; an iopub SUB), with the kernel's
CurveZMQ keys and HMAC key, which stay here. Before it reads the client's first message it nudges the
kernel (a `kernel_info_request` until an iopub message arrives), as jupyter_server does, so no output of
that message is lost to a subscription still on its way. Messages from the client are signed and sent;
messages from the kernel are checked and forwarded in the client's framing. When the kernel behind the id
changes (a restart) the bridge drops its sockets and opens new ones to the next kernel; when it ends
(shutdown, culling) the websocket closes with 1001.

Sockets: libzmq sets TCP_NODELAY on its TCP connections, and the websocket's TCP socket is an asyncio
transport's, which sets TCP_NODELAY on every stream socket it wraps: no hop the broker owns waits on Nagle
(tests/unit/test_gateway_nodelay.py checks uvicorn's websocket socket; tests/integration/test_gateway.py
measures the round trip).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from typing import Any

import zmq
import zmq.asyncio
from starlette.websockets import WebSocket, WebSocketDisconnect

from broker.gateway.kernels import GatewayKernel
from broker.gateway.wire import (
    Signer,
    WireError,
    decode_legacy,
    decode_v1,
    encode_legacy,
    encode_v1,
    header_of,
)

log = logging.getLogger("firepool.gateway")

SOCKET_TYPES = {"shell": zmq.DEALER, "control": zmq.DEALER, "stdin": zmq.DEALER, "iopub": zmq.SUB}
NUDGE_EVERY_S = 0.25
NUDGE_FOR_S = 30.0
CLOSE_GOING_AWAY = 1001
CLOSE_INVALID = 1007
CLOSE_TOO_BIG = 1009


class KernelSockets:
    """The four channels to one kernel, connected with its keys."""

    def __init__(self, ctx: zmq.asyncio.Context, conn: dict[str, Any]) -> None:
        self.signer = Signer(str(conn["key"]).encode())
        identity = uuid.uuid4().hex.encode()
        self.by_channel: dict[str, zmq.asyncio.Socket] = {}
        for channel, kind in SOCKET_TYPES.items():
            sock = ctx.socket(kind)
            sock.linger = 0
            if kind == zmq.DEALER:
                sock.identity = identity
            if conn.get("curve_publickey") and conn.get("curve_secretkey"):
                public = str(conn["curve_publickey"]).encode()
                sock.curve_secretkey = str(conn["curve_secretkey"]).encode()
                sock.curve_publickey = public
                sock.curve_serverkey = public
            if kind == zmq.SUB:
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(f"{conn.get('transport', 'tcp')}://{conn['ip']}:{int(conn[channel + '_port'])}")
            self.by_channel[channel] = sock
        self.channel_of = {sock: name for name, sock in self.by_channel.items()}
        self.poller = zmq.asyncio.Poller()
        for sock in self.by_channel.values():
            self.poller.register(sock, zmq.POLLIN)

    async def send(self, channel: str, parts: list[bytes]) -> None:
        await self.by_channel[channel].send_multipart(self.signer.to_zmq(parts), copy=False)

    def close(self) -> None:
        for sock in self.by_channel.values():
            sock.close(0)


def nudge_parts(msg_id: str) -> list[bytes]:
    header = {"msg_id": msg_id, "msg_type": "kernel_info_request", "username": "firepool-gateway",
              "session": msg_id, "date": "", "version": "5.3"}
    return [json.dumps(header).encode(), b"{}", b"{}", b"{}"]


class Bridge:
    def __init__(self, kernel: GatewayKernel, ctx: zmq.asyncio.Context, ws: WebSocket, *, v1: bool,
                 max_bytes: int) -> None:
        self.k = kernel
        self.ctx = ctx
        self.ws = ws
        self.v1 = v1
        self.max_bytes = max_bytes
        self.closed = False
        self.nudges: set[bytes] = set()

    async def run(self) -> None:
        self.k.connections += 1
        try:
            while not self.closed:
                changed = self.k.changed
                if self.k.ended:
                    await self._close(CLOSE_GOING_AWAY, "the kernel was shut down")
                    return
                if not self.k.connection:  # restarting: the next kernel's keys are not known yet
                    await changed.wait()
                    continue
                sockets = KernelSockets(self.ctx, self.k.connection)
                try:
                    await self._serve(sockets, changed)
                finally:
                    sockets.close()
        finally:
            self.k.connections -= 1
            self.k.touch()

    async def _serve(self, sockets: KernelSockets, changed: asyncio.Event) -> None:
        await self._nudge(sockets, changed)
        tasks = [asyncio.ensure_future(self._from_client(sockets)), asyncio.ensure_future(self._from_kernel(sockets)),
                 asyncio.ensure_future(changed.wait())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        for t in done:
            if not t.cancelled() and t.exception() is not None and not isinstance(t.exception(), WebSocketDisconnect):
                raise t.exception()  # type: ignore[misc]

    async def _nudge(self, sockets: KernelSockets, changed: asyncio.Event) -> None:
        """Until the iopub subscription carries a message, nothing the client sends is forwarded."""
        iopub = sockets.by_channel["iopub"]
        waited = 0.0
        while waited < NUDGE_FOR_S and not changed.is_set():
            msg_id = "firepool-nudge-" + os.urandom(8).hex()
            self.nudges.add(msg_id.encode())
            await sockets.send("shell", nudge_parts(msg_id))
            if await iopub.poll(int(NUDGE_EVERY_S * 1000)):
                return
            waited += NUDGE_EVERY_S
        log.warning("kernel %s: no iopub message after %.0f s of nudging", self.k.id, waited)

    def _is_nudge(self, parts: list[bytes]) -> bool:
        return bool(self.nudges) and b"firepool-nudge-" in parts[1] and \
            any(n in parts[1] for n in self.nudges)

    async def _from_client(self, sockets: KernelSockets) -> None:
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                self.closed = True
                return
            data: str | bytes | None = message.get("bytes")
            if data is None:
                data = message.get("text")
            if data is None:
                continue
            if len(data) > self.max_bytes:
                await self._close(CLOSE_TOO_BIG, f"a message over {self.max_bytes} bytes")
                return
            try:
                channel, parts = decode_v1(data) if self.v1 and isinstance(data, bytes) else decode_legacy(data)
            except WireError as exc:
                await self._close(CLOSE_INVALID, str(exc))
                return
            if channel not in ("shell", "control", "stdin"):
                log.debug("kernel %s: dropped a client message on channel %r", self.k.id, channel[:32])
                continue
            self.k.touch()
            await sockets.send(channel, parts)

    async def _from_kernel(self, sockets: KernelSockets) -> None:
        while True:
            for sock, _ in await sockets.poller.poll():
                frames = await sock.recv_multipart()
                channel = sockets.channel_of[sock]
                try:
                    parts = sockets.signer.from_zmq(frames)
                except WireError as exc:
                    log.warning("kernel %s: dropped a %s message: %s", self.k.id, channel, exc)
                    continue
                if self._is_nudge(parts):
                    continue
                await self._forward(channel, parts)

    async def _forward(self, channel: str, parts: list[bytes]) -> None:
        self.k.touch()
        header: dict[str, Any] | None = None
        if channel == "iopub" and b'"status"' in parts[0]:
            header = header_of(parts)
            if header.get("msg_type") == "status":
                with contextlib.suppress(ValueError, AttributeError):
                    self.k.execution_state = str(json.loads(parts[3]).get("execution_state", self.k.execution_state))
        if self.v1:
            await self.ws.send_bytes(encode_v1(channel, parts))
            return
        framed = encode_legacy(channel, parts, header or header_of(parts))
        if isinstance(framed, str):
            await self.ws.send_text(framed)
        else:
            await self.ws.send_bytes(framed)

    async def _close(self, code: int, reason: str) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self.ws.close(code=code, reason=reason[:120])
