"""The host side of local pods' processes: spawning with the secret pipe, liveness, and tear-down.

A pod is named by pids plus their start times (from /proc), so a recycled pid is never mistaken
for a pod after a broker restart. Only processes this instance spawned are its children to reap;
the others are watched through /proc until they are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.backends.sandboxing import INFO_FD, SECRET_FD
from firepool_agent import proctree

log = logging.getLogger(__name__)

LEDGER_FD = 5
"""The agent's record of started attempts (`firepool_agent.ledger`): a host file no sandbox can open."""
DEFAULT_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGTERM, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGXFSZ, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD)
"""Reset to their default action in a pod, whatever the broker ignores: a broker started in the background by a
script ignores SIGINT and SIGQUIT (POSIX), and every process of its pods would inherit that, a kernel's
interrupt or a terminal's Ctrl-C then reaching nothing."""


class PodProcesses:
    def __init__(self) -> None:
        self._children: set[int] = set()

    def spawn(self, argv: list[str], env: Mapping[str, str], secret: str, log_path: Path, *,
              with_info: bool, ledger: Path | None = None) -> tuple[int, int | None]:
        """Start `argv` in its own session with the secret on fd 3 (bwrap's info pipe on fd 4, the
        attempt ledger opened for appending on fd 5).

        Returns the pid and the read end of the info pipe. The pipes stay close-on-exec here and are
        dup2'ed onto their numbers in the child only, so no other child of the broker inherits them.
        """
        secret_r, secret_w = os.pipe()
        os.write(secret_w, secret.encode())
        os.close(secret_w)
        info_r, info_w = os.pipe() if with_info else (None, None)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        ledger_fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600) if ledger else None
        moved: list[int] = []
        try:
            actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                       (os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2),
                       (os.POSIX_SPAWN_DUP2, _away(secret_r, moved), SECRET_FD)]
            if info_w is not None:
                actions.append((os.POSIX_SPAWN_DUP2, _away(info_w, moved), INFO_FD))
            if ledger_fd is not None:
                actions.append((os.POSIX_SPAWN_DUP2, _away(ledger_fd, moved), LEDGER_FD))
            pid = os.posix_spawn(argv[0], argv, dict(env), file_actions=actions, setsid=True,
                                 setsigdef=DEFAULT_SIGNALS, setsigmask=())
            self._children.add(pid)
            return pid, info_r
        except BaseException:
            if info_r is not None:
                os.close(info_r)
            raise
        finally:
            for fd in (secret_r, info_w, log_fd, ledger_fd, *moved):
                if fd is not None:
                    os.close(fd)

    def exited(self, pid: int) -> bool:
        """True when a child of ours has exited (and reap it); other pids are judged through /proc."""
        if pid in self._children:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                self._children.discard(pid)
                return True
            return False
        return proctree.read_proc(pid) is None

    async def sandbox_pid(self, info_fd: int, launcher: int, timeout_s: float) -> int | None:
        """bwrap's report of the sandbox's PID 1 as the host sees it; None if bwrap never sent it."""
        os.set_blocking(info_fd, False)
        data = b""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    chunk: bytes | None = os.read(info_fd, 4096)
                except BlockingIOError:
                    chunk = None
                if chunk:
                    data += chunk
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        return int(json.loads(data)["child-pid"])
                elif chunk == b"" or self.exited(launcher) or time.monotonic() > deadline:
                    return None
                await asyncio.sleep(0.001)
        finally:
            os.close(info_fd)

    async def kill(self, record: Mapping[str, Any], timeout_s: float) -> bool:
        """SIGKILL every process of a pod and wait until they are gone; False if some outlived `timeout_s`."""
        agent = same_process(record.get("pid"), record.get("pid_start"))
        launcher = same_process(record.get("launcher_pid"), record.get("launcher_start"))
        if agent is None and launcher is not None and record.get("mode") == "bwrap":
            # The broker died (or stopped the start) before it learnt the sandbox's pid: it is the launcher's
            # child. Frozen first: a launcher that forks the sandbox between the walk and its own SIGKILL would
            # leave that child behind for good (a broker stopped while a pod starts).
            _signal(launcher, signal.SIGSTOP)
            for proc in proctree.descendants(launcher):
                _signal(proc.pid, signal.SIGKILL)
        if record.get("mode") == "none" and agent is not None:
            # Unisolated, the agent's jobs would outlive it: freeze it, kill its tree, then it.
            _signal(agent, signal.SIGSTOP)
            for _ in range(100):
                tree = [p for p in proctree.descendants(agent) if p.alive]
                if not tree:
                    break
                for proc in tree:
                    _signal(proc.pid, signal.SIGKILL)
        # SIGKILL to a PID namespace's init takes every process in the namespace with it.
        for pid in (agent, launcher):
            if pid is not None:
                _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        for pid, start in ((agent, record.get("pid_start")), (launcher, record.get("launcher_start"))):
            while pid is not None and not self.exited(pid) and not _finished(pid, start):
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(0.005)
        return True


def _away(fd: int, moved: list[int]) -> int:
    """`fd`, or a duplicate of it when it already sits on a number the child's fds are dup2'ed to."""
    while fd in (SECRET_FD, INFO_FD, LEDGER_FD):
        fd = os.dup(fd)
        moved.append(fd)
    return fd


def starttime(pid: int | None) -> int | None:
    proc = proctree.read_proc(pid) if pid else None
    return proc.starttime if proc is not None else None


def same_process(pid: int | None, start: int | None) -> int | None:
    """`pid` when it still names the process that had it at `start` and has not exited; else None."""
    if not pid:
        return None
    proc = proctree.read_proc(pid)
    if proc is None or not proc.alive or (start is not None and proc.starttime != start):
        return None
    return pid


def _finished(pid: int, start: int | None) -> bool:
    """True once every thread of the process `pid` (started at `start`) has exited.

    A killed multi-threaded process shows its leader as a zombie while other threads are still
    exiting, and when it is a PID namespace's init, the last of them is still killing and reaping
    the namespace. Only when the leader is the one thread left has that finished.
    """
    proc = proctree.read_proc(pid)
    if proc is None or (start is not None and proc.starttime != start):
        return True
    if proc.alive:
        return False
    try:
        return os.listdir(f"/proc/{pid}/task") == [str(pid)]
    except OSError:
        return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def remove_tree(root: Path) -> None:
    """Remove a pod directory even when a job left read-only or unreadable directories in it."""

    def unlock(_function: Any, path: str, _exc_info: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
        if os.path.isdir(path) and not os.path.islink(path):
            with contextlib.suppress(OSError):
                os.chmod(path, stat.S_IRWXU)
            shutil.rmtree(path, onerror=unlock)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    try:
        shutil.rmtree(root, onerror=unlock)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.error("could not remove %s: %s", root, exc)
