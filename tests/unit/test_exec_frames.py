"""The exec stream's frames (`execframes`) and the agent's reading of an exec request's query."""

from __future__ import annotations

import json
import signal
from typing import cast

import pytest

from firepool_agent import execframes, execproc
from firepool_agent.attempts import Attempts
from firepool_agent.wire import HttpError


def test_frames_decode_whole_from_any_split_of_the_stream() -> None:
    stream = (execframes.started(42) + execframes.frame(execframes.STDOUT, b"out") +
              execframes.frame(execframes.STDERR, "é".encode()) + execframes.frame(execframes.CLOSE_STDIN) +
              execframes.exited(137, 9))
    decoder = execframes.decoder()
    frames = [f for i in range(len(stream)) for f in decoder.feed(stream[i:i + 1])]
    assert [kind for kind, _ in frames] == [execframes.STARTED, execframes.STDOUT, execframes.STDERR,
                                            execframes.CLOSE_STDIN, execframes.EXIT]
    assert execframes.parse_started(frames[0][1]) == 42
    assert frames[1][1] == b"out" and frames[2][1] == "é".encode() and frames[3][1] == b""
    assert execframes.parse_exit(frames[4][1]) == {"exit_code": 137, "signal": 9}
    assert execframes.decoder().feed(stream) == frames  # and all at once


def test_a_partial_frame_waits_for_the_rest() -> None:
    data = execframes.frame(execframes.STDIN, b"x" * 100)
    decoder = execframes.decoder()
    assert decoder.feed(data[:50]) == []
    assert decoder.feed(data[50:]) == [(execframes.STDIN, b"x" * 100)]


def test_an_unknown_oversize_or_malformed_frame_ends_the_stream() -> None:
    with pytest.raises(execframes.FrameError, match="unknown"):
        execframes.decoder().feed(execframes.HEADER.pack(b"z", 0))  # a terminal's resize: not this protocol
    with pytest.raises(execframes.FrameError, match="limit"):
        execframes.decoder().feed(execframes.HEADER.pack(execframes.STDOUT, execframes.MAX_PAYLOAD + 1))
    for bad in (b"", b"[1]", b'{"pid": "1"}', b'{"pid": 0}'):
        with pytest.raises(execframes.FrameError):
            execframes.parse_started(bad)
    for bad in (b"nope", b'{"exit_code": 1}', b'{"exit_code": 1, "signal": "KILL"}',
                b'{"exit_code": 1, "signal": null, "more": 1}'):
        with pytest.raises(execframes.FrameError):
            execframes.parse_exit(bad)


def test_signals_are_named_or_numbered() -> None:
    assert execframes.signal_number("KILL") == execframes.signal_number("sigkill") == signal.SIGKILL
    assert execframes.signal_number(15) == execframes.signal_number("15") == signal.SIGTERM
    assert execframes.signal_number("NOSUCH") is None and execframes.signal_number(0) is None


def _query(**fields: str) -> dict[str, list[str]]:
    return {name: [value] for name, value in fields.items()}


def test_an_exec_query_is_read_and_its_bad_fields_refused() -> None:
    request = execproc.parse_query(_query(argv=json.dumps(["ls", "-l"]), env='{"A": "1"}', cwd="sub", stdin="1",
                                          session="s1"))
    assert (request.argv, request.env, request.cwd, request.stdin, request.session) == (
        ["ls", "-l"], {"A": "1"}, "sub", True, "s1")
    assert execproc.parse_query(_query(argv='["true"]')).stdin is False
    for bad in (_query(), _query(argv="[]"), _query(argv='"ls"'), _query(argv="[1]"), _query(argv='["a\\u0000"]'),
                _query(argv='["true"]', stdin="yes"), _query(argv='["true"]', env="[]"),
                _query(argv='["true"]', cwd=""), _query(argv='["true"]', shell="1")):
        with pytest.raises(HttpError) as refused:
            execproc.parse_query(bad)
        assert refused.value.status == 400


def test_past_the_pods_budget_of_exec_processes_the_next_is_refused_429() -> None:
    taken = 0
    while execproc._slots.acquire(blocking=False):
        taken += 1
    try:
        assert taken == execproc.MAX_PROCESSES
        proc = execproc.ExecProcess(cast(Attempts, None), execproc.parse_query(_query(argv='["true"]')))
        with pytest.raises(HttpError) as refused:
            proc.spawn()
        proc.close()
        assert refused.value.status == 429
    finally:
        for _ in range(taken):
            execproc._slots.release()
