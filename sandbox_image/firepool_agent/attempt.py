"""One attempt's record (what `wait` and the broker's `AttemptStatus` read), its launch request, and the
name of its directory."""

from __future__ import annotations

import hashlib
import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firepool_agent import overlimit
from firepool_agent.output import Output


class Conflict(Exception):
    """Another attempt is running (`retryable`: ask again once it ended), or the attempt id was used before."""

    def __init__(self, message: str, *, retryable: bool = False, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.details = dict(details or {})


@dataclass(frozen=True)
class ResetSpec:
    wipe_workspace: bool = False
    wipe_paths: tuple[str, ...] = ()
    keep_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchSpec:
    attempt_id: str
    argv: Sequence[str]
    env: Mapping[str, str]
    session: str
    cwd: str | None = None
    timeout_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    reset_after: ResetSpec | None = None
    """Reset the pod as soon as the attempt ends within the launch's wait, its logs inline in the answer: the
    broker's reset request folded into the launch (`server`)."""


class Attempt:
    """One execution of a job on this pod; fields mirror the broker's `AttemptStatus`."""

    def __init__(self, attempt_id: str, session: str, directory: Path) -> None:
        self.attempt_id = attempt_id
        self.session = session
        self.directory = directory
        self.running = True
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.timed_out = False
        self.cancelled = False
        self.oom = False
        self.started_at: float | None = None
        self.first_instruction_at: float | None = None
        self.finished_at: float | None = None
        self.error_class: str | None = None
        self.message: str | None = None
        self.timings: dict[str, float] = {}
        self.output: Output | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self.wait_status: int | None = None
        self.drained = False
        self.timer: threading.Timer | None = None
        self.counters = overlimit.Counters()
        """The pod's cgroup counters at launch: a rise by the exit names the limit the attempt hit."""
        self.hardware_fault: str | None = None
        """Why the attempt failed on hardware (`hwfaults`), reported so the broker can quarantine the GPU."""
        self.kernel: dict[str, Any] | None = None
        """A kernel attempt's connection info (keys, ports) once its kernel reported it; never in `to_json`,
        never logged: served only by `GET /v1/attempts/{id}/kernel`, and dropped when the attempt ends."""

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt_id": self.attempt_id, "running": self.running, "pid": self.pid,
            "exit_code": self.exit_code, "signal": self.signal, "timed_out": self.timed_out,
            "cancelled": self.cancelled, "oom": self.oom, "started_at": self.started_at,
            "first_instruction_at": self.first_instruction_at, "finished_at": self.finished_at,
            "error_class": self.error_class, "message": self.message, "timings": dict(self.timings),
            "hardware_fault": self.hardware_fault,
        }


def safe_name(attempt_id: str) -> str:
    """A directory name for an attempt id: readable, and distinct for distinct ids."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", attempt_id)[:64].lstrip(".") or "attempt"
    return f"{readable}.{hashlib.sha256(attempt_id.encode()).hexdigest()[:10]}"
