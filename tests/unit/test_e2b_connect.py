"""The Connect protocol's JSON codec as E2B's SDKs speak it: envelopes, end-of-stream, errors, selectors."""

from __future__ import annotations

import json
import struct

import pytest

from broker.api.e2b import connect
from broker.api.e2b.connect import RpcError


def test_an_envelope_is_flags_a_big_endian_length_and_the_json() -> None:
    data = connect.envelope({"event": {"start": {"pid": 7}}})
    flags, length = struct.unpack(">BI", data[:5])
    assert flags == 0 and length == len(data) - 5
    assert json.loads(data[5:]) == {"event": {"start": {"pid": 7}}}


def test_the_end_of_stream_envelope_carries_flag_2_and_the_error() -> None:
    assert connect.parse_envelopes(connect.end_stream()) == [(connect.END_STREAM, {})]
    [(flags, body)] = connect.parse_envelopes(connect.end_stream(RpcError("not_found", "gone")))
    assert flags == 2 and body == {"error": {"code": "not_found", "message": "gone"}}


def test_a_stream_request_body_yields_its_one_message() -> None:
    body = connect.envelope({"process": {"cmd": "/bin/bash"}})
    assert connect.request_message("application/connect+json", body) == {"process": {"cmd": "/bin/bash"}}
    assert connect.request_message("application/json", b'{"path": "."}') == {"path": "."}
    assert connect.request_message("application/json", b"") == {}


@pytest.mark.parametrize("body", [b"\x00\x00\x00", b"\x00\x00\x00\x00\x09{}", b"\x01\x00\x00\x00\x02{}"])
def test_a_truncated_or_compressed_envelope_is_invalid_argument(body: bytes) -> None:
    with pytest.raises(RpcError) as err:
        connect.request_message("application/connect+json", body)
    assert err.value.code == "invalid_argument" and err.value.status == 400


def test_two_messages_where_one_is_expected_are_refused() -> None:
    body = connect.envelope({}) + connect.envelope({})
    with pytest.raises(RpcError, match="expected one"):
        connect.request_message("application/connect+json", body)


def test_other_codecs_and_non_objects_are_refused() -> None:
    with pytest.raises(RpcError, match="JSON codec"):
        connect.request_message("application/proto", b"\x0a\x00")
    with pytest.raises(RpcError, match="object"):
        connect.request_message("application/json", b"[1]")
    with pytest.raises(RpcError, match="not JSON"):
        connect.request_message("application/json", b"{")


def test_error_codes_map_to_connect_http_statuses_and_unknown_codes_to_unknown() -> None:
    assert RpcError("unauthenticated", "x").status == 401
    assert RpcError("unimplemented", "x").status == 501
    assert RpcError("no_such_code", "x").code == "unknown"


def test_fields_are_read_by_json_name_or_proto_name() -> None:
    assert connect.field({"watcherId": "a"}, "watcherId") == "a"
    assert connect.field({"watcher_id": "b"}, "watcherId") == "b"


def test_a_process_selector_names_a_pid_or_a_tag() -> None:
    assert connect.selector_pid({"process": {"pid": 12}}) == 12
    assert connect.selector_pid({"process": {"pid": "12"}}) == 12
    assert connect.selector_pid({"process": {"tag": "web"}}) == "web"
    for bad in ({}, {"process": {}}, {"process": {"pid": "x"}}):
        with pytest.raises(RpcError):
            connect.selector_pid(bad)


def test_a_client_stream_is_read_envelope_by_envelope_as_it_arrives() -> None:
    body = connect.envelope({"start": {"process": {"pid": 3}}}) + connect.envelope({"data": {}}) + \
        connect.end_stream()
    reader = connect.EnvelopeReader()
    got = []
    for i in range(len(body)):
        got += reader.feed(body[i:i + 1])
    assert got == [(0, {"start": {"process": {"pid": 3}}}), (0, {"data": {}}), (2, {})]
    assert not reader.pending
    assert reader.feed(b"\x00\x00") == [] and reader.pending
