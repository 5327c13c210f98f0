"""Every mistake a user makes at the CLI ends as one line on stderr and a non-zero exit, never a traceback;
and the broker announces itself in broker.json only while it can be reached."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BrokerProcess, delete_pods, free_port

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "broker.cli"]


def firepool(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def assert_one_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """One line of message on stderr, a non-zero exit, no traceback; returns the line."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0, r
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def no_broker_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FIREPOOL_URL", "FIREPOOL_TOKEN")}
    return {**env, "FIREPOOL_STATE_DIR": str(tmp_path / "nobroker")}


def test_mistakes_made_without_a_broker_are_one_line_messages(tmp_path: Path) -> None:
    env = no_broker_env(tmp_path)
    bad_catalog = tmp_path / "pools.yaml"
    bad_catalog.write_text("pools:\n  - name: cpu\n    max_count: 2\n    colour: blue\n")
    assert_one_line(firepool("submit", "--requirements", "/nonexistent/reqs.txt", "--wait", "--", "true", env=env),
                    "--requirements /nonexistent/reqs.txt")
    assert_one_line(firepool("submit", "--package", str(tmp_path / "nodir"), "--", "true", env=env),
                    "--package", "nodir")
    assert_one_line(firepool("serve", "--pools", str(tmp_path / "none.yaml"), env=env), "--pools", "none.yaml")
    assert_one_line(firepool("serve", "--tokens", str(tmp_path / "none.json"), env=env), "--tokens", "none.json")
    assert_one_line(firepool("serve", "--pools", str(bad_catalog), env=env), str(bad_catalog), "pools[0].colour", "unknown key")
    assert_one_line(firepool("jobs", env=env), "cannot reach the broker", "firepool serve", "FIREPOOL_URL")


