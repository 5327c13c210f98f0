"""`firepool mcp`: the MCP server over stdio (default) or streamable HTTP (`--http --port P`).

This module imports the MCP SDK only when run, so the `firepool` CLI works without the `[mcp]` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="broker URL, or a comma-separated list of the brokers of one store "
                                   "(default: $FIREPOOL_URL, else the local broker)")
    p.add_argument("--token", help="broker token for stdio (default: $FIREPOOL_TOKEN, else the local token)")
    p.add_argument("--pool", default=None,
                   help="pool the sessions' sandboxes come from (default: the broker's cpu pool, else its only "
                        "pool, else its first pool without GPUs)")
    p.add_argument("--queue", default="default", help="broker queue of the sessions' jobs")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp instead of stdio")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8322)
    p.add_argument("--tokens", help="HTTP: JSON object MCP bearer token -> caller (clients present these); "
                                    "`sha256:<hex>` digests accepted (`firepool token add --tokens FILE`)")
    p.add_argument("--broker-tokens",
                   help="HTTP: JSON object broker token -> caller (the broker's token file format, plain tokens, "
                        "mode 0600); the server acts toward the broker as each verified caller with that caller's "
                        "broker token")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="HTTP: a browser origin allowed to call the server (repeatable), e.g. the MCP Inspector's "
                        "http://localhost:6274 in its direct mode; without it preflight requests get 401")
    p.add_argument("--log-level", default="warning")


def http_app(args: argparse.Namespace) -> Any:
    """The Starlette app of the streamable-HTTP server (mountable; its lifespan runs the sessions)."""
    from mcp.server.auth.settings import AuthSettings

    from mcp_server.identity import HttpBroker, KnownCallerVerifier, read_broker_tokens, read_client_tokens
    from mcp_server.server import build_server

    if not args.tokens or not args.broker_tokens:
        raise SystemExit("firepool mcp --http needs --tokens (MCP client tokens) and --broker-tokens "
                         "(the broker credentials it acts with); see docs/mcp.md")
    try:  # a mistake in either file is one line naming it, not a traceback
        broker = HttpBroker(args.url, read_broker_tokens(Path(args.broker_tokens)))
        verifier = KnownCallerVerifier({}, broker, digests=read_client_tokens(Path(args.tokens)))
    except (OSError, ValueError) as exc:
        where = f": {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
        raise SystemExit(f"firepool mcp: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}{where}") \
            from None
    here = f"http://{args.host}:{args.port}/mcp"
    auth = AuthSettings(issuer_url=here, resource_server_url=here, validate_token_resource=False)  # type: ignore[arg-type]
    server = build_server(broker, pool=args.pool, queue=args.queue, token_verifier=verifier, auth=auth)
    app = server.streamable_http_app(host=args.host, transport_security=_security(args.host, args.cors_origin))
    if args.cors_origin:
        from starlette.middleware.cors import CORSMiddleware

        # Outermost, so a preflight (which carries no token) is answered before the bearer-auth check; the
        # browser may then read Mcp-Session-Id, which it needs to send back.
        app.add_middleware(CORSMiddleware, allow_origins=args.cors_origin, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=CORS_HEADERS, expose_headers=["Mcp-Session-Id", "WWW-Authenticate"])
    serve_sessions = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(the_app: Any) -> AsyncIterator[None]:
        try:
            async with serve_sessions(the_app):
                yield
        finally:
            await server.kernels.close()  # live kernels must not outlive the server and pin their pods

    app.router.lifespan_context = lifespan
    return app


CORS_HEADERS = ["Authorization", "Content-Type", "Accept", "Mcp-Session-Id", "MCP-Protocol-Version", "Last-Event-ID"]
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _security(host: str, cors_origins: list[str]) -> Any:
    """The SDK's DNS-rebinding protection as it sets it for a loopback bind, plus the CORS origins (which it
    would refuse with 403); None (no Host/Origin checks) for any other bind, as the SDK does."""
    from mcp.server.transport_security import TransportSecuritySettings

    if host not in LOOPBACK:
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*", *cors_origins])


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.http:
        import uvicorn

        uvicorn.run(http_app(args), host=args.host, port=args.port, log_level=args.log_level.lower(),
                    access_log=False, timeout_graceful_shutdown=5)
        return 0
    import anyio

    from mcp_server.identity import StdioBroker
    from mcp_server.server import build_server

    async def serve() -> None:
        broker = StdioBroker(args.url, args.token)
        server = build_server(broker, pool=args.pool, queue=args.queue)
        try:
            await server.run_stdio_async()
        finally:
            with anyio.CancelScope(shield=True):
                await server.kernels.close()  # the client is gone: its kernels must not pin their pods
                await broker.close()

    anyio.run(serve)
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """`python -m mcp_server.main`: the same options as `firepool mcp`."""
    parser = argparse.ArgumentParser(prog="firepool mcp", description=__doc__)
    add_arguments(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(run())
