"""The Connect protocol with the JSON codec, as E2B's SDKs speak it to envd (no protobuf runtime needed).

Unary: `application/json` request and answer, the bare message; an error is a non-200 status with
`{"code": "<connect code>", "message": ...}`. Server streaming: `application/connect+json`, the request one
envelope, the answer a sequence of envelopes (`flags:u8 | length:u32 big-endian | JSON`), the last one with
flag 0x02 (end of stream) carrying `{}` or `{"error": {...}}`.
"""

from __future__ import annotations

import json
import struct
from typing import Any

UNARY = "application/json"
STREAM = "application/connect+json"
END_STREAM = 0x02
COMPRESSED = 0x01
MAX_MESSAGE_BYTES = 64 << 20

STATUS = {"canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
          "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
          "aborted": 409, "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
          "data_loss": 500, "unauthenticated": 401}
"""Connect error codes and the HTTP status a unary answer carries with each."""


class RpcError(Exception):
    """A Connect error: its code (a key of STATUS) and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        if code not in STATUS:
            code = "unknown"
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def envelope(message: Any, flags: int = 0) -> bytes:
    """One framed message of a stream."""
    data = dumps(message)
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: RpcError | None = None) -> bytes:
    """The last envelope of a stream: `{}`, or the error the stream ended with."""
    return envelope({} if error is None else {"error": error.body()}, END_STREAM)


def parse_envelopes(body: bytes) -> list[tuple[int, Any]]:
    """Every (flags, message) of a stream request body; a malformed body is an invalid_argument RpcError."""
    out: list[tuple[int, Any]] = []
    at = 0
    while at < len(body):
        if len(body) - at < 5:
            raise RpcError("invalid_argument", "a truncated Connect envelope header")
        flags, length = struct.unpack_from(">BI", body, at)
        at += 5
        if flags & COMPRESSED:
            raise RpcError("invalid_argument", "compressed Connect messages are not supported")
        if length > MAX_MESSAGE_BYTES or at + length > len(body):
            raise RpcError("invalid_argument", "a Connect envelope longer than its body")
        out.append((flags, loads(body[at:at + length])))
        at += length
    return out


class EnvelopeReader:
    """Envelopes out of a client stream's body fed in arbitrary pieces."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        self._buf += data
        out: list[tuple[int, Any]] = []
        while len(self._buf) >= 5:
            flags, length = struct.unpack_from(">BI", self._buf)
            if flags & COMPRESSED or length > MAX_MESSAGE_BYTES:
                raise RpcError("invalid_argument", "a compressed or oversized Connect envelope")
            if len(self._buf) < 5 + length:
                break
            out.append((flags, loads(bytes(self._buf[5:5 + length]))))
            del self._buf[:5 + length]
        return out

    @property
    def pending(self) -> bool:
        return bool(self._buf)


def loads(data: bytes) -> Any:
    if not data:
        return {}
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise RpcError("invalid_argument", "the request is not JSON") from None


def request_message(content_type: str, body: bytes) -> dict[str, Any]:
    """The one request message of a unary or server-streaming call."""
    if content_type.startswith(STREAM):
        messages = [m for flags, m in parse_envelopes(body) if not flags & END_STREAM]
        if len(messages) != 1:
            raise RpcError("invalid_argument", f"expected one request message, got {len(messages)}")
        message = messages[0]
    elif content_type.startswith(UNARY) or not content_type:
        message = loads(body)
    else:
        raise RpcError("invalid_argument", f"content type {content_type[:60]!r}: this server speaks Connect "
                       "with the JSON codec (application/json, application/connect+json)")
    if not isinstance(message, dict):
        raise RpcError("invalid_argument", "the request message must be a JSON object")
    return message


def field(message: dict[str, Any], camel: str, default: Any = None) -> Any:
    """A field by its JSON name or its proto name (the decoder accepts both)."""
    if camel in message:
        return message[camel]
    snake = "".join("_" + c.lower() if c.isupper() else c for c in camel)
    return message.get(snake, default)


def selector_pid(message: dict[str, Any]) -> int | str:
    """The process a `ProcessSelector` names: its pid, or its tag."""
    sel = message.get("process")
    if not isinstance(sel, dict):
        raise RpcError("invalid_argument", "process selector is required")
    if "pid" in sel:
        try:
            return int(sel["pid"])
        except (TypeError, ValueError):
            raise RpcError("invalid_argument", "process.pid must be a number") from None
    if isinstance(sel.get("tag"), str):
        return str(sel["tag"])
    raise RpcError("invalid_argument", "process selector needs a pid or a tag")
