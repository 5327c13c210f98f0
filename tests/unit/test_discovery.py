"""One discovery rule for every client: explicit URL/token, then FIREPOOL_URL/FIREPOOL_TOKEN, then the state
dir (argument, then FIREPOOL_STATE_DIR, then $XDG_DATA_HOME/firepool), whose broker.json counts only while
its broker's pid lives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from broker.locations import DEFAULT_PORT, discover, state_dir_for

DEAD_PID = 2**31 - 1  # above any pid_max Linux allows


def announce(state: Path, url: str, pid: int, token: str = "tok") -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "broker.json").write_text(json.dumps({"url": url, "pid": pid}))
    (state / "token").write_text(token + "\n")
    (state / "token").chmod(0o600)


def test_the_environment_wins_over_the_state_dir(tmp_path: Path) -> None:
    announce(tmp_path, "http://127.0.0.1:1111", os.getpid())
    env = {"FIREPOOL_URL": "http://broker:9/", "FIREPOOL_TOKEN": "envtok", "FIREPOOL_STATE_DIR": str(tmp_path)}
    found = discover(env=env)
    assert (found.url, found.token, found.source) == ("http://broker:9", "envtok", "environment")


def test_explicit_arguments_win_over_the_environment(tmp_path: Path) -> None:
    found = discover("http://mine:1", "argtok", env={"FIREPOOL_URL": "http://env:2", "FIREPOOL_TOKEN": "e"})
    assert (found.url, found.token, found.source) == ("http://mine:1", "argtok", "argument")


def test_a_live_broker_json_gives_the_url_and_the_token_file_the_token(tmp_path: Path) -> None:
    announce(tmp_path, "http://127.0.0.1:4242", os.getpid(), token="localtok")
    found = discover(state_dir=tmp_path, env={})
    assert (found.url, found.token, found.source, found.hint) == ("http://127.0.0.1:4242", "localtok",
                                                                  "broker.json", "")


def test_the_state_dir_argument_wins_over_firepool_state_dir_which_wins_over_xdg(tmp_path: Path) -> None:
    env = {"FIREPOOL_STATE_DIR": str(tmp_path / "env"), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    assert state_dir_for(tmp_path / "arg", env) == tmp_path / "arg"
    assert state_dir_for(None, env) == tmp_path / "env"
    assert state_dir_for(None, {"XDG_DATA_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg" / "firepool"
    announce(tmp_path / "xdg" / "firepool", "http://127.0.0.1:5151", os.getpid())
    assert discover(env={"XDG_DATA_HOME": str(tmp_path / "xdg")}).url == "http://127.0.0.1:5151"


def test_a_broker_json_whose_pid_is_dead_is_ignored_with_a_hint(tmp_path: Path) -> None:
    announce(tmp_path, "http://127.0.0.1:4343", DEAD_PID)
    found = discover(state_dir=tmp_path, env={})
    assert found.url == f"http://127.0.0.1:{DEFAULT_PORT}" and found.source == "default"
    assert f"pid {DEAD_PID} is not running" in found.hint
    assert "firepool serve" in found.hint and "FIREPOOL_URL" in found.hint


def test_no_broker_json_says_how_to_start_one(tmp_path: Path) -> None:
    found = discover(state_dir=tmp_path, env={})
    assert found.source == "default" and found.token == ""
    assert "no broker is running" in found.hint and "firepool serve" in found.hint


def test_a_corrupt_broker_json_is_ignored_not_raised(tmp_path: Path) -> None:
    (tmp_path / "broker.json").write_text("{not json")
    found = discover(state_dir=tmp_path, env={})
    assert found.source == "default" and "unreadable" in found.hint


def test_the_sdk_uses_the_same_rule(tmp_path: Path) -> None:
    from broker.client import Client

    announce(tmp_path, "http://127.0.0.1:4444", os.getpid(), token="sdktok")
    saved = {k: os.environ.pop(k, None) for k in ("FIREPOOL_URL", "FIREPOOL_TOKEN")}
    try:
        with Client(state_dir=tmp_path) as fp:
            assert fp.url == "http://127.0.0.1:4444" and fp.found.token == "sdktok"
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def test_a_token_file_others_may_read_is_refused_not_ignored(tmp_path: Path) -> None:
    from broker.locations import InsecureFileError

    announce(tmp_path, "http://127.0.0.1:1111", os.getpid())
    (tmp_path / "token").chmod(0o644)
    with pytest.raises(InsecureFileError, match="0644 are too open"):
        discover(env={"FIREPOOL_STATE_DIR": str(tmp_path)})
