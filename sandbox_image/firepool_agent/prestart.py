"""Pre-started kernels: an idle pod of a kernel pool keeps one kernel process imported but not yet bound.

Which pods keep one: mode `prestart` always; mode `learned` while the broker says the pod's pool serves
kernels (`POST /v1/kernels {"keep": true}`: the broker learns it per pool from kernel jobs, tells every
idle pod of the pool, never-used ones included, and says `false` after a quiet period); `cold` never.

The process (`kernel_bind`) is spawned only while the pod is clean: nothing has run since the agent
started or since the last verified clean reset (a launch makes the pod unclean until the next one). It
is the agent's child in its own session like any rank 0, with the GPUs hidden, cwd in a private
directory, no port and no key. A kernel launch binds it (`bind`): the job's env, cwd, umask, limits and
output pipes go over its control socket; keys are made after that, by the kernel launcher. Any other
launch and every reset kill it; a dead, slow or refusing process means a normal launch.

A session boundary keeps it (`crossing`). The boundary empties the workspace, TMPDIR and /dev/shm so a
new session sees nothing of the last one; the unbound process holds nothing of any session to begin
with. It was started on a clean pod, so no code of the old session has run since; it ran only our
imports, with cwd in its private directory and nothing of the workspace, package or deps directory on
its sys.path; it runs no user code until bound. What it could still have taken in is what its imports
read from the session's directories while it started (HOME is the workspace): an audit hook in the
process records every path its imports open or list under HOME, TMPDIR, the package or deps directory,
and the agent checks /proc for a mapped file, open descriptor or cwd there. Only with none of those,
and no other process alive, does it cross; otherwise it is killed as before and the new session's first
kernel starts cold. Pods never change callers, so the question is only ever the same caller's sessions.
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
from firepool_agent.kernel_bind import read_only
from firepool_agent.reaping import Reaper

log = logging.getLogger(__name__)

MODES = ("cold", "learned", "prestart")
"""cold: never; learned: while the broker says the pool serves kernels; prestart: always."""
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
        self.touched: list[str] = []
        """Paths under the session's directories that its imports opened or listed (its ready message)."""
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
                self.touched = [str(t) for t in message.get("touched", ())]
        return found


class Prestarter:
    """The pod's pre-started kernel, if any. Callers hold the attempts' launch lock."""

    def __init__(self, config: AgentConfig, reaper: Reaper, base_env: Callable[[], dict[str, str]]) -> None:
        self.config = config
        self.reaper = reaper
        self.base_env = base_env
        self.current: Prestarted | None = None
        self.told = False
        """The broker says this pod's pool serves kernels (mode `learned`)."""
        self.clean = True
        """Nothing has run since the agent started or since the last verified clean reset."""
        self.spawned = 0
        self.crossed = 0
        """Session boundaries the current process was kept across."""

    @property
    def mode(self) -> str:
        return str(self.config.kernels)

    def wanted(self) -> bool:
        return self.mode == "prestart" or (self.mode == "learned" and self.told)

    def keep(self, told: bool) -> None:
        """The broker's word on the pool: start one now if the pod is clean and idle, or end it."""
        self.told = told
        if not self.wanted():
            self.kill()
        elif self.clean:
            self.spawn()

    def session_dirs(self) -> list[str]:
        """Where a session's (or a job's) files live: what the process must not have taken anything from."""
        c = self.config
        dirs = [c.workspace, c.tmp_dir, c.package_dir, *([c.deps_dir] if c.deps_dir else [])]
        return dirs + ([c.shm_dir] if c.isolated else [])

    def python(self) -> str | None:
        return shutil.which("python3", path=self.config.job_path)

    def spawn(self) -> None:
        """Start a fresh process if this pod keeps one; call only while the pod is clean."""
        if not self.wanted() or self.current is not None or not self.clean:
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
                popen = subprocess.Popen([python, *LAUNCHER, "--prestarted", str(child.fileno()),
                                          "--watch", os.pathsep.join(self.session_dirs())],
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

    def crossing(self, dirs: Sequence[str]) -> str | None:
        """Why the current process may not be kept across a session boundary; None when it may."""
        handle = self.current
        if handle is None:
            return "no pre-started kernel"
        try:
            handle.messages(None)
        except (OSError, ValueError) as exc:
            return f"it does not answer: {exc!r}"
        with handle.lock:
            if handle.exit is not None:
                return "it had exited"
        if handle.ready_at is None:
            return "it was still importing"
        if handle.touched:
            return "its imports read " + ", ".join(handle.touched[:3])
        held = held_paths(handle.pid, dirs)
        if held:
            return "it holds " + ", ".join(held[:3])
        return None

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
             fds: tuple[int, int, int]) -> Prestarted | str:
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
              fds: tuple[int, int, int]) -> str | None:
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
        info: dict[str, Any] = {"mode": self.mode, "told": self.told, "wanted": self.wanted(),
                                "spawned": self.spawned, "crossed": self.crossed, "pid": None}
        if handle is None:
            return info
        try:
            handle.messages(None)
        except (OSError, ValueError):
            pass
        info.update(pid=handle.pid, ready=handle.ready_at is not None, age_s=time.monotonic() - handle.spawned_at,
                    **memory(handle.pid))
        return info


def under(path: str, dirs: Sequence[str]) -> bool:
    path = os.path.normpath(path)
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs if d)


def held_paths(pid: int, dirs: Sequence[str]) -> list[str]:
    """Files under `dirs` that the process maps, has open, or works in, as /proc shows them."""
    seen: list[str] = []
    ours = _fd_targets("/proc/self/fd")  # inherited from the agent (its log as stderr): never a session's
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            for line in f:
                fields = line.decode(errors="replace").split(maxsplit=5)
                if len(fields) == 6:
                    seen.append(fields[5].strip().removesuffix(" (deleted)"))
        seen += [t for t in _fd_targets(f"/proc/{pid}/fd") if t not in ours]
        seen.append(os.readlink(f"/proc/{pid}/cwd"))
    except OSError as exc:
        return [f"/proc/{pid} unreadable: {exc}"]
    return sorted({p for p in seen if p.startswith("/") and under(p, dirs) and not read_only(p)})


def _fd_targets(fd_dir: str) -> set[str]:
    found = set()
    for name in os.listdir(fd_dir):
        try:
            found.add(os.readlink(os.path.join(fd_dir, name)).removesuffix(" (deleted)"))
        except OSError:
            pass  # closed since the listing
    return found


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
