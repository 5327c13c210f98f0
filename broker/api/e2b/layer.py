"""The E2B layer as ASGI middleware, outermost on the broker: `/e2b/sandbox/...` is the data plane
(broker.api.e2b.envd), the rest of `/e2b/...` the control plane (broker.api.e2b.control). The API's JSON door never
sees these requests (multipart and connect+json bodies pass as they are). Everything else goes on to the API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from broker.api.door import ASGIApp, Message, Receive, Scope, Send
from broker.api.e2b.control import Control
from broker.api.e2b.envd import DataPlane
from broker.api.e2b.files import MAX_FILE_BYTES, Files
from broker.api.e2b.http import HttpError, Request, send_error
from broker.api.e2b.processes import Processes
from broker.api.e2b.ptys import PtyProcess, open_pty
from broker.api.e2b.sandboxes import Sandbox
from broker.api.e2b.service import Service
from broker.api.e2b.watch import Watches
from broker.api.terminal_routes import session_pod, terminal_env
from broker.errors import AgentError, Conflict, FirepoolError
from broker.running.execstream import ExecProcess, open_exec, run_collected
from broker.running.jobenv import session_id

log = logging.getLogger("firepool.e2b")

PREFIX = "/e2b"
DATA_PREFIX = "/e2b/sandbox"
LAUNCH_WAIT_S = 10.0
T = TypeVar("T")


async def _launched(start: Callable[[], Awaitable[T]]) -> T:
    """`start()`, again while the pod's agent has not yet received the holding job's launch (the job is RUNNING
    in the broker from its claim; its launch request may still be on its way): 409 "holds no session"."""
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while True:
        try:
            return await start()
        except (Conflict, AgentError) as exc:
            refusal = str(exc.details.get("agent_message", exc.message))
            if "holds no session" not in refusal or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.005)


class E2BLayer:
    def __init__(self, app: ASGIApp, cp: Any, gateway: Any, auth: Any, port_domain: str | None = None) -> None:
        self.app = app
        self.cp = cp
        self.service = Service(cp, gateway.kernels, lambda: cp.catalog.pools)
        self.control = Control(self.service, auth, port_domain)
        self.data = DataPlane(self.service.registry, Processes(self._open, self._open_pty), Files(self._run),
                              Watches(lambda sbx, argv: self._open(sbx, argv, {}, None, False)), lambda: gateway.ctx)
        self.service.closers.append(self.data.close)

    async def _exec_context(self, sbx: Sandbox) -> tuple[dict[str, str], str]:
        """The session's env (as a terminal gets it) and its agent session id, learnt once per sandbox."""
        found = sbx.extras.get("exec_context")
        if found is None:
            pod = await session_pod(self.cp, sbx.caller, sbx.id, "default")
            env = terminal_env(self.cp, pod, sbx.caller, sbx.id, "default")
            found = (env, session_id(sbx.caller, "default", sbx.id, self.cp.tracker.pool(pod.pool)))
            sbx.extras["exec_context"] = found
        return found

    async def _open(self, sbx: Sandbox, argv: list[str], env: dict[str, str], cwd: str | None,
                    stdin: bool) -> ExecProcess:
        base, session = await self._exec_context(sbx)
        return await _launched(lambda: open_exec(self.cp.streams, sbx.caller, sbx.id, argv, env={**base, **env},
                                                 cwd=cwd, stdin=stdin, session=session))

    async def _open_pty(self, sbx: Sandbox, argv: list[str], env: dict[str, str], cwd: str | None, rows: int,
                        cols: int) -> PtyProcess:
        base, session = await self._exec_context(sbx)
        return await _launched(lambda: open_pty(self.cp.streams, sbx.caller, sbx.id, argv, rows=rows, cols=cols,
                                                env={**base, **env}, cwd=cwd, session=session))

    async def _run(self, sbx: Sandbox, argv: list[str], stdin: bytes | None) -> tuple[int, bytes, bytes]:
        base, session = await self._exec_context(sbx)
        return await _launched(lambda: run_collected(self.cp.streams, sbx.caller, sbx.id, argv, stdin_data=stdin,
                                                     env={**base, **sbx.envs}, session=session,
                                                     max_bytes=MAX_FILE_BYTES + 1, timeout_s=300.0))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        signed = path == "/files" and b"signature=" in bytes(scope.get("query_string", b""))
        if scope["type"] != "http" or not (signed or path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        data = path.startswith(DATA_PREFIX + "/")
        try:
            try:
                await self.service.adopt()  # once per broker: the sandboxes whose kernels outlived the last one
                if signed:
                    await self.data.signed_files(Request.of(scope, receive, path), tracked)
                elif data:
                    await self.data.handle(Request.of(scope, receive, path[len(DATA_PREFIX):]), tracked)
                else:
                    await self.control.handle(Request.of(scope, receive, path[len(PREFIX):] or "/"), tracked)
            except FirepoolError as exc:
                if data and exc.status in (404, 409):  # the session's pod is gone or moved on
                    sid = Request.of(scope, receive, "").headers.get("e2b-sandbox-id", "")
                    raise HttpError(502, f"The sandbox {sid[:80]} was not found ({exc.message})") from None
                raise HttpError(exc.status, exc.message) from None
            except TimeoutError:
                raise HttpError(504, "the sandbox did not answer in time") from None
        except HttpError as exc:
            if not started:
                await send_error(send, exc)
        except OSError as exc:  # the client went away mid-answer
            log.debug("e2b %s: %s", path[:100], exc)
