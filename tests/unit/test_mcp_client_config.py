"""`firepool mcp config --client NAME`: each client's own format, valid, with this install's absolute firepool."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from broker.cli import main
from mcp_server.client_config import CLIENTS, firepool_command, snippet

JSON_CLIENTS = ("claude-desktop", "cursor", "vscode")


def run_config(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert main(["mcp", "config", *argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.fixture(autouse=True)
def no_broker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FIREPOOL_URL", "FIREPOOL_TOKEN", "FIREPOOL_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_the_command_is_the_absolute_firepool_beside_this_python() -> None:
    command = firepool_command()
    assert Path(command[0]).is_absolute() and os.access(command[0], os.X_OK)
    beside = Path(sys.executable).parent / "firepool"
    assert command == ([str(beside.absolute())] if beside.is_file() else [str(Path(sys.executable).absolute()),
                                                                          "-m", "broker.cli"])


@pytest.mark.parametrize("client", ["claude-desktop", "cursor"])
def test_claude_desktop_and_cursor_get_an_mcpservers_entry_with_an_absolute_command(
        client: str, capsys: pytest.CaptureFixture[str]) -> None:
    out, err = run_config(["--client", client], capsys)
    entry = json.loads(out)["mcpServers"]["firepool"]
    assert Path(entry["command"]).is_absolute()
    assert entry["args"][-1] == "mcp" and "env" not in entry  # the local broker: found through the state dir
    assert err.startswith("# ") and len(err.strip().splitlines()) == 1


def test_vscode_gets_a_stdio_server_under_servers(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = run_config(["--client", "vscode", "--pool", "gpu"], capsys)
    config = json.loads(out)
    assert list(config) == ["servers"]
    server = config["servers"]["firepool"]
    assert server["type"] == "stdio" and Path(server["command"]).is_absolute()
    assert server["args"][-3:] == ["mcp", "--pool", "gpu"]


def test_vscode_prompts_for_the_token_of_a_remote_broker(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = run_config(["--client", "vscode", "--url", "http://broker:8321"], capsys)
    config = json.loads(out)
    env = config["servers"]["firepool"]["env"]
    assert env == {"FIREPOOL_URL": "http://broker:8321", "FIREPOOL_TOKEN": "${input:firepoolToken}"}
    assert [i["id"] for i in config["inputs"]] == ["firepoolToken"] and config["inputs"][0]["password"] is True


def test_claude_code_gets_a_claude_mcp_add_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = run_config(["--client", "claude-code", "--url", "http://broker:8321"], capsys)
    words = shlex.split(out.strip())
    assert words[:3] == ["claude", "mcp", "add"]
    assert "FIREPOOL_URL=http://broker:8321" in words and "FIREPOOL_TOKEN=$FIREPOOL_TOKEN" in out
    command = words[words.index("--") + 1:]
    assert Path(command[0]).is_absolute() and command[-1] == "mcp"
    assert words[words.index("--") - 1] == "firepool"


def test_the_url_given_before_config_reaches_the_snippet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "--url", "http://broker:8321", "config", "--client", "cursor"]) == 0
    out, err = capsys.readouterr()
    env = json.loads(out)["mcpServers"]["firepool"]["env"]
    assert env["FIREPOOL_URL"] == "http://broker:8321" and env["FIREPOOL_TOKEN"] == "<your broker token>"
    assert "replace <your broker token>" in err


def test_the_environment_url_is_the_default(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FIREPOOL_URL", "http://elsewhere:8321")
    monkeypatch.setenv("FIREPOOL_TOKEN", "secret-token-not-to-print")
    out, err = run_config(["--client", "claude-desktop"], capsys)
    assert json.loads(out)["mcpServers"]["firepool"]["env"]["FIREPOOL_URL"] == "http://elsewhere:8321"
    assert "secret-token-not-to-print" not in out + err


def test_a_local_broker_in_another_state_dir_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FIREPOOL_STATE_DIR", str(tmp_path))
    entry = json.loads(snippet("cursor"))["mcpServers"]["firepool"]
    assert entry["env"] == {"FIREPOOL_STATE_DIR": str(tmp_path)}


@pytest.mark.parametrize("client", JSON_CLIENTS)
def test_every_json_snippet_parses_and_names_one_server(client: str) -> None:
    config = json.loads(snippet(client, url="http://b:1", token="t", pool="cpu", name="fp"))
    servers = config["servers" if client == "vscode" else "mcpServers"]
    assert list(servers) == ["fp"] and servers["fp"]["env"]["FIREPOOL_TOKEN"] == "t"


def test_an_unknown_client_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["mcp", "config", "--client", "emacs"])
    assert exit_.value.code == 2 and "invalid choice: 'emacs'" in capsys.readouterr().err
    assert set(CLIENTS) == {"claude-desktop", "cursor", "vscode", "claude-code"}
