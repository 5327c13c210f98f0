"""Terminals through the broker: a real `firepool serve`, a real sandbox's shell on a PTY, real clients
(the websocket protocol with the `websockets` client; `firepool shell` driven by pexpect on a PTY)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pexpect
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from bench.pty_echo import echo_round_trips
from broker.cli_shell import terminal_socket, terminal_url
from broker.errors import NotFound, Unauthorized
from tests.integration.conftest import BrokerProcess, both_backends, run_job

pytestmark = pytest.mark.integration


def _session(broker: BrokerProcess, tag: str, caller: str = "alice", command: str = "true") -> dict[str, Any]:
    job = run_job(broker.client(caller), {"command": ["sh", "-c", command], "pool": "cpu", "lease_tag": tag})
    assert job["state"] == "SUCCEEDED", job
    return job


def _read_until(ws: ClientConnection, needle: str, timeout: float = 15.0) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        try:
            message = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        except TimeoutError:
            raise AssertionError(f"{needle!r} never came; the terminal showed {seen!r}") from None
        if message[0] == "stdout":
            seen += message[1]
        elif message[0] == "exit":
            seen += f"<exit {message[1]}>"
    return seen


def _send(ws: ClientConnection, *frame: object) -> None:
    ws.send(json.dumps(list(frame)))


@both_backends
def test_websocket_terminal_runs_in_the_session_workspace_resizes_signals_and_reports_the_exit_code(
        broker: BrokerProcess) -> None:
    _session(broker, "ws1", command="echo from-the-job > left.txt; cat /proc/self/cgroup > cgroup.txt")
    with terminal_socket(broker.url, broker.tokens["alice"], "ws1", rows=31, cols=101) as ws:
        _send(ws, "stdin", "cat left.txt; stty size; echo \"$FIREPOOL_LEASE_TAG/$FIREPOOL_CALLER\" $TERM\r")
        seen = _read_until(ws, "xterm-256color")
        assert "from-the-job" in seen and "31 101" in seen and "ws1/alice xterm-256color" in seen
        _send(ws, "stdin", "[ \"$(cat cgroup.txt)\" = \"$(cat /proc/self/cgroup)\" ] && echo same-''cgroup\r")
        _read_until(ws, "same-cgroup")  # the pod's limits hold the shell as they hold a job
        _send(ws, "set_size", 40, 132)
        _send(ws, "stdin", "stty size\r")
        assert "40 132" in _read_until(ws, "40 132")
        # The foreground job says it runs before the SIGINT goes (a fixed pause lost the race on a loaded machine:
        # a SIGINT before the shell forks reaches only the shell, which ignores it at its prompt).
        _send(ws, "stdin", "sh -c 'echo sleep''ing; exec sleep 60'\r")
        _read_until(ws, "sleeping")
        _send(ws, "signal", "SIGINT")
        _send(ws, "stdin", "echo rc=$?\r")
        assert "rc=130" in _read_until(ws, "rc=130")
        _send(ws, "stdin", "printf '\\303\\251t\\303\\251\\n'\r")  # UTF-8 split anywhere still decodes whole
        assert "été" in _read_until(ws, "été")
        _send(ws, "stdin", "exit 3\r")
        assert _read_until(ws, "<exit").endswith("<exit 3>")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


def test_terminal_refusals_are_typed_before_the_websocket_opens(broker: BrokerProcess) -> None:
    _session(broker, "mine")
    url = terminal_url(broker.url, "mine")
    with pytest.raises(InvalidStatus) as no_token:
        connect(url, open_timeout=10)
    assert no_token.value.response.status_code == 401
    assert json.loads(no_token.value.response.body)["error"]["class"] == "Unauthorized"
    with pytest.raises(Unauthorized):
        terminal_socket(broker.url, "not-a-token", "mine")
    with pytest.raises(NotFound):  # bob's tag space holds no session "mine": alice's is not his to open
        terminal_socket(broker.url, broker.tokens["bob"], "mine")
    with pytest.raises(NotFound):
        terminal_socket(broker.url, broker.tokens["alice"], "never-used")
    with pytest.raises(InvalidStatus) as unknown:
        connect(url + "&shell=zsh", additional_headers={"Authorization": f"Bearer {broker.tokens['alice']}"},
                open_timeout=10)
    assert unknown.value.response.status_code == 422
    assert json.loads(unknown.value.response.body)["error"]["class"] == "UnknownField"


def test_an_oversize_or_malformed_frame_closes_the_terminal_and_its_shell(broker: BrokerProcess) -> None:
    _session(broker, "big")
    token = broker.tokens["alice"]
    with terminal_socket(broker.url, token, "big") as ws:
        _send(ws, "stdin", "echo $$ > shell.pid\r")
        _read_until(ws, "$ ")
        ws.send(json.dumps(["stdin", "x" * (300 << 10)]))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    with terminal_socket(broker.url, token, "big") as ws:
        ws.send("not json")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007


def test_a_reset_of_the_session_kills_the_terminals_processes(broker: BrokerProcess) -> None:
    _session(broker, "rs")
    with terminal_socket(broker.url, broker.tokens["alice"], "rs") as ws:
        _send(ws, "stdin", "sleep 600 & echo b''g=$!.\r")  # the echoed line never reads "bg="
        started = _read_until(ws, "bg=")
        started += _read_until(ws, ".") if "." not in started[started.index("bg="):] else ""
        background = started[started.index("bg=") + 3:started.index(".", started.index("bg="))]
        assert background.isdigit(), started
        # The session's next job ends in a reset, which kills every process of the sandbox, the shell too.
        assert _session(broker, "rs", command="echo job ran")["state"] == "SUCCEEDED"
        assert _read_until(ws, "<exit", timeout=30).endswith("<exit 137>")  # 128 + SIGKILL
    with terminal_socket(broker.url, broker.tokens["alice"], "rs") as ws:  # the same sandbox, after its reset
        _send(ws, "stdin", f"kill -0 {background} 2>/dev/null; echo alive=$?.\r")
        assert "alive=1." in _read_until(ws, "alive=1.")


def test_pty_echo_round_trip_is_fast(broker: BrokerProcess) -> None:
    _session(broker, "echo")
    p50 = echo_round_trips(broker.url, broker.tokens["alice"], "echo", n=100)["p50_ms"]
    print(f"PTY echo round trip p50 {p50:.2f} ms")
    assert p50 <= 10.0


def test_firepool_shell_attaches_the_terminal_like_kubectl_exec(broker: BrokerProcess, tmp_path: Path) -> None:
    _session(broker, "cli", command="echo kept-by-the-session > note.txt")
    env = {**broker.env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "TERM": "xterm"}
    child = pexpect.spawn("firepool", ["shell", "cli"], env=env, dimensions=(30, 100), timeout=30,
                          encoding="utf-8")
    child.expect_exact("$ ")  # the remote shell's prompt: attached
    child.sendline("cat note.txt; stty size")
    child.expect("kept-by-the-session")
    child.expect("30 100")
    child.setwinsize(45, 120)  # SIGWINCH in the CLI -> set_size -> the remote PTY
    time.sleep(0.3)
    child.sendline("stty size")
    child.expect("45 120")
    child.sendline("sleep 60")
    time.sleep(0.5)
    child.sendcontrol("c")  # raw mode: Ctrl-C is a byte for the remote terminal, not SIGINT for the CLI
    child.sendline("echo rc=$?")
    child.expect("rc=130")
    child.sendline("exit 3")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3


def test_firepool_shell_starts_the_session_when_there_is_none(broker: BrokerProcess) -> None:
    env = {**broker.env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    child = pexpect.spawn("firepool", ["shell", "fresh", "--pool", "cpu", "-c", "pwd; exit 7"], env=env,
                          timeout=60, encoding="utf-8")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 7
    pods = httpx.get(broker.url + "/v1/pods", headers={"Authorization": f"Bearer {broker.tokens['alice']}"}).json()
    assert any(p.get("tag") == "fresh" or "fresh" in json.dumps(p) for p in pods["pods"])


def test_a_websocket_url_with_a_nul_is_the_doors_typed_422(broker: BrokerProcess) -> None:
    _session(broker, "nul")
    with pytest.raises(InvalidStatus) as bad:
        connect(terminal_url(broker.url, "nul") + "&queue=%00", open_timeout=10,
                additional_headers={"Authorization": f"Bearer {broker.tokens['alice']}"})
    assert bad.value.response.status_code == 422
    assert json.loads(bad.value.response.body)["error"]["class"] == "InvalidRequest"


def test_firepool_shell_reads_piped_input_to_its_end(broker: BrokerProcess) -> None:
    import subprocess

    _session(broker, "piped")
    env = {**broker.env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["firepool", "shell", "piped"], input=b"echo via-''pipe\nexit 6\n", env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 6, done.stderr
    assert b"via-pipe" in done.stdout
    ended = subprocess.run(["firepool", "shell", "piped"], input=b"true\n", env=env, capture_output=True, timeout=60)
    assert ended.returncode == 0, ended.stderr  # the input's end reached the shell as Ctrl-D: it exited
