"""A broker stopped (SIGTERM) while pods are still starting leaves no sandbox behind: neither bubblewrap nor the
agent of that state directory outlives it, whether the stop comes as a pod's record is written, as its bwrap was
launched, or once its agent answers but the start (a slow venue) has not ended.

Ten pods with capped disks start at once on a small host: their starts queue for worker threads, so the stop
catches some mid-launch, and their deletion outlasts the 5 s the broker's loops are given to stop (before the
fix, about one run in three left a bubblewrap process behind: a sandbox forked while its start was stopped)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

POOLS = ("pools:\n  - name: cpu\n    min_count: 10\n    max_count: 10\n"
         "    template: {start_delay_s: 30, workspace_size: 64Mi, memory: 512Mi}\n")


def processes_of(state_dir: Path) -> list[str]:
    """`pid: command line` of every live process whose command line names the state directory."""
    found = []
    needle = str(state_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if needle in cmdline and state not in ("Z", "X"):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")[:300]
            found.append(f"{entry}: {command}")
    return found


def wait_for_record(state_dir: Path, key: str | None, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in (state_dir / "pods").glob("*/pod.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if key is None or record.get(key):
                return record
        time.sleep(0.005)
    raise AssertionError(f"no pod record{' with ' + key if key else ''} after {timeout_s} s")


@pytest.mark.parametrize("stop_at", ["record", "launcher_pid", "pid"])
def test_sigterm_while_pods_start_leaves_no_sandbox(tmp_path: Path, stop_at: str) -> None:
    state = tmp_path / "state"
    broker = BrokerProcess(state, pools=POOLS, extra=("--keep-pods",))  # started pods would stay: none has
    try:
        wait_for_record(state, None if stop_at == "record" else stop_at)
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGTERM)  # the broker alone: pods run in sessions of their own
        broker.proc.wait(60)
        time.sleep(1.0)  # a stray sandbox would be up by now
        assert processes_of(state) == [], broker.log()[-3000:]
        assert list((state / "pods").glob("*/pod.json")) == []
    finally:
        broker.stop()
