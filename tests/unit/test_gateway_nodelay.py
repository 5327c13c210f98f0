"""TCP_NODELAY on the broker's websocket sockets: uvicorn, configured as `firepool serve` configures it,
serves a kernel websocket on a socket with Nagle off (asyncio's transports set it on every TCP socket they
wrap), so a kernel's burst of small messages (status, execute_input, result, reply, status) never waits on
the client's delayed ACK. The gateway relies on this instead of setting it itself."""

from __future__ import annotations

import asyncio
import socket

import uvicorn
import websocket
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket


async def echo(ws: WebSocket) -> None:
    await ws.accept(subprotocol="v1.kernel.websocket.jupyter.org")
    await ws.send_text(await ws.receive_text())
    await ws.receive()


async def test_the_servers_websocket_socket_has_nagle_off() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(Starlette(routes=[WebSocketRoute("/ws", echo)]), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)

        def talk() -> websocket.WebSocket:
            ws = websocket.create_connection(f"ws://127.0.0.1:{port}/ws",
                                             subprotocols=["v1.kernel.websocket.jupyter.org"])
            ws.send("hi")
            assert ws.recv() == "hi"
            return ws

        client = await asyncio.to_thread(talk)
        sockets = [c.transport.get_extra_info("socket") for c in server.server_state.connections]
        assert sockets, "no connection seen"
        for sock in sockets:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        client.close()
    finally:
        server.should_exit = True
        await task
