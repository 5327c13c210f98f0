"""The Jupyter kernel websocket's two wire forms, as `jupyter_server` and the broker's gateway speak them.

- `v1.kernel.websocket.jupyter.org` (binary frames): an 8-byte little-endian count of offsets, the offsets
  (8 bytes each), then the channel name and the message parts (header, parent_header, metadata, content,
  buffers...) at those offsets.
- the legacy JSON form (text frames): one JSON object with `channel` beside the message's fields.

A client offers v1; a server that does not pick it speaks the legacy form.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from typing import Any

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"
PROTOCOL_VERSION = "5.3"
_PARTS = ("header", "parent_header", "metadata", "content")


def message(msg_type: str, content: dict[str, Any], session: str, channel: str = "shell") -> dict[str, Any]:
    """A new request to the kernel, with a fresh msg_id."""
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": os.environ.get("USER", "firepool"),
              "session": session, "date": datetime.now(UTC).isoformat(), "version": PROTOCOL_VERSION}
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": channel,
            "msg_id": header["msg_id"], "msg_type": msg_type, "buffers": []}


def encode(msg: dict[str, Any], protocol: str | None) -> str | bytes:
    """One frame for `msg` (its `channel` says where it goes) in the connection's protocol."""
    if protocol != V1_PROTOCOL:
        return json.dumps({k: v for k, v in msg.items() if k != "buffers"})
    channel = str(msg.get("channel", "shell")).encode()
    parts = [json.dumps(msg.get(name) or {}).encode() for name in _PARTS]
    parts += [bytes(b) for b in msg.get("buffers") or []]
    offsets = [8 * (1 + 1 + len(parts) + 1)]
    offsets.append(offsets[-1] + len(channel))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    head = len(offsets).to_bytes(8, "little") + b"".join(o.to_bytes(8, "little") for o in offsets)
    return head + channel + b"".join(parts)


def decode(frame: str | bytes, protocol: str | None) -> dict[str, Any]:
    """A message from one frame: header, parent_header, metadata, content, channel, buffers, msg_type.

    Raises ValueError for a frame that is not a kernel message in either form."""
    msg: dict[str, Any]
    if isinstance(frame, str):
        loaded = json.loads(frame)
        if not isinstance(loaded, dict):
            raise ValueError("a kernel message is a JSON object")
        msg = loaded
        msg.setdefault("buffers", [])
    elif protocol == V1_PROTOCOL:
        msg = _decode_v1(frame)
    else:
        raise ValueError("a binary frame on a legacy-protocol connection")
    header = msg.get("header") or {}
    msg["msg_type"] = header.get("msg_type", msg.get("msg_type"))
    msg["msg_id"] = header.get("msg_id", msg.get("msg_id"))
    return msg


def _decode_v1(frame: bytes) -> dict[str, Any]:
    if len(frame) < 8:
        raise ValueError("a v1 frame shorter than its offset count")
    count = int.from_bytes(frame[:8], "little")
    if count < 2 + len(_PARTS) or len(frame) < 8 * (count + 1):
        raise ValueError("a v1 frame with too few offsets")
    offsets = [int.from_bytes(frame[8 * (i + 1):8 * (i + 2)], "little") for i in range(count)]
    if offsets != sorted(offsets) or offsets[-1] > len(frame):
        raise ValueError("a v1 frame whose offsets are out of order or past its end")
    chunks = [frame[offsets[i]:offsets[i + 1]] for i in range(count - 1)]
    msg: dict[str, Any] = {"channel": chunks[0].decode()}
    for name, chunk in zip(_PARTS, chunks[1:1 + len(_PARTS)], strict=True):
        msg[name] = json.loads(chunk) if chunk else {}
    msg["buffers"] = chunks[1 + len(_PARTS):]
    return msg
