"""The gateway's framings: v1 binary and legacy JSON round trips against jupyter_server's own codecs, HMAC
signing as jupyter_client's Session signs, and malformed frames refused (never a crash)."""

from __future__ import annotations

import json

import pytest
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)

from broker.errors import InvalidRequest
from broker.gateway.kernels import kernel_env
from broker.gateway.wire import (
    Signer,
    WireError,
    decode_legacy,
    decode_v1,
    encode_legacy,
    encode_v1,
    header_of,
)

HEADER = {"msg_id": "m1", "msg_type": "execute_request", "session": "s", "username": "u", "version": "5.3",
          "date": "2026-01-01T00:00:00.000000Z"}
PARTS = [json.dumps(HEADER).encode(), b"{}", b'{"k":1}', b'{"code":"x + 1"}']


def test_v1_frames_match_jupyter_servers_codec_both_ways() -> None:
    ours = encode_v1("shell", [*PARTS, b"\x00buf"])
    assert ours == serialize_msg_to_ws_v1([*PARTS, b"\x00buf"], "shell")
    assert decode_v1(ours) == ("shell", [*PARTS, b"\x00buf"])
    assert decode_v1(serialize_msg_to_ws_v1(PARTS, "iopub")) == ("iopub", PARTS)
    channel, parts = deserialize_msg_from_ws_v1(ours)
    assert channel == "shell" and parts == [*PARTS, b"\x00buf"]


def test_legacy_frames_match_jupyter_servers_codec_with_and_without_buffers() -> None:
    text = encode_legacy("iopub", PARTS, HEADER)
    assert isinstance(text, str)
    msg = json.loads(text)
    assert msg["msg_type"] == "execute_request" and msg["channel"] == "iopub" and msg["content"] == {"code": "x + 1"}
    binary = encode_legacy("iopub", [*PARTS, b"abc"], HEADER)
    assert isinstance(binary, bytes)
    assert deserialize_binary_message(binary)["buffers"] == [b"abc"]
    sent = serialize_binary_message({"header": HEADER, "parent_header": {}, "metadata": {}, "content": {"a": 1},
                                     "channel": "shell", "buffers": [b"xyz"]})
    channel, parts = decode_legacy(sent)
    assert channel == "shell" and json.loads(parts[3]) == {"a": 1} and parts[4:] == [b"xyz"]
    assert header_of(parts)["msg_id"] == "m1"


def test_signatures_are_what_a_jupyter_session_makes_and_checks() -> None:
    session = Session(key=b"secret", signature_scheme="hmac-sha256")
    signer = Signer(b"secret")
    assert signer.sign(PARTS) == session.sign(PARTS)
    frames = signer.to_zmq(PARTS)
    assert session.deserialize(session.feed_identities(frames)[1])["content"] == {"code": "x + 1"}
    assert signer.from_zmq([b"ident", *frames]) == PARTS
    with pytest.raises(WireError):
        Signer(b"other").from_zmq(frames)


@pytest.mark.parametrize("frame", [b"", b"\x01" * 7, (100).to_bytes(8, "little") + b"\x00" * 16,
                                   (6).to_bytes(8, "little") + (999).to_bytes(8, "little") * 6])
def test_malformed_v1_frames_are_refused(frame: bytes) -> None:
    with pytest.raises(WireError):
        decode_v1(frame)


@pytest.mark.parametrize("frame", ["not json", "[]", '{"header": 1}', '{"header": {}}', b"\x00\x00",
                                   b"\xff\xff\xff\xff\x00\x00\x00\x00"])
def test_malformed_legacy_frames_are_refused(frame: str | bytes) -> None:
    with pytest.raises(WireError):
        decode_legacy(frame)


def test_only_kernel_and_allowlisted_envs_reach_the_kernel_never_firepools() -> None:
    env = kernel_env({"KERNEL_WORKING_DIR": "/w", "PATH": "/evil", "MINE": "1", "FIREPOOL_TOKEN": "t",
                      "KERNEL_USERNAME": "u"}, ("MINE", "FIREPOOL_TOKEN"))
    assert env == {"KERNEL_WORKING_DIR": "/w", "MINE": "1", "KERNEL_USERNAME": "u"}
    with pytest.raises(InvalidRequest):
        kernel_env({"KERNEL_X": "a\x00b"}, ())
