"""The restartable kernel launcher's supervisor with real processes: SIGHUP replaces the child (only the
first reports), SIGINT reaches the child alone, and a child that exits by itself ends it with its code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = """
import os, signal, sys, time
from firepool_agent.kernel_supervise import supervise
out = sys.argv[1]

def child(first):
    with open(out, "a") as f:
        f.write(f"{os.getpid()} {int(first)}\\n")
    try:
        while not os.path.exists(out + ".exit"):
            time.sleep(0.01)
    except KeyboardInterrupt:
        with open(out, "a") as f:
            f.write("interrupted\\n")
        while not os.path.exists(out + ".exit"):
            time.sleep(0.01)
    return 3

sys.exit(supervise(child, -1))
"""


def lines(path: Path, n: int) -> list[str]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = path.read_text().splitlines() if path.exists() else []
        if len(got) >= n:
            return got
        time.sleep(0.01)
    raise AssertionError(f"{path} has {got}")


def test_sighup_replaces_the_child_sigint_reaches_it_and_its_exit_ends_the_supervisor(tmp_path: Path) -> None:
    out = tmp_path / "children"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out)], env=env, start_new_session=True)
    try:
        first_pid, first = lines(out, 1)[0].split()
        assert first == "1"
        os.kill(proc.pid, signal.SIGHUP)
        second_pid, second = lines(out, 2)[1].split()
        assert second == "0" and second_pid != first_pid
        assert not Path(f"/proc/{first_pid}").exists()  # killed and reaped
        os.killpg(proc.pid, signal.SIGINT)  # an interrupt goes to the process group, as the agent sends it
        assert lines(out, 3)[2] == "interrupted"
        assert proc.poll() is None
        (tmp_path / "children.exit").write_text("")
        assert proc.wait(10) == 3
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
