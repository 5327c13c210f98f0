"""`firepool submit --from FILE` reads JSON Lines (an argv array or a job body a line, blank lines skipped) and
names the line that is not a job; progress off a terminal is a plain line now and then and one at the end."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from broker.cli import main
from broker.cli_commands import UsageError
from broker.cli_fanout import FanoutProgress, read_items
from broker.client_core import JobInfo


def test_lines_are_argv_arrays_or_job_bodies_and_blank_ones_are_skipped(tmp_path: Path) -> None:
    source = tmp_path / "jobs.jsonl"
    source.write_text('["echo", "a"]\n\n{"command": ["echo", "b"], "pool": "gpu"}\n   \n')
    assert read_items(str(source)) == ([["echo", "a"], {"command": ["echo", "b"], "pool": "gpu"}], [1, 3])
    assert read_items("-", io.StringIO('["true"]\n')) == ([["true"]], [1])


@pytest.mark.parametrize(("text", "message"), [
    ('["true"]\n{"command": "echo hi"}\n', "line 2: a job is an argv array"),
    ('["true"]\n\n[1, 2]\n', "line 3: a job is an argv array"),
    ('["true"\n', "line 1: not JSON"),
    ("\n\n", "no jobs in it"),
])
def test_a_line_that_is_not_a_job_is_named(tmp_path: Path, text: str, message: str) -> None:
    source = tmp_path / "jobs.jsonl"
    source.write_text(text)
    with pytest.raises(UsageError, match=message):
        read_items(str(source))


def test_a_missing_file_or_a_command_beside_from_is_a_one_line_usage_error(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--from", str(tmp_path / "nope.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == f"firepool: --from {tmp_path / 'nope.jsonl'}: no such file"
    (tmp_path / "jobs.jsonl").write_text('["true"]\n')
    assert main(["submit", "--from", str(tmp_path / "jobs.jsonl"), "--", "echo"]) == 2
    assert "give no command" in capsys.readouterr().err


def test_progress_off_a_terminal_ends_with_a_count_of_done_and_failed() -> None:
    out = io.StringIO()
    with FanoutProgress(2, out) as progress:
        progress.finished(JobInfo.from_json({"id": "j-1", "state": "SUCCEEDED"}))
        progress.finished(JobInfo.from_json({"id": "j-2", "state": "FAILED"}))
    last = out.getvalue().strip().splitlines()[-1]
    assert "2/2 done, 1 failed" in last and "jobs/s" in last
