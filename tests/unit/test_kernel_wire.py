"""The SDK's kernel websocket framings agree with jupyter_server's own codecs, byte for byte, and a malformed
frame is a ValueError, never a crash or a half-read message."""

from __future__ import annotations

import json

import pytest
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)

from broker import kernel_wire
from broker.kernel_wire import V1_PROTOCOL


def test_a_v1_frame_is_what_jupyter_server_would_send_and_reads_back_as_it_reads_it() -> None:
    msg = kernel_wire.message("execute_request", {"code": "x + 1"}, "sess", channel="shell")
    frame = kernel_wire.encode(msg, V1_PROTOCOL)
    assert isinstance(frame, bytes)
    channel, parts = deserialize_msg_from_ws_v1(frame)
    assert channel == "shell"
    assert [json.loads(p) for p in parts] == [msg["header"], {}, {}, {"code": "x + 1"}]
    parts_in = [json.dumps(x).encode() for x in (msg["header"], {"msg_id": "p"}, {"m": 1}, {"text": "hi"})]
    back = kernel_wire.decode(serialize_msg_to_ws_v1([*parts_in, b"\x00buf"], "iopub"), V1_PROTOCOL)
    assert (back["channel"], back["parent_header"], back["metadata"], back["content"]) == (
        "iopub", {"msg_id": "p"}, {"m": 1}, {"text": "hi"})
    assert back["msg_type"] == "execute_request" and back["buffers"] == [b"\x00buf"]


def test_the_legacy_form_is_one_json_text_frame_with_its_channel() -> None:
    msg = kernel_wire.message("kernel_info_request", {}, "sess", channel="control")
    frame = kernel_wire.encode(msg, None)
    assert isinstance(frame, str)
    back = kernel_wire.decode(frame, None)
    assert (back["channel"], back["msg_type"], back["msg_id"]) == ("control", "kernel_info_request", msg["msg_id"])


@pytest.mark.parametrize("frame", [
    b"\x01", (3).to_bytes(8, "little") + b"\x00" * 24,
    (6).to_bytes(8, "little") + b"".join(n.to_bytes(8, "little") for n in (56, 60, 58, 70, 80, 90)) + b"x" * 40,
    (6).to_bytes(8, "little") + b"".join(n.to_bytes(8, "little") for n in (56, 57, 58, 59, 60, 10_000)),
])
def test_a_malformed_v1_frame_is_a_value_error(frame: bytes) -> None:
    with pytest.raises(ValueError):
        kernel_wire.decode(frame, V1_PROTOCOL)


def test_a_binary_frame_on_a_legacy_connection_and_a_non_object_are_value_errors() -> None:
    with pytest.raises(ValueError):
        kernel_wire.decode(b"\x00" * 64, None)
    with pytest.raises(ValueError):
        kernel_wire.decode("[1, 2]", None)
