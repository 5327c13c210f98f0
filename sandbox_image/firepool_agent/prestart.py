"""Pre-started kernels: an idle pod of a kernel pool keeps one kernel process imported but not yet bound.

The process (`kernel_bind`) is spawned only while no attempt runs: at boot (mode `prestart`) and after a
verified clean reset (modes `prestart`, and `learned` when the pod's last attempt was a kernel). It is
the agent's child in its own session like any rank 0, with the GPUs hidden, cwd in a private directory,
no port and no key. A kernel launch binds it (`bind`): the job's env, cwd, umask, limits and output
pipes go over its control socket; keys are made after that, by the kernel launcher. Any other launch,
a session boundary and every reset kill it; a dead, slow or refusing process means a normal launch.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from firepool_agent import kernel
from firepool_agent.config import AgentConfig
from firepool_agent.reaping import Reaper

log = logging.getLogger(__name__)

MODES = ("cold", "learned", "prestart")
"""cold: never; learned: after a kernel attempt; prestart: always (at boot and after every reset)."""
BIND_WAIT_S = 10.0
"""How long a bind waits for the process to finish its imports and answer; then a normal launch."""
LAUNCHER = ("-m", "firepool_agent.kernel")
RLIMITS = tuple(n for n in dir(resource) if n.startswith("RLIMIT_") and n != "RLIMIT_INFINITY")
ExitCallback = Callable[[int, float], None]


class Prestarted:
    """One spawned, not yet bound kernel process and its end of the control socket."""

    def __init__(self, popen: subprocess.Popen[bytes], sock: socket.socket, python: str) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.sock = sock
        self.python = python
        self.spawned_at = time.monotonic()
        self.ready_at: float | None = None
        self.rss_kib = 0
        self.buffer = b""
        self.io = threading.Lock()
        """One reader of the control socket at a time (a bind, or /v1/health asking whether it is ready)."""
        self.lock = threading.Lock()
        """Guards `exit` and `on_exit` between the reaper thread and a bind."""
        self.exit: tuple[int, float] | None = None
        self.on_exit: ExitCallback | None = None

    def exited(self, status: int, reaped_at: float) -> None:
        """The reaper's callback: before a bind the exit is kept, after it the attempt gets it."""
        with self.lock:
            target = self.on_exit
            if target is None:
                self.exit = (status, reaped_at)
                self.popen.returncode = os.waitstatus_to_exitcode(status)  # Popen must never wait on it
        if target is not None:
            target(status, reaped_at)

    def messages(self, deadline: float | None) -> list[dict[str, Any]]:
        """Lines that arrived; with a deadline, wait for at least one (OSError/TimeoutError past it)."""
        if not self.io.acquire(blocking=deadline is not None):
            return []
        try:
            return self._messages(deadline)
        finally:
            self.io.release()

    def _messages(self, deadline: float | None) -> list[dict[str, Any]]:
        while b"\n" not in self.buffer:
            if deadline is None:
                self.sock.setblocking(False)
            else:
                self.sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 16)
            except BlockingIOError:
                return []
            if not chunk:
                raise ConnectionError("the pre-started kernel closed its control socket")
            self.buffer += chunk
        lines, _, self.buffer = self.buffer.rpartition(b"\n")
        found = [json.loads(line) for line in lines.split(b"\n") if line.strip()]
        for message in found:
            if message.get("ready"):
                self.ready_at = time.monotonic()
                self.rss_kib = int(message.get("rss_kib", 0))
        return found


