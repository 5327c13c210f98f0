"""A kernel attempt's connection info: read from the kernel's report pipe, kept on the attempt, waited for.

The kernel writes one JSON line (its ports, HMAC key and CurveZMQ keys) to a pipe the agent made for the
attempt, never to its stdout: job logs are stored, copied and shown, and a key in them let an admin run
code in another caller's kernel. A thread per kernel attempt reads at most `MAX_REPORT` bytes, keeps the
first well-formed line on the attempt, and wakes waiters. Nothing here logs the line or any part of it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import MutableMapping
from typing import Any

from firepool_agent.attempt import Attempt
from firepool_agent.kernel_bind import REPORT_FD_ENV

log = logging.getLogger(__name__)

MAX_REPORT = 64 << 10
"""The most bytes read from one report pipe (a connection line is under 1 KiB)."""
REQUIRED = ("ip", "transport", "key", "signature_scheme", "shell_port", "iopub_port", "stdin_port",
            "control_port", "hb_port")


def pipe(env: MutableMapping[str, str]) -> tuple[int, int]:
    """A new report pipe (read end, write end); `env` names the write end for a kernel started normally
    (a pre-started one gets it with its bind and sets its own number)."""
    report = os.pipe()
    env[REPORT_FD_ENV] = str(report[1])
    return report


def close(report: tuple[int, int] | None) -> None:
    if report is not None:
        for fd in report:
            os.close(fd)


def parse(data: bytes) -> dict[str, Any] | None:
    """The first line as connection info, or None when it is not one (the caller says so without quoting it)."""
    line, _, _ = data.partition(b"\n")
    try:
        info = json.loads(line)
    except ValueError:
        return None
    if not isinstance(info, dict) or any(k not in info for k in REQUIRED):
        return None
    return info


def follow(attempt: Attempt, report: tuple[int, int], cond: threading.Condition) -> threading.Thread:
    """Close the agent's write end (the kernel holds its own) and read the pipe until EOF on a daemon thread;
    the info lands on `attempt.kernel` under `cond`."""
    os.close(report[1])
    thread = threading.Thread(target=_read, args=(attempt, report[0], cond), name=f"kernel-report-{attempt.attempt_id}",
                              daemon=True)
    thread.start()
    return thread


def _read(attempt: Attempt, fd: int, cond: threading.Condition) -> None:
    data = b""
    try:
        while len(data) < MAX_REPORT and b"\n" not in data:
            chunk = os.read(fd, MAX_REPORT - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    finally:
        os.close(fd)
    info = parse(data)
    if info is None:
        if data:
            log.warning("%s: the kernel's report was not a connection line (%d bytes, not shown)",
                        attempt.attempt_id, len(data))
        return
    with cond:
        if attempt.running:
            attempt.kernel = info
        cond.notify_all()


def wait(attempt: Attempt, cond: threading.Condition, wait_s: float) -> dict[str, Any]:
    """`{"running", "connection"}` once the kernel reported, the attempt ended, or `wait_s` passed."""
    with cond:
        if wait_s > 0:
            cond.wait_for(lambda: attempt.kernel is not None or not attempt.running, timeout=wait_s)
        return {"running": attempt.running, "connection": attempt.kernel}
