"""The MCP server mounted in the broker's own app (`firepool serve --mcp`): streamable HTTP at `/mcp/`.

Single-tenant by construction: clients present their broker tokens, verified against the broker's
token map, and the server acts toward the broker (over its loopback REST API, like any client) as the
verified caller with the broker's own credential for that caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server.auth.settings import AuthSettings
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_server.identity import HttpBroker, KnownCallerVerifier
from mcp_server.server import build_server

PREFIX = "/mcp"


def mount(app: Any, *, broker_url: str, tokens: Mapping[str, str], host: str = "127.0.0.1",
          pool: str | None = None) -> Callable[[], AbstractAsyncContextManager[None]]:
    """Mount the MCP server on `app` (a Starlette/FastAPI app) at /mcp/; returns its lifespan, which the
    host app must enter (Starlette does not run a mounted app's lifespan)."""
    broker = HttpBroker(broker_url, tokens)
    here = f"{broker_url}{PREFIX}/"
    auth = AuthSettings(issuer_url=here, resource_server_url=here, validate_token_resource=False)  # type: ignore[arg-type]
    server = build_server(broker, pool=pool, token_verifier=KnownCallerVerifier(tokens, broker), auth=auth)
    inner = server.streamable_http_app(streamable_http_path="/", host=host)
    app.mount(PREFIX, inner)
    app.router.routes.append(Route(PREFIX, endpoint=_WithoutSlash(inner), include_in_schema=False))

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        try:
            async with server.session_manager.run():
                yield
        finally:
            await server.kernels.close()  # live kernels must not outlive the server and pin their pods
            await broker.close()

    return lifespan


class _WithoutSlash:
    """`/mcp` served as `/mcp/` itself: the host app would answer 307, which costs a client that follows it
    (the TypeScript SDK) a second round trip on every message and fails one that does not (httpx)."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        root = scope.get("root_path", "")
        scope = {**scope, "path": scope["path"] + "/", "raw_path": scope.get("raw_path", b"") + b"/",
                 "root_path": root + PREFIX, "app_root_path": scope.get("app_root_path", root)}
        await self.inner(scope, receive, send)
