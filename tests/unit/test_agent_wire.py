"""The agent's request parsing: strict bodies, typed query parameters, safe attempt directories."""

from __future__ import annotations

import io
import json

import pytest

from firepool_agent import httpreq, wire
from firepool_agent.attempt import safe_name


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_launch_body_is_read_field_by_field() -> None:
    spec = wire.parse_launch(body(attempt_id="job:0", argv=["python", "-c", "1"], env={"A": "b"}, session="s",
                                  cwd="sub", timeout_s=5, extra={"package": None}))
    assert (spec.attempt_id, spec.argv, spec.env, spec.session, spec.cwd, spec.timeout_s) == \
        ("job:0", ("python", "-c", "1"), {"A": "b"}, "s", "sub", 5.0)
    assert spec.reset_after is None


def test_a_launch_may_ask_for_the_reset_after_it() -> None:
    spec = wire.parse_launch(body(attempt_id="job:0", argv=["true"], session="s",
                                  reset_after={"wipe_paths": ["/data"], "keep_paths": ["/cache"]}))
    assert spec.reset_after == wire.parse_reset(body(wipe_paths=["/data"], keep_paths=["/cache"]))


@pytest.mark.parametrize("fields, complaint", [
    ({"surprise": 1}, "unknown field"),
    ({"argv": []}, "argv"),
    ({"argv": ["a\0b"]}, "argv"),
    ({"argv": "true"}, "argv"),
    ({"env": {"A=B": "x"}}, "env"),
    ({"env": {"A": 1}}, "env"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"timeout_s": True}, "timeout_s"),
    ({"attempt_id": ""}, "attempt_id"),
    ({"attempt_id": "x" * 257}, "attempt_id"),
    ({"cwd": 3}, "cwd"),
    ({"reset_after": []}, "reset_after must be a JSON object"),
    ({"reset_after": {"wipe_all": True}}, "unknown field"),
    ({"reset_after": {"keep_paths": ["cache"]}}, "keep_paths"),
])
def test_a_malformed_launch_is_a_400(fields: dict[str, object], complaint: str) -> None:
    good: dict[str, object] = {"attempt_id": "job:0", "argv": ["true"], "session": "s"}
    with pytest.raises(wire.HttpError) as refused:
        wire.parse_launch(body(**{**good, **fields}))
    assert refused.value.status == 400 and complaint in refused.value.message


def test_missing_required_fields_and_non_objects_are_400s() -> None:
    for raw in (body(argv=["true"], session="s"), b"[1]", b"{not json"):
        with pytest.raises(wire.HttpError) as refused:
            wire.parse_launch(raw)
        assert refused.value.status == 400


def test_reset_signal_and_cancel_bodies() -> None:
    reset = wire.parse_reset(body(wipe_workspace=True, wipe_paths=["/data"], keep_paths=["/cache"]))
    assert reset.wipe_workspace and reset.wipe_paths == ("/data",) and reset.keep_paths == ("/cache",)
    assert wire.parse_reset(b"") == wire.parse_reset(b"{}")
    for bad in (body(wipe_paths=["relative"]), body(wipe_workspace="yes"), body(everything=True)):
        with pytest.raises(wire.HttpError):
            wire.parse_reset(bad)
    assert wire.parse_signal(body(signal="sigterm")) == "TERM"
    with pytest.raises(wire.HttpError):
        wire.parse_signal(body(signal="STOP"))
    assert wire.parse_cancel(b"") == 5.0 and wire.parse_cancel(body(grace_s=0.5)) == 0.5


def test_query_parameters_are_typed_and_bounded() -> None:
    query = {"wait_s": ["9999"], "offset": ["12"], "stream": ["stderr"]}
    assert wire.query_number(query, "wait_s", 0.0, wire.MAX_WAIT_S) == wire.MAX_WAIT_S
    assert wire.query_int(query, "offset", 0, 1 << 62) == 12
    assert wire.query_stream(query) == "stderr" and wire.query_stream({}) == "combined"
    for bad in ({"offset": ["-1"]}, {"offset": ["x"]}):
        with pytest.raises(wire.HttpError):
            wire.query_int(bad, "offset", 0, 10)
    with pytest.raises(wire.HttpError):
        wire.query_stream({"stream": ["../etc/passwd"]})


def test_attempt_directories_are_safe_and_distinct() -> None:
    names = {safe_name(i) for i in ("job:0", "job_0", "../../etc", "job/0", ".hidden")}
    assert len(names) == 5
    assert all("/" not in n and not n.startswith(".") for n in names)


def test_a_request_head_keeps_the_first_value_of_a_name_in_any_case() -> None:
    head = io.BytesIO(b"Content-Length: 3\r\ncontent-length: 9\r\nX-Term:  7 \r\n\r\nabc")
    headers = httpreq.read_headers(head)
    assert (headers.get("CONTENT-LENGTH"), headers["x-term"], headers.get("Missing", "d")) == ("3", "7", "d")
    assert "x-TERM" in headers and head.read() == b"abc"  # the body is left unread


@pytest.mark.parametrize(("head", "status"), [
    (b"X: " + b"a" * 65536 + b"\r\n\r\n", 431), (b"X: a\r\n" * 101 + b"\r\n", 431),
    (b"X: a\r\n folded\r\n\r\n", 400), (b"no colon\r\n\r\n", 400), (b"X : a\r\n\r\n", 400)])
def test_a_request_head_outside_the_limits_is_refused(head: bytes, status: int) -> None:
    with pytest.raises(wire.HttpError) as refused:
        httpreq.read_headers(io.BytesIO(head))
    assert refused.value.status == status


@pytest.mark.parametrize(("line", "status"), [(b"GET /\r\n", 400), (b"GET / HTTP/2.0\r\n", 505),
                                              (b"GET / JUNK/1.1\r\n", 400)])
def test_only_http_1_request_lines_are_served(line: bytes, status: int) -> None:
    with pytest.raises(wire.HttpError) as refused:
        httpreq.request_line(line)
    assert refused.value.status == status
    assert httpreq.request_line(b"POST /v1/reset HTTP/1.0\r\n") == ("POST", "/v1/reset", "HTTP/1.0")
