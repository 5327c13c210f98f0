"""Processes started beside the session's job: the terminal's shell and exec'd commands share this context.

A process spawned here runs as a job of the session would (`Attempts.job_env` under the broker's part,
GPUs included), in the pod's cgroup, and dies in the next reset or at a session boundary
(`proctree.kill_all` takes every process but the agent). It is spawned under the launch lock, so a reset in
progress either killed nothing of it yet or finishes before it starts; and only on a pod that holds a
session (409 otherwise, or when the pod now serves another session than the one named). The reaper, not
`subprocess`, waits for it: its exit reaches `on_exit`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from firepool_agent import limits, overlimit
from firepool_agent.attempts import Attempts
from firepool_agent.reaping import ExitCallback
from firepool_agent.wire import HttpError

HANGUP_GRACE_S = 2.0
LOCK_POLL_S = 0.005
"""How often a process waiting for the launch lock looks whether a launch of its session holds it."""
MAX_ENV_JSON = 64 << 10


def spawn(attempts: Attempts, session: str | None, broker_env: Mapping[str, str], label: str,
          start: Callable[[dict[str, str]], subprocess.Popen[bytes]], on_exit: ExitCallback) -> int:
    """Start a process of the session with `start(env)` (it raises HttpError when it cannot); its pid."""
    with _beside_launch(attempts, session):
        with attempts.cond:
            current = attempts.session
        if current is None:
            raise HttpError(409, "this sandbox holds no session: run a job of the session first")
        if session is not None and session != current:
            raise HttpError(409, "this sandbox now serves another session")
        env = attempts.job_env(broker_env, label)
        with attempts.reaper.lock:
            popen = start(env)
            popen.returncode = 0  # the reaper waits for it; Popen must never wait on it too
            attempts.reaper.watch(popen.pid, on_exit)
    overlimit.expose(popen.pid)
    return popen.pid


@contextmanager
def _beside_launch(attempts: Attempts, session: str | None) -> Iterator[None]:
    """The launch lock, so no reset or boundary runs while a process starts; or, while the launch of this very
    session holds it in its spawn (a kernel binding its pre-started process, which waits for that process's
    imports), nothing: that launch crossed the boundary already and no reset starts before it ends."""
    while not attempts.launch_lock.acquire(timeout=LOCK_POLL_S):
        if session is not None and attempts.launching == session:
            yield
            return
    try:
        yield
    finally:
        attempts.launch_lock.release()


def exit_code(status: int | None) -> int:
    """The code as a shell reports it: 128+N when signal N ended the process (-1 before it ended)."""
    if status is None:
        return -1
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def kill_group(pid: int, sig: int) -> bool:
    """Signal `pid`'s process group; False when it is gone (or not ours)."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def hang_up(pid: int, exited: threading.Event) -> None:
    """The process's only reader went away: SIGHUP to its group, SIGKILL after a grace if it lives on."""
    kill_group(pid, signal.SIGHUP)

    def kill_if_alive() -> None:
        if not exited.is_set():
            kill_group(pid, signal.SIGKILL)

    timer = threading.Timer(HANGUP_GRACE_S, kill_if_alive)
    timer.daemon = True
    timer.start()


def parse_env(raw: str | None) -> dict[str, str]:
    """The broker's part of the process's environment (the pool's, the session's names), a JSON object."""
    if raw is None:
        return {}
    if len(raw) > MAX_ENV_JSON:
        raise HttpError(400, f"env must be at most {MAX_ENV_JSON} bytes of JSON")
    try:
        env = json.loads(raw)
    except ValueError:
        raise HttpError(400, "env must be a JSON object of strings") from None
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise HttpError(400, "env must be a JSON object of strings")
    try:
        limits.check_env(env, names=limits.ANY_ENV_NAME)
    except limits.LimitError as exc:
        raise HttpError(400, exc.message) from None
    return env


class ExitWatch:
    """What a relay keeps of its spawned process's exit: the status, and a pipe through which the reaper's thread
    wakes the relay's selector when the process exits."""

    def __init__(self) -> None:
        self.pid = 0
        self.status: int | None = None
        self._exited = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)

    def _on_exit(self, status: int, reaped_at: float) -> None:
        self.status = status
        self._exited.set()
        with self._lock:
            if not self._closed:  # a closed fd's number may already name another file
                os.write(self._wake_w, b"x")

    def _close_fds(self, *fds: int) -> None:
        """Close `fds` and the wake pipe, under the lock the reaper writes to it under."""
        with self._lock:
            self._closed = True
            for fd in (*fds, self._wake_r, self._wake_w):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass

    def _hang_up(self) -> None:
        hang_up(self.pid, self._exited)
