"""The API's door: what a request must be before any route runs, and one error shape for every refusal.

`RequestLimits` (ASGI middleware) refuses, before a route reads anything: a JSON body over
`max_request_bytes` (413, counted as it arrives, so a chunked body is cut off too), a body that is not
JSON (415), and a path or query string with NUL or invalid UTF-8 (422; a websocket handshake too, answered
with that error where the server supports denial responses, as uvicorn does). Package uploads stream to disk
under their own cap (broker.api.package_routes) and skip the JSON checks. `install` maps every other
failure to the same shape: unknown route 404, wrong method 405 with `Allow`, an unreadable body 422,
an unhandled exception 500 (logged with its traceback).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from broker.errors import (
    FirepoolError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    RequestTooLarge,
    UnsupportedMediaType,
)

log = logging.getLogger("firepool.api")

DEFAULT_MAX_REQUEST_BYTES = 2 << 20
"""Above the caller's 1 MiB argv+env budget plus 64 KiB of requirements, so a job a little over its budget
gets the precise 422 from admission; far larger bodies are cut off here, unread."""
RAW_BODY_PREFIXES = ("/v1/packages/",)
"""Routes that take a raw body under their own limit (a zip, streamed to disk)."""
RAW_BODY_PATHS = frozenset({"/v1/packages"})
"""`/v1/packages` without a digest too: it gets the package routes' typed 422, not the 415 "must be JSON"."""
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ErrorResponse(JSONResponse):
    """JSON in ASCII: an error that quotes a caller's value (a lone surrogate, say) still renders."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(exc: FirepoolError, headers: dict[str, str] | None = None) -> ErrorResponse:
    if exc.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return ErrorResponse(exc.to_wire(), status_code=exc.status, headers=headers)


def _query_problem(scope: Scope) -> str | None:
    if "\x00" in scope.get("path", ""):
        return "the path contains a NUL character"
    raw = unquote_to_bytes(bytes(scope.get("query_string", b"")).replace(b"+", b" "))
    if b"\x00" in raw:
        return "the query string contains a NUL character"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "the query string is not valid UTF-8"
    return None


def _raw_body(path: str) -> bool:
    return path.startswith(RAW_BODY_PREFIXES) or path.rstrip("/") in RAW_BODY_PATHS


def _is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _is_ui_form(path: str, content_type: str) -> bool:
    """The dashboard's HTML forms (/ui/) post url-encoded bodies; every other route takes JSON."""
    return path.startswith("/ui/") and \
        content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded"


class RequestLimits:
    """Size, content-type and encoding checks on every request before routing."""

    def __init__(self, app: ASGIApp, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no body to bound (frames are each route's); the URL checks hold
            problem = _query_problem(scope)
            if problem is not None and "websocket.http.response" in scope.get("extensions", {}):
                await receive()  # websocket.connect
                await error_response(InvalidRequest(problem, {"field": "url"}))(scope, receive, send)
                return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = _query_problem(scope)
        if problem is not None:
            await error_response(InvalidRequest(problem, {"field": "url"}))(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        length = headers.get("content-length")
        has_body = "transfer-encoding" in headers or (length is not None and length.strip() not in ("", "0"))
        if (scope["method"] not in _BODY_METHODS and not has_body) or \
                _raw_body(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        if length is not None and length.strip().isdigit() and int(length) > self.max_request_bytes:
            await error_response(self._too_large(), {"Connection": "close"})(scope, receive, send)
            return
        if has_body and "content-type" in headers and not _is_json(headers["content-type"]) \
                and not _is_ui_form(str(scope.get("path", "")), headers["content-type"]):
            err = UnsupportedMediaType(f"the body must be JSON (Content-Type: application/json), not "
                                       f"{headers['content-type'][:100]!r}", {"content_type": headers["content-type"][:100]})
            await error_response(err, {"Connection": "close"})(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay(bytes(body), message, receive), send)
                return
            body += message.get("body", b"")
            if len(body) > self.max_request_bytes:
                await error_response(self._too_large(), {"Connection": "close"})(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(bytes(body), None, receive), send)

    def _too_large(self) -> RequestTooLarge:
        return RequestTooLarge(f"the request body is larger than {self.max_request_bytes} bytes "
                               f"(the broker's --max-request-bytes)", {"limit": self.max_request_bytes})


def _replay(body: bytes, pending: Message | None, receive: Receive) -> Receive:
    """A receive that hands the buffered body over once, then whatever the client sends next."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if pending is not None:
            return pending
        return await receive()

    return replayed


def _allowed(app: FastAPI, path: str) -> list[str]:
    """Every method some route serves at `path` (Starlette's own Allow names only the first route's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(path):
            methods |= route.methods
    return sorted(methods)


def _from_http(app: FastAPI, request: Request, exc: StarletteHTTPException) -> tuple[FirepoolError, dict[str, str]]:
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return NotFound(f"no route {request.url.path!r}" if exc.detail == "Not Found" else str(exc.detail),
                        {"path": request.url.path}), headers
    if exc.status_code == 405:
        allowed = _allowed(app, request.url.path)
        headers["Allow"] = ", ".join(allowed)
        return MethodNotAllowed(f"{request.method} is not served at {request.url.path}; allowed: "
                                f"{', '.join(allowed)}", {"allowed": allowed}), headers
    if exc.status_code == 413:
        return RequestTooLarge(str(exc.detail)), headers
    if exc.status_code == 400:
        # FastAPI's "There was an error parsing the body": invalid UTF-8, nesting past the parser's depth.
        return InvalidRequest("the body is not a JSON document this API can read (invalid UTF-8, or "
                              "nested too deeply)", {"field": "body"}), headers
    err = InvalidRequest(str(exc.detail))
    err.status = exc.status_code
    return err, headers


def install(app: FastAPI, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
    """Add the door's middleware and the handlers that give every failure the one error shape."""
    app.add_middleware(RequestLimits, max_request_bytes=max_request_bytes)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err, headers = _from_http(app, request, exc)
        return error_response(err, headers or None)

    @app.exception_handler(Exception)
    async def unhandled(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(InternalError(f"internal error ({type(exc).__name__}); the broker log has "
                                            f"the traceback"))
