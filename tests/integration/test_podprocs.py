"""A pod's processes start with every signal a job relies on at its default action, whatever the broker ignores."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from broker.backends.podprocs import PodProcesses

pytestmark = pytest.mark.integration


def test_a_broker_that_ignores_sigint_starts_pods_that_do_not(tmp_path: Path) -> None:
    log = tmp_path / "pod.log"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a script's `firepool serve &` starts
    quit_before = signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    try:
        pid, _ = PodProcesses().spawn(["/bin/sh", "-c", "grep SigIgn /proc/self/status"], {"PATH": "/usr/bin:/bin"},
                                      "secret", log, with_info=False)
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGQUIT, quit_before)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 5
    while "SigIgn" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    ignored = int(log.read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGINT - 1)) and not ignored & (1 << (signal.SIGQUIT - 1)), hex(ignored)
