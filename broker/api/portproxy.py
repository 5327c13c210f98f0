"""The port proxy: a server a job runs in its session's sandbox, reached through the broker (docs/ports.md).

`/v1/sessions/{tag}/ports/{port}/{path}` (every method, and websockets) and, with `--port-domain D`, every
path of the host `{port}-{tag}.D` (broker.api.portlinks) go to 127.0.0.1:{port} inside the sandbox of the
caller's session `tag` (default queue), through the pod agent's tunnel (`/v1/tunnel`): the sandbox keeps
its network isolation and the broker is the only way in. ASGI middleware outside the API's door
(broker.api.door), so bodies are raw and streamed and the JSON checks never see them.

Who: the caller whose session it is, by bearer token or by the cookie a signed link set; another caller's
tag is the same 404 as an unknown one (broker.running.sessionstreams). Refusals, each in the one error
shape: no or a bad credential 401, a port outside `--port-range` 422, no live session 404, nothing
listening on the port 502 `PortClosed` (retryable), a body over `--port-max-body-bytes` 413.
"""

from __future__ import annotations

import asyncio
import re
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs, quote, unquote

from broker.api import porthttp, portws
from broker.api.auth import TokenAuth
from broker.api.door import ASGIApp, Receive, Scope, Send, error_response
from broker.api.portlinks import (
    COOKIE,
    LINK_PATH,
    Grant,
    PortSettings,
    Signer,
    host_label,
    parse_host,
    still_valid,
)
from broker.errors import (
    AgentError,
    FirepoolError,
    Forbidden,
    InvalidRequest,
    PortClosed,
    RequestTooLarge,
    Unauthorized,
)
from broker.running.sessionstreams import SessionStreams
from broker.ui.session import SessionSettings

_PATH = re.compile(r"/v1/sessions/([^/]+)/ports/([^/]*)(/.*)?", re.DOTALL)
TUNNEL = ("/v1/tunnel", "firepool-tcp")


@dataclass(frozen=True)
class Target:
    tag: str
    port_text: str
    prefix: str
    """The port's root in the client's own (raw) spelling, "" in the host form."""
    rest: str
    """The raw path under the root ("" when the path form names the root without its slash)."""
    query: str

    @property
    def port(self) -> int:
        if not self.port_text.isdigit() or len(self.port_text) > 5:
            raise InvalidRequest(f"the port must be a number, got {self.port_text[:20]!r}", {"field": "port"})
        return int(self.port_text)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def cookie_values(scope: Scope, name: str) -> list[str]:
    """Every value of cookie `name` (a browser may send several of one name: different paths or domains)."""
    found: list[str] = []
    for key, value in scope.get("headers", ()):
        if bytes(key).lower() != b"cookie":
            continue
        for part in bytes(value).decode("latin-1").split(";"):
            k, sep, v = part.strip().partition("=")
            if sep and k == name:
                found.append(v.strip().strip('"'))
    return found


