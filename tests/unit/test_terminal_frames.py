"""The terminal's two wire formats: the agent's binary frames and the client's terminado-style JSON."""

from __future__ import annotations

import json
import struct

import pytest

from broker.api.terminal_routes import (
    CLOSE_INVALID,
    CLOSE_UNSUPPORTED,
    BadFrame,
    client_frame,
    parse_params,
)
from broker.errors import InvalidRequest, UnknownField
from firepool_agent import ptyframes, terminal
from firepool_agent.wire import HttpError


def test_frames_decode_whole_from_any_split_of_the_stream() -> None:
    stream = ptyframes.frame(ptyframes.DATA, "héllo".encode()) + ptyframes.resize(40, 120) + ptyframes.exit_code(3)
    decoder = ptyframes.Decoder()
    frames = [f for i in range(len(stream)) for f in decoder.feed(stream[i:i + 1])]
    assert frames == [(ptyframes.DATA, "héllo".encode()), (ptyframes.RESIZE, struct.pack("!HH", 40, 120)),
                      (ptyframes.EXIT, struct.pack("!i", 3))]
    assert ptyframes.parse_resize(frames[1][1]) == (40, 120) and ptyframes.parse_exit(frames[2][1]) == 3


def test_an_oversize_or_unknown_frame_ends_the_stream() -> None:
    with pytest.raises(ptyframes.FrameError, match="limit"):
        ptyframes.Decoder().feed(ptyframes.HEADER.pack(ptyframes.DATA, ptyframes.MAX_PAYLOAD + 1))
    with pytest.raises(ptyframes.FrameError, match="unknown"):
        ptyframes.Decoder().feed(ptyframes.HEADER.pack(b"?", 0))


def test_client_frames_map_to_agent_frames() -> None:
    assert client_frame(json.dumps(["stdin", "ls\r"])) == ptyframes.frame(ptyframes.DATA, b"ls\r")
    assert client_frame(json.dumps(["set_size", 50, 200])) == ptyframes.resize(50, 200)
    assert client_frame(json.dumps(["signal", "sigint"])) == ptyframes.frame(ptyframes.SIGNAL, b"INT")


@pytest.mark.parametrize(("text", "code"), [
    ("nope", CLOSE_INVALID), ("{}", CLOSE_INVALID), ("[]", CLOSE_INVALID),
    (json.dumps(["set_size", 0, 80]), CLOSE_UNSUPPORTED), (json.dumps(["set_size", True, 80]), CLOSE_UNSUPPORTED),
    (json.dumps(["signal", "SIGSEGV"]), CLOSE_UNSUPPORTED), (json.dumps(["exec", "x"]), CLOSE_UNSUPPORTED),
])
def test_a_malformed_client_frame_names_its_close_code(text: str, code: int) -> None:
    with pytest.raises(BadFrame) as bad:
        client_frame(text)
    assert bad.value.code == code


def test_terminal_query_fields_are_checked() -> None:
    assert parse_params({}) == ("default", 24, 80, None)
    assert parse_params({"queue": "q", "rows": "30", "cols": "100", "command": "ls"}) == ("q", 30, 100, "ls")
    with pytest.raises(UnknownField):
        parse_params({"shell": "zsh"})
    with pytest.raises(InvalidRequest):
        parse_params({"rows": "0"})
    with pytest.raises(InvalidRequest):
        parse_params({"cols": "١٠"})  # digits, but not ASCII ones
    assert terminal.parse_query({"rows": ["5"], "command": ["ls"]}) == (5, 80, "ls", None, {})
    assert terminal.parse_query({"env": ['{"A": "1"}']})[4] == {"A": "1"}
    for bad in ({"cols": ["99999"]}, {"env": ["[1]"]}, {"env": ['{"A": 1}']}, {"env": ['{"A=B": "x"}']},
                {"env": ['{"A": "x\u0000"}']}):
        with pytest.raises(HttpError):
            terminal.parse_query(bad)


def test_the_shell_is_bash_where_the_path_has_it_else_sh() -> None:
    assert terminal.shell_argv("/usr/bin:/bin", None)[0].endswith(("/bash", "/sh"))
    assert terminal.shell_argv("/nonexistent", "echo hi") == ["/bin/sh", "-c", "echo hi"]
