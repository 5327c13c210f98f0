"""`POST /v1/sessions/{tag}/port-links`: a short-lived signed link to a session's port, for a browser.

The proxy itself is middleware (broker.api.portproxy); this route only signs. The caller must hold a live
session `tag` (404 otherwise, as for every session route), and the port must be in `--port-range`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from pydantic import Field

from broker.api.auth import Credential, TokenAuth
from broker.api.portlinks import Grant, PortSettings, Signer
from broker.api.portproxy import link_urls
from broker.api.schemas import Strict
from broker.running.sessionstreams import SessionStreams


class PortLinkRequest(Strict):
    port: int = Field(ge=1, le=65535, description="The port a server of the session listens on (127.0.0.1 or "
                                                  "0.0.0.0 inside the sandbox).")
    ttl_s: float | None = Field(default=None, gt=0, le=86400,
                                description="Seconds the link may be opened in (default the broker's "
                                            "--port-link-ttl, at most its maximum); opening it sets a "
                                            "cookie that lasts as long as a dashboard session.")


def add_port_routes(app: FastAPI, streams: SessionStreams, auth: TokenAuth, settings: PortSettings,
                    errors: dict[int | str, dict[str, Any]], now: Callable[[], float] = time.time) -> None:
    signer = Signer(settings.key)

    @app.post("/v1/sessions/{tag}/port-links", status_code=201, responses=errors)
    async def port_link(tag: str, body: PortLinkRequest, request: Request,
                        authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        """A signed link to port `port` of your session `tag`: open `url` in a browser (it sets a cookie
        for that session port only and redirects to it); `port_url` is the same port for bearer-token
        clients; `host_url` is the host form under `--port-domain`, when the broker has one."""
        cred: Credential = await (asyncio.to_thread(auth.credential, authorization)
                                  if authorization is not None and authorization.count(".") == 2
                                  else _now(auth.credential, authorization))
        settings.check_port(body.port)
        streams.pod(cred.identity.caller, tag)  # a live session of yours, or the same 404 as any other tag
        ttl = min(body.ttl_s or settings.link_ttl_s, settings.max_link_ttl_s)
        expires = now() + ttl
        if cred.expires_at is not None:
            expires = min(expires, cred.expires_at)
        token = signer.sign("link", Grant(cred.identity.caller, tag, body.port, expires, cred.digest))
        scheme = request.url.scheme
        urls = link_urls(str(request.base_url), tag, body.port, token, settings, request.headers.get("host"), scheme)
        return {"tag": tag, "port": body.port, "expires_at": expires, **urls}


async def _now(fn: Callable[[str | None], Credential], authorization: str | None) -> Credential:
    return fn(authorization)
