"""`/v1/sessions/{tag}/terminal`: an interactive shell in a caller's session sandbox, over a websocket.

Owner-only: the caller is the bearer token's (`Authorization` header); at `/ui/sessions/{tag}/terminal/ws`,
for the dashboard's page, the signed-in browser's (`firepool_session` cookie, scoped to /ui, with an
`Origin` that must be this broker's own: another site's page cannot open a terminal with the visitor's
cookie). The session key holds the caller, so another
caller's tag is the same 404 as a tag never used (`SessionStreams.pod`). Refusals come before the websocket
is accepted, as the one typed JSON error with its HTTP status (401, 404, 409, 422, 502).

Frames are JSON text, terminado's: client -> broker `["stdin", str]`, `["set_size", rows, cols]`,
`["signal", "SIGINT"]`; broker -> client `["stdout", str]` (UTF-8 decoded incrementally, so a character
split across reads arrives whole) and, when the shell ends, `["exit", code]` then close 1000. A frame over
MAX_FRAME closes 1009, one that is not such JSON 1003 or 1007. The agent end speaks `ptyframes`.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
from typing import Any

from fastapi import FastAPI
from starlette.websockets import WebSocket, WebSocketDisconnect

from broker.api import door
from broker.api.auth import Identity, TokenAuth
from broker.control import ControlPlane
from broker.errors import (
    AgentError,
    Conflict,
    FirepoolError,
    Forbidden,
    InvalidRequest,
    NotFound,
    Unauthorized,
    UnknownField,
)
from broker.pods import Pod, PodState
from broker.running.jobenv import memory_limits, session_id
from firepool_agent import ptyframes

log = logging.getLogger("firepool.terminal")

MAX_FRAME = 256 << 10
"""The largest client frame, in bytes (a big paste fits; more is closed 1009, message too big)."""
QUERY = frozenset({"queue", "rows", "cols", "command"})
SIGNALS = frozenset({"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGTSTP",
                     "SIGCONT", "SIGSTOP", "SIGWINCH"})
CLOSE_NORMAL, CLOSE_UNSUPPORTED, CLOSE_INVALID, CLOSE_TOO_BIG, CLOSE_ERROR = 1000, 1003, 1007, 1009, 1011
READ_CHUNK = 64 << 10
RESET_WAIT_S = 10.0


class BadFrame(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _size(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= ptyframes.MAX_SIZE:
        raise InvalidRequest(f"{name} must be an integer 1-{ptyframes.MAX_SIZE}", {"field": name})
    return int(raw)


def parse_params(params: dict[str, str]) -> tuple[str, int, int, str | None]:
    """queue, rows, cols, command from the query; unknown fields are refused."""
    unknown = sorted(set(params) - QUERY)
    if unknown:
        raise UnknownField(f"unknown field {unknown[0]!r}", {"field": unknown[0]})
    command = params.get("command")
    if command is not None and len(command.encode()) > 64 << 10:
        raise InvalidRequest("command must be at most 64 KiB", {"field": "command"})
    return params.get("queue") or "default", _size(params, "rows", 24), _size(params, "cols", 80), command


async def caller_of(ws: WebSocket, auth: TokenAuth, app: FastAPI, dashboard: bool) -> Identity:
    """The bearer token's caller (`/v1`), or the dashboard session's (`/ui`, same origin only)."""
    if not dashboard:
        authorization = ws.headers.get("authorization")
        if authorization is not None and authorization.count(".") == 2:
            return await asyncio.to_thread(auth.identify, authorization)
        return auth.identify(authorization)
    origin = ws.headers.get("origin")
    if origin is None or origin.partition("://")[2] != ws.headers.get("host", ""):
        raise Forbidden("a dashboard terminal opens only from this broker's own pages")
    ui = getattr(app.state, "ui", None)
    who: Identity | None = await ui.sessions.identity(ws) if ui is not None else None
    if who is None:
        raise Unauthorized("sign in to the dashboard first")
    return who


def client_frame(text: str) -> bytes:
    """One client frame as the agent's frame (BadFrame: close code and reason)."""
    try:
        message = json.loads(text)
    except ValueError:
        raise BadFrame(CLOSE_INVALID, "a frame must be a JSON array") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise BadFrame(CLOSE_INVALID, "a frame must be a JSON array whose first item names it")
    kind, args = message[0], message[1:]
    if kind == "stdin" and len(args) == 1 and isinstance(args[0], str):
        return ptyframes.frame(ptyframes.DATA, args[0].encode("utf-8", "surrogatepass"))
    if kind == "set_size" and len(args) >= 2 and all(type(a) is int and 1 <= a <= ptyframes.MAX_SIZE
                                                      for a in args[:2]):
        return ptyframes.resize(args[0], args[1])
    if kind == "signal" and len(args) == 1 and isinstance(args[0], str) and args[0].upper() in SIGNALS:
        return ptyframes.frame(ptyframes.SIGNAL, args[0].upper().removeprefix("SIG").encode())
    raise BadFrame(CLOSE_UNSUPPORTED, f"unsupported frame {kind[:40]!r}: stdin, set_size or signal")


