"""The dashboard shows a job's command as the caller asked for it: shell-quoted argv, MCP wrappers reduced.

The MCP server's real wrappers are built here (broker.sandbox.wrappers), so a change to them that the
dashboard no longer recognises fails this test rather than showing 900 characters of bash on the page.
"""

from __future__ import annotations

import shlex

import pytest

from broker.sandbox import wrappers
from broker.ui.commands import display_command


def test_plain_argv_is_quoted_as_a_shell_would() -> None:
    assert display_command(["sh", "-c", "echo hi; ls 'a b'"]) == """sh -c 'echo hi; ls '"'"'a b'"'"''"""
    assert display_command(["python3", "train.py", "--lr", "0.1"]) == "python3 train.py --lr 0.1"
    assert display_command(["echo", ""]) == "echo ''"


@pytest.mark.parametrize("command", ["echo hi", "ls -la | head -3; echo 'it''s' > out.txt", "x=1\nprint $x"])
def test_the_mcp_shell_wrapper_shows_the_callers_command_string(command: str) -> None:
    argv = wrappers.shell(command)
    assert len(" ".join(argv)) > 500  # the wrapper really is long: what this reduction is for
    assert display_command(argv) == command


def test_the_mcp_shell_wrapper_with_a_directory_says_where() -> None:
    assert display_command(wrappers.shell("make", "src/my dir")) == "cd 'src/my dir' && make"


def test_the_mcp_argv_wrapper_shows_the_quoted_argv() -> None:
    assert display_command(wrappers.wrap(["python3", "my script.py", "--n", "3"])) == "python3 'my script.py' --n 3"


def test_the_mcp_file_helper_shows_the_operation_and_its_paths() -> None:
    write = wrappers.files_op("write", {"files": [{"path": "a.txt", "text": "x"},
                                                      {"path": "b c.bin", "base64": "AA=="}]})
    assert display_command(write) == "files.write a.txt 'b c.bin'"
    read = wrappers.files_op("read", {"files": [{"path": "out/r.csv"}]})
    assert display_command(read) == "files.read out/r.csv"
    assert display_command(wrappers.files_op("list", {"path": "data", "depth": 2})) == "files.list data"
    assert display_command(wrappers.files_op("info", {})) == "files.info"


def test_package_installs_read_as_pip_install_though_wrapped() -> None:
    argv = wrappers.files_op("install", {"packages": ["numpy>=1.26", "pandas"]})
    assert argv[:2] == ["bash", "-c"]  # install runs through the command wrapper
    assert display_command(argv) == "pip install 'numpy>=1.26' pandas"


def test_a_large_file_payload_split_across_arguments_is_read_whole() -> None:
    big = [{"path": f"f{i}.txt", "text": "x" * 5000} for i in range(40)]
    argv = wrappers.files_op("write", {"files": big})
    assert len(argv) > 6  # the JSON travels in several argv strings
    assert display_command(argv) == "files.write " + " ".join(f"f{i}.txt" for i in range(40))


def test_look_alikes_without_the_wrappers_marks_are_shown_verbatim() -> None:
    fake = ["bash", "-c", "echo pwned", "firepool-call", "", "shell", "rm -rf /"]
    assert display_command(fake) == shlex.join(fake)
    not_files = ["python3", "-c", "print(1)", "write", "{}"]
    assert display_command(not_files) == "python3 -c 'print(1)' write '{}'"
    bad_mode = ["bash", "-c", wrappers.WRAPPER, "firepool-call", "", "other", "x"]
    assert display_command(bad_mode).startswith("bash -c ")


def test_a_file_helper_with_unreadable_json_still_names_its_operation() -> None:
    argv = ["python3", "-I", "-S", "-c", wrappers.FILES, "read", "{not json"]
    assert display_command(argv) == "files.read"


def test_a_session_command_with_a_directory_or_stdin_shows_what_was_asked() -> None:
    from broker.api.command_routes import CommandRequest

    argv = CommandRequest(command="make -j2", cwd="src dir", stdin="x").spec("t").command
    assert display_command(argv) == "cd 'src dir' && make -j2 < (stdin)"
    assert display_command(CommandRequest(command=["wc", "-c"], stdin="x").spec("t").command) == "wc -c < (stdin)"
    assert display_command(wrappers.files_op("remove", {"paths": ["a b", "c"]})) == "files.remove 'a b' c"
