"""Which sandbox a tool call uses, and how a call reaches the broker.

Every tool takes an optional `session`, which becomes the jobs' `lease_tag`: the same caller and session
reuse the warm sandbox. Resolution: the explicit argument -> the `Mcp-Session-Id` header of HTTP clients
(one per connection) -> one default per stdio process -> a newly minted one.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from broker.errors import FirepoolError
from broker.sandbox.calls import CallOutcome, Calls, PoolChoice, Progress
from broker.sandbox.kernels import Kernels
from mcp_server.identity import Broker

SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")

_SESSION_DOC = ("Sandbox session: pass back the `session` value of earlier results to keep using the same "
                "warm sandbox (files, packages, Python state). Omit it on the first call.")

SessionArg = Annotated[str | None, Field(default=None, description=_SESSION_DOC, max_length=128)]


class Sessions:
    """The server's way to the broker: the caller's client, the call's session, its progress reports."""

    def __init__(self, broker: Broker, kernels: Kernels, *, pool: str | None, queue: str) -> None:
        self.broker = broker
        self.kernels = kernels
        self.pool = pool
        self.queue = queue
        self.choice = PoolChoice(pool)
        self.default = f"mcp-{secrets.token_hex(6)}" if broker.transport == "stdio" else None

    def calls(self) -> tuple[str, Calls]:
        """The verified caller and a broker client acting as them."""
        try:
            caller, client = self.broker.client()
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc
        return caller, Calls(client, pool=self.pool, queue=self.queue, caller=caller, kernels=self.kernels,
                             choice=self.choice)

    def of(self, explicit: str | None, ctx: Context | None) -> str:
        """The session a call runs in (see the module docstring)."""
        if explicit is not None:
            if not SESSION.match(explicit):
                raise ToolError(f"session {explicit!r} is not a valid session name: use 1-128 letters, digits "
                                "and . _ : @ - (starting with a letter or digit)")
            return explicit
        header = headers_of(ctx).get("mcp-session-id")
        if header:
            return header if SESSION.match(header) else "mcp-" + hashlib.sha256(header.encode()).hexdigest()[:24]
        return self.default or f"mcp-{secrets.token_hex(6)}"

    async def helper(self, c: Calls, op: str, args: dict[str, Any], session: str, ctx: Context | None = None,
                     timeout_s: float = 120.0) -> tuple[dict[str, Any], CallOutcome]:
        """A sandbox helper operation (read, write, list, install, info); its failures are tool errors."""
        try:
            answer, outcome = await c.helper(op, args, session, timeout_s=timeout_s, progress=progress_of(ctx))
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc
        if "error" in answer and op != "install":
            raise ToolError(f"{answer['error']}: {answer.get('message', '')}")
        return answer, outcome


def progress_of(ctx: Context | None) -> Progress | None:
    """Progress notifications to the client, when it asked for them (a progress token)."""
    if ctx is None:
        return None

    async def report(done: float, total: float | None, message: str) -> None:
        try:
            await ctx.report_progress(done, total, message)
        except Exception:  # noqa: BLE001 - progress is advisory; a closed stream must not fail the call
            pass

    return report


def headers_of(ctx: Context | None) -> dict[str, str]:
    """The HTTP request's headers, lower-cased; none over stdio."""
    if ctx is None:
        return {}
    try:
        headers = ctx.headers
    except ValueError:
        return {}
    return {k.lower(): v for k, v in (headers or {}).items()}
