"""Small ASGI helpers for the E2B layer: a parsed request, whole and streamed answers, the E2B error shape."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from broker.api.door import Receive, Scope, Send

MAX_BODY_BYTES = 64 << 20
"""Largest request body the E2B layer reads (a file upload); a larger one is refused with 413."""


class HttpError(Exception):
    """An answer in E2B's error shape `{"code": <status>, "message": ...}`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def unsupported(feature: str) -> HttpError:
    return HttpError(501, f"{feature} is not supported by Firepool")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Lower-cased names; the last value of a repeated header."""
    scope: Scope
    receive: Receive

    @classmethod
    def of(cls, scope: Scope, receive: Receive, path: str) -> Request:
        headers = {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]}
        query = dict(parse_qsl(bytes(scope.get("query_string", b"")).decode("latin-1"), keep_blank_values=True))
        return cls(scope["method"], path, query, headers, scope, receive)

    async def body(self, limit: int = MAX_BODY_BYTES) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise HttpError(499, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"the request body is larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives (a client stream)."""
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise HttpError(499, "the client went away")
            chunk = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body"):
                return

    async def json(self) -> Any:
        data = await self.body(4 << 20)
        if not data:
            return {}
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise HttpError(400, "the request body is not JSON") from None


def _headers(content_type: str | None, extra: dict[str, str] | None, length: int | None) -> list[tuple[bytes, bytes]]:
    out = [] if content_type is None else [(b"content-type", content_type.encode())]
    if length is not None:
        out.append((b"content-length", str(length).encode()))
    out += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (extra or {}).items()]
    return out


async def send_bytes(send: Send, status: int, body: bytes = b"", content_type: str | None = None,
                     headers: dict[str, str] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": _headers(content_type, headers, len(body))})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    await send_bytes(send, status, body, "application/json", headers)


async def send_error(send: Send, exc: HttpError) -> None:
    await send_json(send, exc.status, {"code": exc.status, "message": exc.message}, exc.headers)


async def send_stream(send: Send, content_type: str, chunks: AsyncGenerator[bytes, None],
                      headers: dict[str, str] | None = None) -> None:
    """A 200 whose body is sent chunk by chunk as `chunks` yields (each flushed: HTTP/1.1 chunked)."""
    await send({"type": "http.response.start", "status": 200, "headers": _headers(content_type, headers, None)})
    async with contextlib.aclosing(chunks):  # a client gone mid-stream closes the producer now (its locks, queues)
        async for chunk in chunks:
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
