"""The agent's request parsing: strict bodies, typed query parameters, safe attempt directories."""

from __future__ import annotations

import json

import pytest

from firepool_agent import wire
from firepool_agent.attempt import safe_name


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_a_launch_body_is_read_field_by_field() -> None:
    spec = wire.parse_launch(body(attempt_id="job:0", argv=["python", "-c", "1"], env={"A": "b"}, session="s",
                                  cwd="sub", timeout_s=5, extra={"package": None}))
    assert (spec.attempt_id, spec.argv, spec.env, spec.session, spec.cwd, spec.timeout_s) == \
        ("job:0", ("python", "-c", "1"), {"A": "b"}, "s", "sub", 5.0)


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
