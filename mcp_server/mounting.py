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
    app.mount(PREFIX, server.streamable_http_app(streamable_http_path="/", host=host))

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        try:
            async with server.session_manager.run():
                yield
        finally:
            await server.kernels.close()  # live kernels must not outlive the server and pin their pods
            await broker.close()

    return lifespan
