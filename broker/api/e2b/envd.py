"""The data plane (`E2B_SANDBOX_URL` = `<broker>/e2b/sandbox`): envd and the code interpreter, by header.

`E2b-Sandbox-Id` names the sandbox, `E2b-Sandbox-Port` the service: 49983 envd (Connect RPCs
`/process.Process/*`, `/filesystem.Filesystem/*`, `GET/POST /files`, `GET /health`), 49999 the code
interpreter (`/execute`, `/contexts`). envd calls and `/execute` carry `X-Access-Token` (the sandbox's
envdAccessToken), `/contexts` only `E2B-Traffic-Access-Token`: both are compared in constant time against
the sandbox's digests and never logged. An unknown or ended sandbox is a 502 "was not found", as E2B's edge
answers, which the SDK turns into SandboxNotRunningException.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

import zmq.asyncio

from broker.api.door import Send
from broker.api.e2b import connect
from broker.api.e2b.connect import RpcError
from broker.api.e2b.files import Files
from broker.api.e2b.http import HttpError, Request, send_bytes, send_json, send_stream
from broker.api.e2b.interpreter import DEFAULT_CONTEXT, Interpreter, check_execute, context_view
from broker.api.e2b.processes import Processes
from broker.api.e2b.sandboxes import Registry, Sandbox
from broker.api.e2b.watch import Watches

ENVD_PORT = "49983"
INTERPRETER_PORT = "49999"


class DataPlane:
    def __init__(self, registry: Registry, processes: Processes, files: Files, watches: Watches,
                 ctx: Any) -> None:
        self.registry = registry
        self.processes = processes
        self.files = files
        self.watches = watches
        self.ctx = ctx
        """The gateway's ZeroMQ context, got when first needed."""

    def sandbox(self, req: Request) -> Sandbox:
        sid = req.headers.get("e2b-sandbox-id", "")
        sbx = self.registry.get(sid)
        if sbx is None:
            raise HttpError(502, f"The sandbox {sid[:80]} was not found")
        return sbx

    async def handle(self, req: Request, send: Send) -> None:
        sbx = self.sandbox(req)
        port = req.headers.get("e2b-sandbox-port", ENVD_PORT)
        if port == INTERPRETER_PORT:
            await self.interpreter(sbx, req, send)
            return
        if port != ENVD_PORT:
            raise HttpError(502, f"port {port[:8]} of sandbox {sbx.id} is not open: Firepool's E2B layer serves "
                                 f"envd ({ENVD_PORT}) and the code interpreter ({INTERPRETER_PORT})")
        if req.path == "/health":
            await send_bytes(send, 204)
            return
        rpc = req.path.startswith(("/process.Process/", "/filesystem.Filesystem/"))
        if not sbx.accepts(req.headers.get("x-access-token")):
            if rpc:
                err = RpcError("unauthenticated", "invalid or missing X-Access-Token for this sandbox")
                await send_json(send, err.status, err.body())
                return
            raise HttpError(401, "invalid or missing X-Access-Token for this sandbox")
        if rpc and req.path == "/process.Process/StreamInput":
            await send_bytes(send, 200, await self.stream_input(sbx, req), connect.STREAM)
        elif rpc:
            await self.rpc(sbx, req, send)
        elif req.path == "/files" and req.method == "GET":
            path = req.query.get("path")
            if not path:
                raise HttpError(400, "?path= is required")
            await send_bytes(send, 200, await self.files.read(sbx, path), "application/octet-stream")
        elif req.path == "/files" and req.method == "POST":
            body = await req.body()
            if req.headers.get("content-encoding", "identity") == "gzip":
                import gzip
                body = gzip.decompress(body)
            written = await self.files.upload(sbx, req.query, req.headers.get("content-type", ""), body)
            await send_json(send, 200, written)
        else:
            raise HttpError(404, f"no envd route {req.method} {req.path[:100]}")

    async def signed_files(self, req: Request, send: Send) -> None:
        """`download_url()` / `upload_url()`: `/files` at the broker's root (the SDK drops the URL's path prefix)
        with no sandbox header, authorized by its signature alone: the one live sandbox whose access token
        signs this path, operation, user (and expiry) is the one it reaches."""
        write = req.method == "POST"
        if req.method not in ("GET", "POST"):
            raise HttpError(405, f"{req.method} is not allowed on a signed file URL")
        path, user = req.query.get("path", ""), req.query.get("username", "")
        expiry = req.query.get("signature_expiration")
        if expiry is not None and (not expiry.isdigit() or int(expiry) < self.registry.now()):
            raise HttpError(401, "this signed file URL has expired")
        sbx = self.registry.signed_by(req.query.get("signature", ""), path, "write" if write else "read", user,
                                      expiry)
        if sbx is None:
            raise HttpError(401, "invalid signature for this file URL (or its sandbox ended)")
        if not path:
            raise HttpError(400, "?path= is required")
        if write:
            body = await req.body()
            written = await self.files.upload(sbx, req.query, req.headers.get("content-type", ""), body)
            await send_json(send, 200, written)
        else:
            await send_bytes(send, 200, await self.files.read(sbx, path), "application/octet-stream")

    async def rpc(self, sbx: Sandbox, req: Request, send: Send) -> None:
        service, _, method = req.path.strip("/").partition("/")
        content_type = req.headers.get("content-type", "")
        try:
            message = connect.request_message(content_type, await req.body(64 << 20))
            if service == "process.Process" and method in ("Start", "Connect"):
                await send_stream(send, connect.STREAM, await self.open_stream(sbx, method, message))
                return
            if service == "filesystem.Filesystem" and method == "WatchDir":
                await send_stream(send, connect.STREAM, await self.watches.stream(sbx, message))
                return
            answer = await self.unary(sbx, service, method, message)
        except RpcError as err:
            await send_json(send, err.status, err.body())
            return
        await send_json(send, 200, answer)

    async def stream_input(self, sbx: Sandbox, req: Request) -> bytes:
        """`commands.stream_input`: a client stream of `start` (the process), then `data` inputs as they arrive
        (each written to the process at once), then the end; the answer is `{}` and the end of the stream."""
        reader = connect.EnvelopeReader()
        target: dict[str, Any] | None = None
        try:
            async for chunk in req.chunks():
                for flags, message in reader.feed(chunk):
                    if flags & connect.END_STREAM or not isinstance(message, dict):
                        continue
                    if "start" in message:
                        target = message["start"] if isinstance(message["start"], dict) else {}
                        self.processes.find(sbx, connect.selector_pid(target))
                    elif "data" in message:
                        if target is None:
                            raise RpcError("invalid_argument", "the stream must begin with its start event")
                        data = message["data"] if isinstance(message["data"], dict) else {}
                        await self.processes.send_input(sbx, {**target, "input": data.get("input")})
            if reader.pending:
                raise RpcError("invalid_argument", "the stream ended inside an envelope")
        except RpcError as err:
            return connect.end_stream(err)
        return connect.envelope({}) + connect.end_stream()

    async def open_stream(self, sbx: Sandbox, method: str, message: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        if method == "Start":
            proc = await self.processes.start(sbx, message)
            queue = proc.attach()
            self.processes.run(sbx, proc)
        else:
            proc = self.processes.find(sbx, connect.selector_pid(message))
            queue = proc.attach()
        return self.processes.stream(proc, queue)

    async def unary(self, sbx: Sandbox, service: str, method: str, message: dict[str, Any]) -> dict[str, Any]:
        if service == "filesystem.Filesystem":
            if method == "CreateWatcher":
                return await self.watches.create(sbx, message)
            if method == "GetWatcherEvents":
                return self.watches.events(sbx, message)
            if method == "RemoveWatcher":
                return await self.watches.remove(sbx, message)
            return await self.files.rpc(sbx, method, message)
        if service != "process.Process":
            raise RpcError("unimplemented", f"{service} is not an envd service")
        if method == "List":
            return self.processes.list(sbx)
        if method == "SendSignal":
            await self.processes.signal(sbx, message)
        elif method == "SendInput":
            await self.processes.send_input(sbx, message)
        elif method == "CloseStdin":
            await self.processes.close_stdin(sbx, message)
        elif method == "Update":
            await self.processes.update(sbx, message)
        else:
            raise RpcError("unimplemented", f"process.Process/{method} is not supported by Firepool")
        return {}

    # ---------------------------------------------------------------- the code interpreter

    def interpreter_of(self, sbx: Sandbox) -> Interpreter:
        found = sbx.extras.get("interpreter")
        if not isinstance(found, Interpreter):
            found = Interpreter(self.ctx(), sbx)
            sbx.extras["interpreter"] = found
        return found

    async def interpreter(self, sbx: Sandbox, req: Request, send: Send) -> None:
        traffic = req.headers.get("e2b-traffic-access-token")
        if not (sbx.accepts(traffic, traffic=True) or sbx.accepts(req.headers.get("x-access-token"))):
            raise HttpError(401, "invalid or missing access token for this sandbox")
        if req.path == "/execute" and req.method == "POST":
            code = check_execute(await req.json())
            events = self.interpreter_of(sbx).execute(code)
            await send_stream(send, "application/x-ndjson", _lines(events))
        elif req.path == "/contexts" and req.method == "GET":
            await send_json(send, 200, [context_view(sbx)])
        elif req.path == "/contexts" and req.method == "POST":
            body = await req.json()
            if not isinstance(body, dict) or body.get("language") not in (None, "python", "python3"):
                raise HttpError(400, "Firepool's sandboxes have one context: the default Python one")
            await send_json(send, 200, context_view(sbx))
        elif req.path.startswith("/contexts/"):
            ctx_id, _, action = req.path.removeprefix("/contexts/").partition("/")
            if ctx_id != DEFAULT_CONTEXT:
                raise HttpError(404, f"no context {ctx_id[:80]!r}: the only one is {DEFAULT_CONTEXT!r}")
            if action == "restart" and req.method == "POST":
                raise HttpError(501, "restarting a context is not supported by Firepool (kill the sandbox)")
            if action == "" and req.method == "DELETE":
                raise HttpError(400, "the default context cannot be removed")
            raise HttpError(404, f"no route {req.method} {req.path[:100]}")
        else:
            raise HttpError(404, f"no code interpreter route {req.method} {req.path[:100]}")

    async def close(self, sbx: Sandbox) -> None:
        found = sbx.extras.pop("interpreter", None)
        if isinstance(found, Interpreter):
            found.close()
        await self.processes.close(sbx)
        await self.watches.close(sbx)


async def _lines(events: AsyncGenerator[dict[str, Any], None]) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(events):
        async for event in events:
            yield json.dumps(event, separators=(",", ":")).encode() + b"\n"


def zmq_context(gateway: Any) -> zmq.asyncio.Context:
    ctx: zmq.asyncio.Context = gateway.ctx
    return ctx