def test_a_typo_in_a_flag_shows_the_subcommands_usage(tmp_path: Path) -> None:
    r = firepool("submit", "--wiat", "--", "true", env=no_broker_env(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("usage: firepool submit")
    assert r.stderr.strip().splitlines()[-1] == "firepool submit: error: unrecognized arguments: --wiat"


def test_a_stale_broker_json_is_ignored_with_what_to_do(tmp_path: Path) -> None:
    env = no_broker_env(tmp_path)
    state = Path(env["FIREPOOL_STATE_DIR"])
    state.mkdir(parents=True)
    (state / "broker.json").write_text(json.dumps({"url": f"http://127.0.0.1:{free_port()}", "pid": 2**31 - 1}))
    assert_one_line(firepool("pools", env=env), "left over", "firepool serve", "FIREPOOL_URL")


def test_version_and_bare_command() -> None:
    from importlib.metadata import version

    r = firepool("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"firepool {version('firepool')}"
    bare = firepool()
    assert bare.returncode == 2 and "usage: firepool" in bare.stderr and "submit" in bare.stderr


def test_mistakes_against_a_running_broker_are_one_line_messages(broker: BrokerProcess, tmp_path: Path) -> None:
    env = broker.env()
    assert_one_line(firepool("submit", "--pool", "nosuch", "--", "true", env=env),
                    "UnknownPool", "'nosuch'", "cpu", "gpu")
    assert_one_line(firepool("pods", "--pool", "nosuch", env=env), "nosuch", "cpu")
    done = firepool("submit", "--wait", "--", "true", env=env)
    assert done.returncode == 0, done.stderr
    job_id = done.stderr.strip().splitlines()[-1].split(":")[0]
    assert_one_line(firepool("cancel", job_id, env=env), job_id, "already finished (SUCCEEDED)")

    timed_out = firepool("submit", "--wait", "--timeout", "1", "--", "sleep", "30", env=env)
    assert timed_out.returncode == 124 and "Traceback" not in timed_out.stderr
    assert "Timeout" in timed_out.stderr.strip().splitlines()[-1]

    follow = subprocess.Popen([*CLI, "submit", "--wait", "--", "sleep", "30"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert follow.stderr is not None
    first = follow.stderr.readline()  # "[   0.0s] <job id>: QUEUED|RUNNING"
    running_id = first.split("] ", 1)[1].split(":")[0]
    cancelled = firepool("cancel", running_id, env=env)
    assert cancelled.returncode == 0 and running_id in cancelled.stdout
    _, err = follow.communicate(timeout=60)
    assert follow.returncode != 0 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"{running_id}: Cancelled"


def test_a_closed_pipe_ends_the_listing_quietly(broker: BrokerProcess, tmp_path: Path) -> None:
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        p = subprocess.Popen([*CLI, "jobs"], env=broker.env(), stdout=subprocess.PIPE, stderr=err)
        assert p.stdout is not None
        p.stdout.close()  # like `firepool jobs | head -0`: the reader is gone before the table is written
        p.wait(60)
    assert p.returncode != 0 and err_path.read_text() == ""


def test_jobs_table_shows_each_command_on_one_line(broker: BrokerProcess) -> None:
    env = broker.env()
    script = "import sys\nprint('a' * 100)\nsys.exit(0)"
    r = firepool("submit", "--wait", "--", "python3", "-c", script, env=env)
    assert r.returncode == 0, r.stderr
    table = firepool("jobs", env=env).stdout.splitlines()
    assert table[0].split() == ["ID", "STATE", "POOL", "TAG", "PATH", "EXIT", "ERROR", "COMMAND"]
    assert len(table) == 2 and "python3 -c 'import sys⏎print(" in table[1] and table[1].endswith("…")


def wait_for(path: Path, present: bool, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while path.exists() != present:
        assert time.monotonic() < deadline, f"{path} {'never appeared' if present else 'was never removed'}"
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_broker_json_is_written_after_bind_and_removed_at_shutdown(tmp_path: Path, sig: signal.Signals) -> None:
    b = BrokerProcess(tmp_path / "state")
    try:
        announced = tmp_path / "state" / "broker.json"
        wait_for(announced, True)
        data = json.loads(announced.read_text())
        assert b.proc is not None and data == {"url": b.url, "pid": b.proc.pid,
                                               "store": f"sqlite:///{tmp_path / 'state' / 'firepool.db'}"}
        assert httpx.get(data["url"] + "/healthz", timeout=5).json()["ok"]  # announced, so reachable
        os.kill(b.proc.pid, sig)
        assert b.proc.wait(30) in (0, -sig, 128 + sig)  # uvicorn re-raises the signal once it has shut down
        assert not announced.exists()
    finally:
        b.stop()


SERVE = """
import sys
from pathlib import Path
from broker.server import ServeSettings, serve
sys.exit(serve(ServeSettings(state_dir=Path(sys.argv[1]), port=int(sys.argv[2]), virtual_gpus=0)))
"""


def test_a_broker_that_cannot_bind_never_announces_itself(tmp_path: Path) -> None:
    """The server itself (not the CLI's early port check): control plane up, bind fails, no broker.json."""
    state = tmp_path / "state"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            r = subprocess.run([sys.executable, "-c", SERVE, str(state), str(port)], capture_output=True, text=True,
                               timeout=60)
        finally:
            delete_pods(state)
    assert r.returncode != 0 and "address already in use" in r.stderr
    assert not (state / "broker.json").exists()


def test_serve_refuses_a_taken_port_and_a_state_dir_led_from_another_store_up_front(broker: BrokerProcess,
                                                                                    tmp_path: Path) -> None:
    env = no_broker_env(tmp_path)
    assert_one_line(firepool("serve", "--port", str(broker.port), "--state-dir", str(tmp_path / "other"), env=env),
                    f"--port {broker.port}", "--port 0")
    # The same store would make a standby (docs/ha.md); another store would drive the same pods from two leaders.
    assert_one_line(firepool("serve", "--port", "0", "--state-dir", str(broker.state_dir), "--db",
                             f"sqlite:///{tmp_path / 'elsewhere.db'}", env=env),
                    "another job store", broker.url)
