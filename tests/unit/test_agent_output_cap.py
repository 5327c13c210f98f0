"""The agent's output files: each stream stops at the pool's cap with a marker line, and the job goes on."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from firepool_agent import wire
from firepool_agent.output import MIN_MAX_BYTES, Output, cap_of, marker


def output(tmp_path: Path, cap: int) -> Output:
    return Output(tmp_path / "a", lambda: None, cap)  # the test feeds the pipes' reads by hand


def test_a_quiet_attempt_writes_no_file_and_reads_empty(tmp_path: Path) -> None:
    out = output(tmp_path, 8192)
    read_end, write_end = os.pipe()
    err_read, err_write = os.pipe()
    os.close(write_end)
    os.close(err_write)
    done = threading.Event()
    out.pump(read_end, err_read, done.set, inline=True)
    out.pump_for(5)
    assert done.is_set() and not (tmp_path / "a").exists()
    assert [out.read(s, 0, 1 << 20) for s in ("stdout", "stderr", "combined")] == [b"", b"", b""]
    out._append("stderr", b"late\n")  # the first byte creates them
    assert (tmp_path / "a" / "stderr").read_bytes() == b"late\n" and out.read("combined", 0, 10) == b"late\n"


def test_a_flooding_stream_stops_at_the_cap_with_a_marker_and_later_bytes_are_dropped(tmp_path: Path) -> None:
    cap = 8192
    out = output(tmp_path, cap)
    for _ in range(1000):  # 64 MB of reads; the files never pass the cap
        out._append("stdout", b"x" * (1 << 16))
    out.close()
    stdout = (tmp_path / "a" / "stdout").read_bytes()
    assert len(stdout) == cap == out.sizes["stdout"]
    assert stdout.endswith(marker(cap)) and stdout.startswith(b"x" * (cap - len(marker(cap))))
    assert (tmp_path / "a" / "combined").read_bytes() == stdout
    assert out.truncated == {"stdout", "combined"}


def test_a_quiet_stream_keeps_its_bytes_when_another_floods(tmp_path: Path) -> None:
    cap = 8192
    out = output(tmp_path, cap)
    out._append("stdout", b"y" * 20000)
    out._append("stderr", b"Traceback: the real error\n")
    out.close()
    assert (tmp_path / "a" / "stderr").read_bytes() == b"Traceback: the real error\n"
    assert out.truncated == {"stdout", "combined"}
    assert out.read("stdout", 0, 1 << 20).endswith(marker(cap))


def test_output_exactly_at_the_cap_less_the_marker_is_not_marked(tmp_path: Path) -> None:
    cap = 8192
    out = output(tmp_path, cap)
    out._append("stderr", b"z" * (cap - len(marker(cap))))
    out.close()
    assert out.truncated == set()
    assert out.sizes["stderr"] == cap - len(marker(cap))


@pytest.mark.parametrize("bad", [True, "1000000", 1.5, MIN_MAX_BYTES - 1, -1])
def test_a_launch_with_a_bad_cap_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="max_output_bytes"):
        cap_of({"max_output_bytes": bad})


def test_a_launch_without_a_cap_gets_the_default() -> None:
    assert cap_of({}) == 64 << 20


def test_the_agent_refuses_a_launch_whose_cap_is_too_small_for_the_marker() -> None:
    body = {"attempt_id": "j1:0", "argv": ["true"], "session": "s", "extra": {"max_output_bytes": 10}}
    with pytest.raises(wire.HttpError, match="max_output_bytes") as refused:
        wire.parse_launch(json.dumps(body).encode())
    assert refused.value.status == 400
    body["extra"] = {"max_output_bytes": MIN_MAX_BYTES}
    assert wire.parse_launch(json.dumps(body).encode()).extra["max_output_bytes"] == MIN_MAX_BYTES
