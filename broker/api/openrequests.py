"""A cap on each caller's open requests, so that one caller's long polls, watch streams and websockets cannot take
every connection (and file descriptor) of the broker from the others.

`OpenRequests` (ASGI middleware, outermost) counts the HTTP requests and websockets in flight per credential, as
the request carries it: `Authorization`, E2B's `X-API-Key` or `X-Access-Token`, the dashboard's or a session
port's cookie, a `token` query parameter (a Jupyter client's websocket), else the client's address. Past `limit`
it answers 429 `TooManyOpenRequests` (retryable) before any route runs; a websocket is refused the same way where
the server supports denial responses (uvicorn does), else closed with 1013 (try again later). The credential is
only a key here, digested and never checked: a wrong one is refused by its route as before, and counts against
itself only. A request leaves the count when the app returns: a stream when it ends, a long poll when it answers.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from broker.api.door import ASGIApp, Receive, Scope, Send, error_response
from broker.errors import TooManyOpenRequests

DEFAULT_LIMIT = 1000
"""Requests and websockets one caller may hold open at once (the broker's `--max-open-requests`)."""
_HEADERS = (b"authorization", b"x-api-key", b"x-access-token")
_COOKIES = ("firepool_session", "firepool_token", "firepool_port")


class OpenRequests:
    def __init__(self, app: ASGIApp, limit: int = DEFAULT_LIMIT) -> None:
        self.app = app
        self.limit = limit
        self.open: Counter[bytes] = Counter()
        """Requests in flight per key (a credential's digest, or an address); a key leaves at zero."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        key = request_key(scope)
        if self.open[key] >= self.limit:
            await self._refuse(scope, receive, send)
            return
        self.open[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open[key] -= 1
            if not self.open[key]:
                del self.open[key]

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = TooManyOpenRequests(f"this caller holds {self.limit} requests open already (the broker's "
                                  f"--max-open-requests); end one, then try again", {"limit": self.limit})
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1013, "reason": "too many open requests"})
                return
        await error_response(err, {"Retry-After": "1"})(scope, receive, send)


def request_key(scope: Scope) -> bytes:
    """Whose request this is, as far as the request itself says: a digest of its credential, else its address."""
    headers = dict(scope.get("headers") or ())
    for name in _HEADERS:
        value = headers.get(name, b"").strip()
        if value:
            return _digest(name + b":" + value)
    cookie = headers.get(b"cookie")
    if cookie:
        try:
            jar = SimpleCookie(cookie.decode("latin-1"))
        except CookieError:
            jar = SimpleCookie()
        for cookie_name in _COOKIES:
            if cookie_name in jar and jar[cookie_name].value:
                return _digest(f"cookie:{cookie_name}:{jar[cookie_name].value}".encode())
    token = parse_qs(bytes(scope.get("query_string") or b"").decode("latin-1")).get("token")
    if token and token[-1]:
        return _digest(b"token:" + token[-1].encode("latin-1"))
    client = scope.get("client") or ("", 0)
    return b"address:" + str(client[0]).encode()


def _digest(credential: bytes) -> bytes:
    return hashlib.blake2b(credential, digest_size=16).digest()
