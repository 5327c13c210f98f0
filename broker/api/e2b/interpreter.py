"""The code interpreter (`E2b-Sandbox-Port: 49999`): `run_code` on the sandbox's live kernel.

`POST /execute` sends an `execute_request` on the kernel's shell channel through sockets the broker holds per
sandbox (broker.gateway.bridge.KernelSockets: the kernel's keys never leave the broker) and streams NDJSON as
the kernel answers: `stdout`/`stderr` as printed, `result` for `execute_result` (`is_main_result`) and
`display_data`, `error`, then `number_of_executions`. One context: the default Python one, which is the
kernel itself (`/contexts` lists it; creating another is refused with 400, its restart restarts the kernel).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import zmq.asyncio

from broker.api.e2b.http import HttpError
from broker.api.e2b.sandboxes import Sandbox
from broker.gateway.bridge import KernelSockets
from broker.gateway.wire import WireError

DEFAULT_CONTEXT = "python"
MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
        "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
        "application/json": "json", "application/javascript": "javascript"}
READY_WAIT_S = 30.0


def _message(msg_type: str, session: str, content: dict[str, Any]) -> tuple[str, list[bytes]]:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": msg_type, "username": "firepool-e2b", "session": session,
              "date": "", "version": "5.3"}
    return msg_id, [json.dumps(header).encode(), b"{}", b"{}", json.dumps(content).encode()]


def _execute(code: str, session: str, silent: bool = False) -> tuple[str, list[bytes]]:
    return _message("execute_request", session, {"code": code, "silent": silent, "store_history": not silent,
                                                 "user_expressions": {}, "allow_stdin": False,
                                                 "stop_on_error": True})


def result_event(data: dict[str, Any], main: bool) -> dict[str, Any]:
    """A Jupyter mime bundle as E2B's `result` line."""
    out: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        key = MIME.get(mime)
        if key is not None:
            out[key] = value
        else:
            extra[mime] = value
    if extra:
        out["extra"] = extra
    return out


class Interpreter:
    """One sandbox's kernel sockets, opened at its first execution and used by one execution at a time."""

    def __init__(self, ctx: zmq.asyncio.Context, sbx: Sandbox) -> None:
        self.ctx = ctx
        self.sbx = sbx
        self.lock = asyncio.Lock()
        self.session = uuid.uuid4().hex
        self.sockets: KernelSockets | None = None
        self.generation = -1

    def close(self) -> None:
        if self.sockets is not None:
            self.sockets.close()
            self.sockets = None

    async def _ready(self) -> KernelSockets:
        k = self.sbx.kernel
        if k is None:
            raise HttpError(502, f"The sandbox {self.sbx.id} was not found")
        deadline = time.monotonic() + READY_WAIT_S
        while not k.connection:
            if k.ended or time.monotonic() > deadline:
                raise HttpError(502, f"The sandbox {self.sbx.id} was not found")
            try:
                await asyncio.wait_for(k.changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                pass
        if self.sockets is not None and self.generation == k.generation:
            return self.sockets
        self.close()
        sockets = KernelSockets(self.ctx, k.connection)
        self.sockets, self.generation = sockets, k.generation
        await self._subscribe(sockets)
        if self.sbx.envs:  # the sandbox's envVars reach the kernel too, as they reach every command
            code = f"import os as _fp_os; _fp_os.environ.update({self.sbx.envs!r}); del _fp_os"
            async for _ in self._run(sockets, *_execute(code, self.session, silent=True)):
                pass
        return sockets

    async def _subscribe(self, sockets: KernelSockets) -> None:
        """`kernel_info_request`s until the iopub subscription carries a message, then drain both channels."""
        iopub, shell = sockets.by_channel["iopub"], sockets.by_channel["shell"]
        deadline = time.monotonic() + READY_WAIT_S
        while time.monotonic() < deadline:
            await sockets.send("shell", _message("kernel_info_request", self.session, {})[1])
            if await iopub.poll(250):
                break
        await asyncio.sleep(0.005)
        for sock in (iopub, shell):
            while await sock.poll(0):
                await sock.recv_multipart()

    async def execute(self, code: str) -> AsyncGenerator[dict[str, Any], None]:
        async with self.lock:
            sockets = await self._ready()
            msg_id, parts = _execute(code, self.session)
            if self.sbx.kernel is not None:
                self.sbx.kernel.touch()
            async with contextlib.aclosing(self._run(sockets, msg_id, parts)) as events:
                async for event in events:
                    yield event

    async def _run(self, sockets: KernelSockets, msg_id: str, parts: list[bytes]) -> AsyncGenerator[dict[str, Any], None]:
        await sockets.send("shell", parts)
        idle = replied = False
        count: int | None = None
        while not (idle and replied):
            for sock, _ in await sockets.poller.poll(1000):
                frames = await sock.recv_multipart()
                try:
                    got = sockets.signer.from_zmq(frames)
                    header, parent, content = json.loads(got[0]), json.loads(got[1]), json.loads(got[3])
                except (WireError, ValueError):
                    continue
                if parent.get("msg_id") != msg_id:
                    continue
                kind = header.get("msg_type")
                if sockets.channel_of[sock] == "shell":
                    if kind == "execute_reply":
                        replied = True
                        count = content.get("execution_count", count)
                    continue
                if kind == "status" and content.get("execution_state") == "idle":
                    idle = True
                elif kind == "stream":
                    yield {"type": "stderr" if content.get("name") == "stderr" else "stdout",
                           "text": content.get("text", ""), "timestamp": time.time_ns()}
                elif kind == "execute_result":
                    count = content.get("execution_count", count)
                    yield result_event(content.get("data") or {}, True)
                elif kind == "display_data":
                    yield result_event(content.get("data") or {}, False)
                elif kind == "error":
                    yield {"type": "error", "name": content.get("ename", "Error"), "value": content.get("evalue", ""),
                           "traceback": "\n".join(content.get("traceback") or [])}
            k = self.sbx.kernel
            if k is None or k.ended or k.generation != self.generation:
                yield {"type": "error", "name": "KernelDied", "value": "the sandbox's kernel restarted or ended",
                       "traceback": ""}
                self.close()
                return
        if count is not None:
            yield {"type": "number_of_executions", "execution_count": count}


def context_view(sbx: Sandbox) -> dict[str, str]:
    return {"id": DEFAULT_CONTEXT, "language": "python", "cwd": str(sbx.extras.get("home", "/workspace"))}


def check_execute(body: Any) -> str:
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        raise HttpError(400, "the body is {\"code\": <source>, ...}")
    unknown = set(body) - {"code", "context_id", "language", "env_vars"}
    if unknown:
        raise HttpError(400, f"unknown field(s) {', '.join(sorted(unknown))[:200]}")
    if body.get("language") not in (None, "python", "python3"):
        raise HttpError(400, f"language {str(body['language'])[:40]!r}: Firepool's sandboxes run Python only")
    if body.get("context_id") not in (None, DEFAULT_CONTEXT):
        raise HttpError(404, f"no context {str(body['context_id'])[:80]!r}: the only one is {DEFAULT_CONTEXT!r}")
    if body.get("env_vars"):
        raise HttpError(400, "env_vars per execution are not supported by Firepool: give envs at Sandbox.create")
    return str(body["code"])
