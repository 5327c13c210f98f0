"""Kernel messages on the two wires the gateway joins: ZeroMQ (signed frames) and the websocket.

A Jupyter message is four JSON parts (header, parent header, metadata, content) and binary buffers. On
ZeroMQ they follow the `<IDS|MSG>` delimiter and an HMAC-SHA256 signature of the four parts made with the
kernel's key (`Signer`); the broker signs what it sends and checks what it receives, so no client ever
needs the key. On the websocket they travel in one of two forms:

- `v1.kernel.websocket.jupyter.org` (subprotocol): one binary frame, little-endian 64-bit offsets, then the
  channel name and the parts as raw bytes (`encode_v1`, `decode_v1`): the parts pass through unparsed.
- the legacy form (no subprotocol): a JSON text frame `{"channel", "header", "parent_header", "metadata",
  "content", "msg_id", "msg_type", "buffers": []}`, or with buffers a binary frame of big-endian 32-bit
  offsets, the JSON and the buffers (`encode_legacy`, `decode_legacy`).

Anything malformed raises `WireError`; the bridge answers it by closing the websocket (1007).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
from typing import Any

DELIMITER = b"<IDS|MSG>"
V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"
CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})
"""Channels a client may send on (iopub only to be refused: the kernel does not listen there)."""
MAX_PARTS = 4096
"""Offsets a frame may declare (four message parts plus buffers); more is a malformed frame."""


class WireError(ValueError):
    """A frame that is not a kernel message in the expected form."""


class Signer:
    """HMAC-SHA256 over a message's four JSON parts, with the kernel's key."""

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)

    def sign(self, parts: list[bytes]) -> bytes:
        mac = self._mac.copy()
        for part in parts[:4]:
            mac.update(part)
        return mac.hexdigest().encode("ascii")

    def to_zmq(self, parts: list[bytes]) -> list[bytes]:
        """The frames of a message sent to the kernel on a DEALER socket (no routing identities)."""
        return [DELIMITER, self.sign(parts), *parts]

    def from_zmq(self, frames: list[bytes]) -> list[bytes]:
        """The message parts of frames the kernel sent, once their signature checks out."""
        try:
            at = frames.index(DELIMITER)
        except ValueError:
            raise WireError("a kernel message without the <IDS|MSG> delimiter") from None
        signature, parts = frames[at + 1] if len(frames) > at + 1 else b"", frames[at + 2:]
        if len(parts) < 4:
            raise WireError("a kernel message with fewer than four parts")
        if not hmac.compare_digest(signature, self.sign(parts)):
            raise WireError("a kernel message with a bad signature")
        return parts


# ---------------------------------------------------------------- v1 (binary, offsets)

def encode_v1(channel: str, parts: list[bytes]) -> bytes:
    name = channel.encode("utf-8")
    offsets = [8 * (len(parts) + 3)]
    offsets.append(offsets[-1] + len(name))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    head = struct.pack(f"<{len(offsets) + 1}Q", len(offsets), *offsets)
    return b"".join((head, name, *parts))


def decode_v1(data: bytes) -> tuple[str, list[bytes]]:
    if len(data) < 8:
        raise WireError("a v1 frame shorter than its offset count")
    (count,) = struct.unpack_from("<Q", data)
    if count < 6 or count > MAX_PARTS or len(data) < 8 * (count + 1):
        raise WireError("a v1 frame whose offset count does not fit its length")
    offsets = struct.unpack_from(f"<{count}Q", data, 8)
    if offsets[0] != 8 * (count + 1) or any(b < a for a, b in zip(offsets, offsets[1:], strict=False)) \
            or offsets[-1] > len(data):
        raise WireError("a v1 frame with offsets out of order or past its end")
    try:
        channel = data[offsets[0]:offsets[1]].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a v1 frame whose channel is not UTF-8") from None
    parts = [data[offsets[i]:offsets[i + 1]] for i in range(1, count - 1)]
    return channel, parts


# ---------------------------------------------------------------- legacy (JSON text, binary with buffers)

def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_legacy(data: str | bytes) -> tuple[str, list[bytes]]:
    """A legacy frame: JSON text, or binary (big-endian offsets, the JSON, then buffers)."""
    buffers: list[bytes] = []
    if isinstance(data, bytes):
        if len(data) < 4:
            raise WireError("a binary frame shorter than its buffer count")
        (count,) = struct.unpack_from("!I", data)
        if count < 1 or count > MAX_PARTS or len(data) < 4 * (count + 1):
            raise WireError("a binary frame whose buffer count does not fit its length")
        offsets = [*struct.unpack_from(f"!{count}I", data, 4), len(data)]
        if any(b < a for a, b in zip(offsets, offsets[1:], strict=False)) or offsets[0] < 4 * (count + 1):
            raise WireError("a binary frame with offsets out of order or past its end")
        chunks = [data[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]
        text: str | bytes = chunks[0]
        buffers = chunks[1:]
    else:
        text = data
    try:
        msg = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise WireError("a frame that is not a JSON kernel message") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("header"), dict):
        raise WireError("a kernel message needs a header object")
    channel = msg.get("channel")
    if not isinstance(channel, str):
        raise WireError("a kernel message needs its channel")
    parts = [_dumps(msg["header"]), _dumps(msg.get("parent_header") or {}), _dumps(msg.get("metadata") or {}),
             _dumps(msg.get("content") if msg.get("content") is not None else {})]
    return channel, parts + buffers


def encode_legacy(channel: str, parts: list[bytes], header: dict[str, Any]) -> str | bytes:
    """The legacy form of a message the kernel sent: JSON text, or the binary form when it has buffers.
    The parts are embedded as they came (the kernel's JSON), not parsed and dumped again."""
    ident = _dumps({"channel": channel, "msg_id": header.get("msg_id", ""), "msg_type": header.get("msg_type", ""),
                    "buffers": []})
    body = b"".join((b'{"header":', parts[0], b',"parent_header":', parts[1], b',"metadata":', parts[2],
                     b',"content":', parts[3], b",", ident[1:]))
    buffers = parts[4:]
    if not buffers:
        return body.decode("utf-8")
    chunks = [body, *buffers]
    offsets = [4 * (len(chunks) + 1)]
    for chunk in chunks[:-1]:
        offsets.append(offsets[-1] + len(chunk))
    return struct.pack(f"!{len(chunks) + 1}I", len(chunks), *offsets) + b"".join(chunks)


def header_of(parts: list[bytes]) -> dict[str, Any]:
    try:
        header = json.loads(parts[0])
    except (ValueError, UnicodeDecodeError):
        raise WireError("a message header that is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("a message header that is not an object")
    return header