async def _from_client(ws: WebSocket, writer: asyncio.StreamWriter) -> None:
    """Relay the client's frames to the agent until the client goes (BadFrame for a bad one)."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is None:
            data = message.get("bytes") or b""
            if len(data) > MAX_FRAME:
                raise BadFrame(CLOSE_TOO_BIG, f"a frame is at most {MAX_FRAME} bytes")
            try:
                text = data.decode()
            except UnicodeDecodeError:
                raise BadFrame(CLOSE_INVALID, "a frame must be UTF-8 JSON") from None
        if len(text) > MAX_FRAME or len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME:
            raise BadFrame(CLOSE_TOO_BIG, f"a frame is at most {MAX_FRAME} bytes")
        writer.write(client_frame(text))
        await writer.drain()


async def _to_client(ws: WebSocket, reader: asyncio.StreamReader) -> int | None:
    """Relay the terminal's output to the client; the exit code, or None when the agent's stream broke."""
    decoder = ptyframes.Decoder()
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            return None
        out: list[str] = []
        for kind, payload in decoder.feed(data):
            if kind == ptyframes.DATA:
                out.append(text.decode(payload))
            elif kind == ptyframes.EXIT:
                out.append(text.decode(b"", final=True))
                await _send_stdout(ws, "".join(out))
                return ptyframes.parse_exit(payload)
        await _send_stdout(ws, "".join(out))


async def _send_stdout(ws: WebSocket, text: str) -> None:
    if text:
        await ws.send_text(json.dumps(["stdout", text]))


async def relay(ws: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Both directions until the shell exits (exit frame, close 1000), the client goes or sends a bad frame."""
    inbound = asyncio.create_task(_from_client(ws, writer))
    outbound = asyncio.create_task(_to_client(ws, reader))
    try:
        done, _ = await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
        if outbound in done:
            code = outbound.result()
            with contextlib.suppress(Exception):
                if code is None:
                    await ws.close(CLOSE_ERROR, "the sandbox's terminal stream ended (pod reset or gone)")
                else:
                    await ws.send_text(json.dumps(["exit", code]))
                    await ws.close(CLOSE_NORMAL)
        else:
            try:
                inbound.result()
            except BadFrame as exc:
                with contextlib.suppress(Exception):
                    await ws.close(exc.code, exc.reason)
            except (WebSocketDisconnect, ConnectionError):
                pass
    finally:
        for task in (inbound, outbound):
            task.cancel()
        await asyncio.gather(inbound, outbound, return_exceptions=True)
        writer.close()  # the agent hangs the shell up when its client goes


def terminal_env(cp: ControlPlane, pod: Pod, caller: str, tag: str, queue: str) -> dict[str, str]:
    """The broker's part of a job's environment that holds for the whole session (as `Executor._request`
    builds it, less the job's own variables and ids): the pool's, the session's names, the GPU memory caps."""
    pool = cp.tracker.pool(pod.pool)
    env = dict(pool.env) if pool is not None else {}
    env.update({"FIREPOOL_CALLER": caller, "FIREPOOL_POOL": pod.pool, "FIREPOOL_POD": pod.name,
                "FIREPOOL_LEASE_TAG": tag, "FIREPOOL_QUEUE": queue})
    if pod.gpus:
        env.update(memory_limits(pod.gpus, {d.key: d for d in cp.backend.devices()}))
    return env


async def session_pod(cp: ControlPlane, caller: str, tag: str, queue: str) -> Pod:
    """The session's live pod; one being reset after the session's last job is waited for (a terminal
    opened right after a job would otherwise find its sandbox between owners for a few milliseconds)."""
    deadline = asyncio.get_running_loop().time() + RESET_WAIT_S
    while True:
        try:
            return cp.streams.pod(caller, tag, queue)
        except NotFound:
            key = (caller, queue, tag)
            resetting = any(p.key == key and p.state is PodState.RESETTING for p in cp.tracker.snapshot())
            if not resetting or asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(0.02)


def add_terminal_routes(app: FastAPI, cp: ControlPlane, auth: TokenAuth) -> None:
    async def terminal(ws: WebSocket, tag: str, dashboard: bool) -> None:
        try:
            who = await caller_of(ws, auth, app, dashboard)
            queue, rows, cols, command = parse_params(dict(ws.query_params))
            pod = await session_pod(cp, who.caller, tag, queue)
            # The agent refuses when its sandbox has moved on to another session since this lookup.
            params: dict[str, Any] = {"rows": rows, "cols": cols,
                                      "session": session_id(who.caller, queue, tag, cp.tracker.pool(pod.pool)),
                                      "env": json.dumps(terminal_env(cp, pod, who.caller, tag, queue))}
            if command is not None:
                params["command"] = command
            try:
                reader, writer = await cp.backend.agent(pod.name).upgrade("/v1/terminal", params, ptyframes.PROTOCOL)
            except AgentError as exc:
                if exc.details.get("status") == 409:
                    raise Conflict(f"session {tag!r}'s sandbox cannot open a terminal now: "
                                   f"{exc.details.get('agent_message')}", {"tag": tag}) from None
                raise
        except FirepoolError as exc:
            await _deny(ws, exc)
            return
        await ws.accept()
        await relay(ws, reader, writer)

    @app.websocket("/v1/sessions/{tag}/terminal")
    async def api_terminal(ws: WebSocket, tag: str) -> None:
        await terminal(ws, tag, dashboard=False)

    @app.websocket("/ui/sessions/{tag}/terminal/ws")
    async def dashboard_terminal(ws: WebSocket, tag: str) -> None:
        """The dashboard page's: its cookie is scoped to /ui, and a bearer token is never in a browser."""
        await terminal(ws, tag, dashboard=True)


async def _deny(ws: WebSocket, exc: FirepoolError) -> None:
    """The typed error as the handshake's HTTP answer, where the server supports that; else close 1008."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(door.error_response(exc))
    else:
        await ws.close(1008, f"{exc.error_class}: {exc.message}"[:120])
