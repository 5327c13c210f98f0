"""Kernels through the broker's one door: HTTP and a websocket, the caller's token, nothing else.

    from broker.client import AsyncClient
    from broker.kernel_client import AsyncKernel
    async with AsyncClient() as fp:
        async with await AsyncKernel.start(fp, pool="cpu") as k:   # kernelspec firepool-cpu
            ex = await k.execute("print(6 * 7)")
            print(ex.stdout, ex.outputs, ex.error)

The broker serves the Jupyter gateway API (`/api/kernelspecs`, `/api/kernels`, `/api/kernels/{id}/channels`);
a kernel is started by kernelspec name, driven over the kernel websocket (`v1.kernel.websocket.jupyter.org`
when the server picks it, the legacy JSON form otherwise), interrupted, restarted and shut down with REST.
No ZMQ socket, connection file or kernel key reaches the client. `Kernel` is the synchronous form.
The same client speaks to any `jupyter_server` (its `/api/kernels` is the same API).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from broker import kernel_wire
from broker.client_core import raise_for
from broker.errors import FirepoolError, Forbidden, NotFound, Unauthorized, Unavailable
from broker.sdk_protocols import AsyncCalls

log = logging.getLogger(__name__)

RESTART_ASK_S = 2.0
"""After a restart, how long one readiness probe (an empty silent cell) is waited for before it is sent again."""

MAX_FRAME = 64 << 20
"""The largest kernel message the client accepts (a display of a large image, a DataFrame's HTML)."""
MAX_STREAM_CHARS = 1 << 20
"""Stream output kept per execution (its tail)."""
KERNELSPEC_PREFIX = "firepool-"

OnMessage = Callable[[dict[str, Any]], Awaitable[None] | None]
_BY_STATUS: dict[int, type[FirepoolError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound}


class KernelDisconnected(Unavailable):
    """The kernel's websocket closed (the kernel was shut down or culled, or the broker went away)."""


class KernelTimeout(FirepoolError, TimeoutError):
    """A request to the kernel got no complete answer in time."""

    status = 504


@dataclass
class Execution:
    """What one execute request produced, in order."""

    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """display_data / execute_result bundles: {"kind", "data", "metadata"}."""
    error: dict[str, Any] | None = None
    status: str = "ok"
    execution_count: int | None = None
    user_expressions: dict[str, Any] = field(default_factory=dict)
    reached: bool = False
    """The kernel announced the request (busy): the code may have run."""
    reply: dict[str, Any] | None = None

    def absorb(self, msg: dict[str, Any]) -> bool:
        """Fold one iopub message in; True at the request's idle status."""
        kind, content = msg.get("msg_type"), msg.get("content") or {}
        self.reached = True
        if kind == "stream":
            if content.get("name") == "stderr":
                self.stderr = (self.stderr + content.get("text", ""))[-MAX_STREAM_CHARS:]
            else:
                self.stdout = (self.stdout + content.get("text", ""))[-MAX_STREAM_CHARS:]
        elif kind in ("display_data", "execute_result"):
            self.outputs.append({"kind": kind, "data": content.get("data", {}),
                                 "metadata": content.get("metadata", {})})
        elif kind == "error":
            self.error = {k: content.get(k) for k in ("ename", "evalue", "traceback")}
        elif kind == "clear_output":
            self.outputs.clear()
        elif kind == "status" and content.get("execution_state") == "idle":
            return True
        return False

    def settle(self, reply: dict[str, Any]) -> None:
        content = reply.get("content") or {}
        self.reply = reply
        self.status = content.get("status", "ok")
        self.execution_count = content.get("execution_count")
        self.user_expressions = content.get("user_expressions") or {}
        if self.status == "error" and self.error is None:
            self.error = {k: content.get(k) for k in ("ename", "evalue", "traceback")}


async def _call(client: AsyncCalls, method: str, path: str, **kw: Any) -> httpx.Response:
    """A gateway request; a plain Jupyter server's errors (no broker error body) map by status."""
    response = await client._send(method, path, **kw)
    try:
        raise_for(response)
    except FirepoolError as exc:
        if type(exc) is FirepoolError and response.status_code in _BY_STATUS:
            raise _BY_STATUS[response.status_code](str(exc), {"status": response.status_code}) from None
        raise
    return response


async def kernelspecs(client: AsyncCalls) -> dict[str, Any]:
    """`GET /api/kernelspecs`: {"default": name, "kernelspecs": {name: spec}} (one `firepool-<pool>` per pool
    the caller may use)."""
    return dict((await _call(client, "GET", "/api/kernelspecs")).json())


async def kernels(client: AsyncCalls) -> list[dict[str, Any]]:
    """The caller's running kernels (their models)."""
    return list((await _call(client, "GET", "/api/kernels")).json())


class AsyncKernel:
    """One kernel behind the gateway, and (once `connect`ed) its websocket."""

    def __init__(self, client: AsyncCalls, model: Mapping[str, Any]) -> None:
        self.client = client
        self.model = dict(model)
        self.id: str = self.model["id"]
        self.name: str = self.model.get("name", "")
        self.session = uuid.uuid4().hex
        self.protocol: str | None = None
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}
        self._watchers: list[OnMessage] = []
        self._closed: BaseException | None = None

    # ---------------------------------------------------------------- lifecycle (REST)

    @classmethod
    async def start(cls, client: AsyncCalls, name: str | None = None, *, pool: str | None = None,
                    env: Mapping[str, str] | None = None, connect: bool = True,
                    ready_timeout: float = 120.0) -> AsyncKernel:
        """`POST /api/kernels`: a kernel of kernelspec `name` (or `firepool-<pool>`; neither: the default);
        `env` is the request's env (`KERNEL_*` variables, as Enterprise Gateway takes them). Connected and
        answering kernel_info when `connect`."""
        if name is None and pool is not None:
            name = KERNELSPEC_PREFIX + pool
        body: dict[str, Any] = {"env": dict(env or {})}
        if name is not None:
            body["name"] = name
        model = (await _call(client, "POST", "/api/kernels", json=body)).json()
        kernel = cls(client, model)
        if connect:
            try:
                await kernel.connect()
                await kernel.kernel_info(timeout=ready_timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    await kernel.shutdown()
                raise
        return kernel

    @classmethod
    async def attach(cls, client: AsyncCalls, kernel_id: str) -> AsyncKernel:
        """A running kernel by id (NotFound when it is gone or not the caller's), not yet connected."""
        return cls(client, (await _call(client, "GET", f"/api/kernels/{quote(kernel_id, safe='')}")).json())

    async def refresh(self) -> dict[str, Any]:
        """The kernel's model now (execution_state, last_activity, connections)."""
        self.model = dict((await _call(self.client, "GET", self._path())).json())
        return self.model

    async def interrupt(self) -> None:
        await _call(self.client, "POST", self._path("/interrupt"))

    async def restart(self, ready_timeout: float = 120.0) -> dict[str, Any]:
        """Restart the kernel process (the sandbox and its files stay); the websocket stays open. When connected,
        returns once the new process runs code: a request sent before the server has wired its channels to the
        new process is lost, so an empty silent cell (no output, no history, no execution count) is sent again
        every 2 s until one is answered. kernel_info would not do: a Jupyter server may answer it from a cache."""
        self.model = dict((await _call(self.client, "POST", self._path("/restart"))).json())
        deadline = time.monotonic() + ready_timeout
        while self._ws is not None:
            try:
                await self.execute("", silent=True, store_history=False,
                                   timeout=max(0.0, min(RESTART_ASK_S, deadline - time.monotonic())))
                break
            except KernelTimeout:
                if time.monotonic() >= deadline:
                    raise
        return self.model

    async def shutdown(self) -> None:
        """`DELETE /api/kernels/{id}`; a kernel already gone is not an error. The DELETE is sent even when closing
        the websocket fails (a start that failed half way must leave no kernel running)."""
        try:
            await self.close()
        finally:
            with contextlib.suppress(NotFound):
                await _call(self.client, "DELETE", self._path())

    def _path(self, tail: str = "") -> str:
        return f"/api/kernels/{quote(self.id, safe='')}{tail}"

    # ---------------------------------------------------------------- websocket

    def _ws_url(self) -> str:
        parts = urlsplit(self.client.url)  # the broker that answered last (`connect` made sure it leads)
        scheme = "wss" if parts.scheme == "https" else "ws"
        path = parts.path.rstrip("/") + self._path("/channels")
        return urlunsplit((scheme, parts.netloc, path, f"session_id={self.session}", ""))

    async def connect(self, timeout: float = 30.0) -> None:
        """Open the channels websocket, offering the v1 protocol (the server may answer in the legacy form)."""
        if self._ws is not None:
            return
        if len(self.client.brokers.urls) > 1:
            await self.client.whoami()  # a websocket does not move between brokers: find the leader first
        headers = {"Authorization": self.client._http.headers["Authorization"]}
        try:
            ws = await connect(self._ws_url(), additional_headers=headers, max_size=MAX_FRAME,
                               subprotocols=[kernel_wire.V1_PROTOCOL],  # type: ignore[list-item]
                               open_timeout=timeout, compression=None, ping_interval=None)
        except InvalidStatus as exc:
            status = exc.response.status_code
            cls = _BY_STATUS.get(status, FirepoolError)
            body = exc.response.body.decode(errors="replace")[:300] if exc.response.body else ""
            raise cls(f"kernel websocket refused: HTTP {status} {body}".strip(), {"status": status}) from None
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"cannot open the kernel websocket at {self._ws_url()}: {exc}") from exc
        self._ws, self.protocol, self._closed = ws, ws.subprotocol, None
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def close(self) -> None:
        """Close the websocket (the kernel keeps running: `shutdown` ends it)."""
        ws, reader, self._ws, self._reader = self._ws, self._reader, None, None
        if ws is not None:
            await ws.close()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        self._fail(KernelDisconnected("the kernel websocket was closed"))

    async def __aenter__(self) -> AsyncKernel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def watch(self, callback: OnMessage) -> None:
        """Call `callback` with every message the kernel sends (status, stream, comm...)."""
        self._watchers.append(callback)

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for frame in self._ws:
                try:
                    msg = kernel_wire.decode(frame, self.protocol)
                except ValueError:
                    continue
                for watcher in list(self._watchers):
                    try:
                        result = watcher(msg)
                        if result is not None:
                            await result
                    except Exception:  # a watcher's bug must not stop the reader every request waits on
                        log.exception("kernel %s: a message watcher failed", self.id)
                parent = (msg.get("parent_header") or {}).get("msg_id")
                q = self._waiting.get(parent) if parent else None
                if q is not None:
                    q.put_nowait(msg)
            self._fail(KernelDisconnected(f"kernel {self.id}: its websocket closed"))
        except ConnectionClosed as exc:
            self._fail(KernelDisconnected(f"kernel {self.id}: its websocket closed ({exc})"))
        except Exception as exc:  # noqa: BLE001 - whatever stopped the reader, the waiters must hear of it
            log.exception("kernel %s: reading its websocket failed", self.id)
            self._fail(KernelDisconnected(f"kernel {self.id}: reading its websocket failed ({exc!r})"))

    def _fail(self, exc: BaseException) -> None:
        self._closed = self._closed or exc
        for q in self._waiting.values():
            q.put_nowait(None)

    async def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        """Send one request and return its msg_id; `next_reply(msg_id, deadline)` gets the messages whose
        parent it is, in order. Call `forget(msg_id)` when done with it."""
        if self._ws is None:
            await self.connect()
        assert self._ws is not None
        msg = kernel_wire.message(msg_type, content, self.session, channel)
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._waiting[msg["msg_id"]] = q
        if self._closed is not None:
            q.put_nowait(None)
            return str(msg["msg_id"])
        try:
            await self._ws.send(kernel_wire.encode(msg, self.protocol))
        except ConnectionClosed as exc:
            self._fail(KernelDisconnected(f"kernel {self.id}: its websocket closed ({exc})"))
        return str(msg["msg_id"])

    def forget(self, msg_id: str) -> None:
        self._waiting.pop(msg_id, None)

    async def next_reply(self, msg_id: str, deadline: float) -> dict[str, Any]:
        """The next message answering request `msg_id` (KernelTimeout at `deadline`, a monotonic time;
        KernelDisconnected when the websocket closed)."""
        q = self._waiting.get(msg_id)
        if q is None:
            raise KeyError(msg_id)
        left = deadline - time.monotonic()
        if left <= 0:
            raise KernelTimeout(f"kernel {self.id} did not answer in time")
        try:
            msg = await asyncio.wait_for(q.get(), left)
        except TimeoutError:
            raise KernelTimeout(f"kernel {self.id} did not answer in time") from None
        if msg is None:
            raise self._closed or KernelDisconnected(f"kernel {self.id}: its websocket closed")
        return msg

    async def kernel_info(self, timeout: float = 30.0) -> dict[str, Any]:
        """kernel_info_request -> its reply's content (the kernel answers: it is ready)."""
        deadline = time.monotonic() + timeout
        msg_id = await self.send("kernel_info_request", {})
        try:
            while True:
                msg = await self.next_reply(msg_id, deadline)
                if msg.get("msg_type") == "kernel_info_reply":
                    return dict(msg.get("content") or {})
        finally:
            self.forget(msg_id)

    async def request_execute(self, code: str, *, silent: bool = False, store_history: bool | None = None,
                              user_expressions: Mapping[str, str] | None = None) -> str:
        """Send an execute_request and return its msg_id, for a caller that reads the answers itself
        (`next_reply`, then `forget`); `execute` is the whole exchange."""
        content = {"code": code, "silent": silent, "store_history": not silent if store_history is None
                   else store_history, "user_expressions": dict(user_expressions or {}),
                   "allow_stdin": False, "stop_on_error": True}
        return await self.send("execute_request", content)

    async def execute(self, code: str, *, timeout: float = 600.0, silent: bool = False,
                      store_history: bool | None = None, user_expressions: Mapping[str, str] | None = None,
                      on_message: OnMessage | None = None) -> Execution:
        """Run one cell and collect its outputs until both its reply and its idle status are in.
        KernelTimeout after `timeout` (the kernel is not interrupted: call `interrupt`)."""
        deadline = time.monotonic() + timeout
        ex = Execution()
        msg_id = await self.request_execute(code, silent=silent, store_history=store_history,
                                            user_expressions=user_expressions)
        idle = False
        try:
            while not (idle and ex.reply is not None):
                msg = await self.next_reply(msg_id, deadline)
                if on_message is not None:
                    result = on_message(msg)
                    if result is not None:
                        await result
                if msg.get("channel") == "shell":
                    ex.settle(msg)
                elif msg.get("channel") == "iopub":
                    idle = ex.absorb(msg) or idle
        finally:
            self.forget(msg_id)
        return ex