class PortProxy:
    """ASGI middleware: port requests and websockets to the sandbox, everything else to the API."""

    def __init__(self, app: ASGIApp, streams: SessionStreams, auth: TokenAuth, settings: PortSettings,
                 ui: SessionSettings, now: Callable[[], float] = time.time) -> None:
        self.app = app
        self.streams = streams
        self.auth = auth
        self.settings = settings
        self.ui = ui
        self.now = now
        self.signer = Signer(settings.key)

    def match(self, scope: Scope) -> Target | None:
        raw = bytes(scope.get("raw_path") or scope.get("path", "").encode("utf-8")).decode("latin-1")
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        if self.settings.domain:
            host = _header(scope, b"host")
            found = parse_host(host, self.settings.domain) if host else None
            if found is not None:
                return Target(found[0], str(found[1]), "", raw or "/", query)
        m = _PATH.fullmatch(raw)
        if m is None:
            return None
        return Target(unquote(m.group(1), errors="strict"), m.group(2), f"/v1/sessions/{m.group(1)}/ports/{m.group(2)}",
                      m.group(3) or "", query)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            target = self.match(scope)
        except UnicodeDecodeError:
            target = None
        if target is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await self._websocket(target, scope, receive, send)
            return
        try:
            await self._http(target, scope, receive, send)
        except porthttp.ResponseCut:
            return
        except FirepoolError as exc:
            headers = {"Connection": "close"} if exc.status == 413 else None
            await error_response(exc, headers)(scope, receive, send)

    async def _http(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        if target.rest == LINK_PATH:
            await self._open_link(target, scope, receive, send)
            return
        if target.rest == "":  # the root without its slash: relative links of the app would miss the prefix
            location = target.prefix + "/" + ("?" + target.query if target.query else "")
            await send({"type": "http.response.start", "status": 307, "headers": [(b"location", location.encode())]})
            await send({"type": "http.response.body", "body": b""})
            return
        caller = await self.caller(scope, target)
        length = _header(scope, b"content-length")
        if length and length.strip().isdigit() and int(length) > self.settings.max_body_bytes:
            raise porthttp_too_large(self.settings.max_body_bytes)
        reader, writer, fwd = await self._open(target, scope, caller)
        try:
            await porthttp.forward(scope, receive, send, reader, writer, fwd, self.settings.max_body_bytes)
        finally:
            writer.close()

    async def _websocket(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            reader, writer, fwd = await self._open(target, scope)
        except FirepoolError as exc:
            await portws.refuse(scope, send, exc)
            return
        try:
            await portws.forward(scope, receive, send, reader, writer, fwd, self.settings.max_ws_message)
        except FirepoolError as exc:
            await portws.refuse(scope, send, exc)
        finally:
            writer.close()

    async def _open(self, target: Target, scope: Scope, caller: str | None = None
                    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, porthttp.Forward]:
        """Who is asking, whether they may, and a tunnel to the port (every refusal typed)."""
        if caller is None:
            caller = await self.caller(scope, target)
        port = target.port
        self.settings.check_port(port)
        try:
            reader, writer = await self.streams.open(caller, target.tag, TUNNEL[0], {"port": port}, TUNNEL[1])
        except AgentError as exc:
            status = exc.details.get("status")
            message = str(exc.details.get("agent_message", exc.message))
            details: dict[str, Any] = {"tag": target.tag, "port": port}
            if status == 502:
                raise PortClosed(f"nothing in session {target.tag!r} serves port {port} ({message}); it may be "
                                 "starting: retry", details) from exc
            if status == 403:
                raise Forbidden(f"port {port} is not reachable: {message}", details) from exc
            if status == 400:
                raise InvalidRequest(message, {**details, "field": "port"}) from exc
            raise
        path = target.rest + ("?" + target.query if target.query else "")
        return reader, writer, porthttp.Forward(port, target.prefix, _ascii(path))

    async def caller(self, scope: Scope, target: Target) -> str:
        """The caller of a port grant cookie for this very session port, else of the bearer token."""
        for value in cookie_values(scope, COOKIE):
            grant = self.signer.verify("cookie", value, self.now())
            if grant is not None and self._fits(grant, target) and still_valid(grant, self.auth.identity_of):
                return grant.caller
        authorization = _header(scope, b"authorization")
        if authorization is None:
            raise Unauthorized("a port of a session needs the caller's bearer token (Authorization: Bearer ...) "
                               "or a signed link's cookie (POST /v1/sessions/{tag}/port-links)")
        if authorization.count(".") == 2:
            return (await asyncio.to_thread(self.auth.identify, authorization)).caller
        return self.auth.identify(authorization).caller

    @staticmethod
    def _fits(grant: Grant, target: Target) -> bool:
        return grant.tag == target.tag and str(grant.port) == target.port_text

    async def _open_link(self, target: Target, scope: Scope, receive: Receive, send: Send) -> None:
        """Swap a signed link for a cookie scoped to its session port, and go to the port's root."""
        if scope["method"] not in ("GET", "HEAD"):
            raise InvalidRequest("a signed link is opened with GET", {"field": "method"})
        tokens = parse_qs(target.query).get("t", [])
        now = self.now()
        grant = self.signer.verify("link", tokens[0], now) if tokens else None
        if grant is None or not self._fits(grant, target) or not still_valid(grant, self.auth.identity_of):
            raise Unauthorized("this port link is invalid or expired: ask for a new one "
                               "(POST /v1/sessions/{tag}/port-links, or `firepool port TAG PORT --link`)")
        cookie_grant = Grant(grant.caller, grant.tag, grant.port, now + self.ui.max_age_s, grant.token_digest)
        cookie = SimpleCookie()
        cookie[COOKIE] = self.signer.sign("cookie", cookie_grant)
        morsel = cookie[COOKIE]
        morsel["path"] = target.prefix + "/"
        morsel["httponly"] = True
        morsel["samesite"] = "Lax"  # a top-level navigation from another site (a chat, a notebook) carries it
        morsel["max-age"] = str(int(self.ui.max_age_s))
        if self.ui.secure or scope.get("scheme") == "https":
            morsel["secure"] = True
        headers = [(b"location", (target.prefix + "/").encode("latin-1")),
                   (b"set-cookie", morsel.OutputString().encode("latin-1")),
                   (b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer"),
                   (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _ascii(raw: str) -> str:
    """A raw path and query (bytes as latin-1) with any byte HTTP/1.1 cannot carry as is percent-encoded
    (a client may send UTF-8 unescaped); existing escapes and every printable ASCII character are kept."""
    return quote(raw.encode("latin-1"), safe=string.punctuation)


def porthttp_too_large(limit: int) -> FirepoolError:
    return RequestTooLarge(f"the request body is larger than {limit} bytes (the broker's --port-max-body-bytes)",
                           {"limit": limit})


def link_urls(base: str, tag: str, port: int, token: str, settings: PortSettings, host: str | None,
              scheme: str) -> dict[str, Any]:
    """The path-form link and, under `--port-domain`, the host-form one."""
    path = f"{base.rstrip('/')}/v1/sessions/{quote(tag, safe='')}/ports/{port}"
    urls: dict[str, Any] = {"url": f"{path}{LINK_PATH}?t={token}", "port_url": f"{path}/", "host_url": None}
    label = host_label(tag, port) if settings.domain else None
    if label is not None and settings.domain:
        port_suffix = ""
        if host and not host.endswith("]") and ":" in host:
            port_suffix = ":" + host.rsplit(":", 1)[1]
        root = f"{scheme}://{label}.{settings.domain.strip('.')}{port_suffix}"
        urls["host_url"] = f"{root}{LINK_PATH}?t={token}"
        urls["host_port_url"] = f"{root}/"
    return urls