class Prestarter:
    """The pod's pre-started kernel, if any. Callers hold the attempts' launch lock."""

    def __init__(self, config: AgentConfig, reaper: Reaper, base_env: Callable[[], dict[str, str]]) -> None:
        self.config = config
        self.reaper = reaper
        self.base_env = base_env
        self.current: Prestarted | None = None
        self.last_was_kernel = False
        self.spawned = 0

    @property
    def mode(self) -> str:
        return str(self.config.kernels)

    def wanted(self) -> bool:
        return self.mode == "prestart" or (self.mode == "learned" and self.last_was_kernel)

    def python(self) -> str | None:
        return shutil.which("python3", path=self.config.job_path)

    def spawn(self) -> None:
        """Start a fresh process if this pod keeps one; call only while no attempt runs."""
        if not self.wanted() or self.current is not None:
            return
        python = self.python()
        if python is None:
            return
        # The user site lives in the workspace: a process started beside it would read the session's files.
        if os.path.exists(os.path.join(self.config.workspace, ".local")):
            log.info("no pre-started kernel: the workspace has a .local directory (a user site)")
            return
        home = os.path.join(self.config.run_dir, "prestart")
        os.makedirs(home, mode=0o700, exist_ok=True)
        env = self.base_env()
        env["CUDA_VISIBLE_DEVICES"] = ""  # belt and braces: nothing here loads CUDA, and no GPU is visible
        kernel.prepare_env(env)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.reaper.lock:
                popen = subprocess.Popen([python, *LAUNCHER, "--prestarted", str(child.fileno())],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, cwd=home,
                                         start_new_session=True, close_fds=True, pass_fds=(child.fileno(),))
                handle = Prestarted(popen, parent, python)
                self.reaper.watch(popen.pid, handle.exited)
        except (OSError, subprocess.SubprocessError) as exc:
            parent.close()
            log.warning("could not pre-start a kernel: %s", exc)
            return
        finally:
            child.close()
        self.current = handle
        self.spawned += 1

    def kill(self) -> None:
        """End the process (a non-kernel launch, a session boundary, a reset)."""
        handle, self.current = self.current, None
        if handle is None:
            return
        with handle.lock:
            if handle.exit is None:  # not reaped yet, so the pid is still ours
                try:
                    os.kill(handle.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        handle.sock.close()

    def bind(self, argv: Sequence[str], env: Mapping[str, str], cwd: str,
             fds: tuple[int, int]) -> Prestarted | str:
        """Hand the job to the process: the bound process, or why the launch must take the normal path."""
        handle, self.current = self.current, None
        if handle is None:
            return "no pre-started kernel on this pod"
        try:
            reason = self._bind(handle, argv, env, cwd, fds)
        except (OSError, ValueError) as exc:
            reason = f"the pre-started kernel did not answer: {exc!r}"
        if reason is None:
            handle.sock.close()
            return handle
        self.current = handle
        self.kill()
        return reason

    def _bind(self, handle: Prestarted, argv: Sequence[str], env: Mapping[str, str], cwd: str,
              fds: tuple[int, int]) -> str | None:
        if tuple(argv[1:3]) != LAUNCHER or "--prestarted" in argv:
            return "not the kernel launcher's command"
        if shutil.which(argv[0], path=env.get("PATH", "")) != handle.python:
            return f"{argv[0]} on the job's PATH is not {handle.python}"
        with handle.lock:
            if handle.exit is not None:
                return "the pre-started kernel had exited"
        limits = {name: list(resource.getrlimit(getattr(resource, name))) for name in RLIMITS}
        umask = os.umask(0)
        os.umask(umask)
        body = json.dumps({"argv": list(argv[3:]), "env": dict(env), "cwd": cwd, "umask": umask,
                           "rlimits": limits}).encode() + b"\n"
        deadline = time.monotonic() + BIND_WAIT_S
        handle.sock.settimeout(BIND_WAIT_S)
        try:
            sent = socket.send_fds(handle.sock, [body[:4096]], list(fds))
            handle.sock.sendall(body[sent:])
        except BrokenPipeError:
            pass  # it refused early and left: its answer is still in the socket
        while True:
            for message in handle.messages(deadline):
                if message.get("bound"):
                    return None
                if "refused" in message:
                    return f"the pre-started kernel refused: {message['refused']}"

    def state(self) -> dict[str, Any]:
        """For /v1/health: the mode and the current process, its readiness and memory."""
        handle = self.current
        info: dict[str, Any] = {"mode": self.mode, "spawned": self.spawned, "pid": None}
        if handle is None:
            return info
        try:
            handle.messages(None)
        except (OSError, ValueError):
            pass
        info.update(pid=handle.pid, ready=handle.ready_at is not None, age_s=time.monotonic() - handle.spawned_at,
                    **memory(handle.pid))
        return info


def memory(pid: int) -> dict[str, int]:
    """Resident and proportional set size (KiB): RSS counts shared library pages, PSS splits them."""
    found: dict[str, int] = {}
    for path, keys in ((f"/proc/{pid}/status", {b"VmRSS:": "rss_kib"}),
                       (f"/proc/{pid}/smaps_rollup", {b"Pss:": "pss_kib"})):
        try:
            with open(path, "rb") as f:
                for line in f:
                    key = line.split(b" ", 1)[0].split(b"\t", 1)[0]
                    if key in keys:
                        found[keys[key]] = int(line.split()[1])
        except OSError:
            pass
    return found
