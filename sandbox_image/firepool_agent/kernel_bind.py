"""The pre-started kernel's side: import the kernel stack now, become a job's kernel when the agent binds it.

`python3 -m firepool_agent.kernel --prestarted FD` runs this before any claim. It imports ipykernel and
what its start would import (no port, no key, no IPython shell, no CUDA: the agent starts it with the
GPUs hidden), notes every environment variable those imports read and every path under the session's
directories they open or list (`--watch`: an audit hook, inert once bound), says `ready` on FD and blocks. The
agent's bind message carries the job's argv, env, cwd, umask and resource limits and, as SCM_RIGHTS, the
attempt's stdout and stderr pipes and the pipe for the kernel's connection line. The bind is refused, and the agent launches the job the normal way,
when the job would not have started the same: an environment variable the imports read differs, or the
job's path (cwd, PYTHONPATH, user site) holds its own copy of a module already imported.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

WARM_MODULES = ("ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.debugger",
                "jupyter_client.session", "IPython.core.completer", "sqlite3")
"""What `IPKernelApp.initialize` would import (debugpy through ipykernel.debugger is the largest part)."""
STARTUP_ENV = ("HOME", "LANG", "LANGUAGE", "TZ")
"""Read by the interpreter or the locale at start, before any import we could watch."""
STARTUP_PREFIXES = ("PYTHON", "LC_")
MAX_MESSAGE = 4 << 20
WATCHED_EVENTS = frozenset({"open", "os.listdir", "os.scandir", "glob.glob", "os.chdir"})
"""Audit events that name a path the process reads from (`open` also covers every import's source)."""
MAX_TOUCHED = 20
REPORT_FD_ENV = "FIREPOOL_KERNEL_REPORT_FD"
"""Names the write end of the agent's pipe for the kernel's connection line (`firepool_agent.kernel`)."""


class Refused(Exception):
    """The job cannot run in this process exactly as it would have started; the agent launches it anew."""


@contextmanager
def watching_env(seen: set[str]) -> Iterator[None]:
    """Record the names of the environment variables read through os.environ while the block runs."""
    cls = type(os.environ)
    getitem, contains = cls.__getitem__, cls.__contains__

    def get(self: Any, key: Any) -> Any:
        seen.add(key.decode() if isinstance(key, bytes) else str(key))
        return getitem(self, key)

    def has(self: Any, key: Any) -> bool:
        seen.add(key.decode() if isinstance(key, bytes) else str(key))
        return contains(self, key)

    cls.__getitem__, cls.__contains__ = get, has  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__getitem__, cls.__contains__ = getitem, contains  # type: ignore[method-assign]


def read_only(path: str) -> bool:
    """On a read-only mount (the Python install and the agent, bound read-only into the sandbox, may sit
    under a session directory's path, e.g. a checkout in /tmp): nothing a session wrote can be there."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class Touches:
    """An audit hook that notes paths under `dirs` the imports open or list, until `stop`.

    An audit hook cannot be removed; after `stop` it returns at its first test, for the kernel's life.
    """

    def __init__(self, dirs: list[str]) -> None:
        self.dirs = tuple(os.path.normpath(d) for d in dirs if d)
        self.found: list[str] = []
        self.watching = bool(self.dirs)
        if self.watching:
            sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.watching or event not in WATCHED_EVENTS or not args:
            return
        path = args[0]
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str) or len(self.found) >= MAX_TOUCHED:
            return  # an fd (os.fdopen, a socket file) names nothing on disk
        full = os.path.normpath(path if os.path.isabs(path) else os.path.join(os.getcwd(), path))
        if any(full == d or full.startswith(d + "/") for d in self.dirs) and not read_only(full):
            self.found.append(full)

    def stop(self) -> None:
        self.watching = False


class Warmed:
    """What the imports depended on and changed: the env they read, the env before, their own env writes."""

    def __init__(self) -> None:
        self.before = dict(os.environ)
        self.read: set[str] = set()
        with watching_env(self.read):
            for name in WARM_MODULES:
                importlib.import_module(name)
        after = dict(os.environ)
        # Some imports set variables (pydevd: PYDEVD_USE_FRAME_EVAL); in a normal start they would set them
        # over the job's env, so they are set again over it at bind.
        self.written = {k: v for k, v in after.items() if self.before.get(k) != v}
        self.removed = [k for k in self.before if k not in after]


def env_conflicts(before: Mapping[str, str], after: Mapping[str, str], read: set[str]) -> list[str]:
    """Variables the start read (or the interpreter reads at start) whose value the job changes."""
    names = set(read) | set(STARTUP_ENV)
    names |= {k for k in (*before, *after) if k.startswith(STARTUP_PREFIXES) and k != "PYTHONPATH"}
    return sorted(n for n in names if before.get(n) != after.get(n))


def job_sys_path(cwd: str, pythonpath: str, base: list[str], dropped: set[str]) -> tuple[list[str], list[str]]:
    """sys.path as a fresh `python -m` in `cwd` would have it, and the entries that are new to this process."""
    front = [cwd] + [os.path.abspath(os.path.join(cwd, p)) for p in pythonpath.split(os.pathsep) if p]
    user_site = _user_site()
    tail = [p for p in base if p not in dropped]
    if user_site is not None and os.path.isdir(user_site):
        system = [i for i, p in enumerate(tail) if p.endswith(("site-packages", "dist-packages"))]
        at = system[0] if system else len(tail)
        tail = [*tail[:at], user_site, *tail[at:]]
    path: list[str] = []
    for entry in (*front, *tail):
        if entry not in path:
            path.append(entry)
    return path, [p for p in path if p not in base]


def _user_site() -> str | None:
    import site

    if not site.ENABLE_USER_SITE:
        return None
    site.USER_BASE = None
    site.USER_SITE = None
    return site.getusersitepackages()


def shadowed(entries: list[str]) -> list[str]:
    """Top-level modules already imported here that one of `entries` (new path entries) also provides."""
    found = []
    names = sorted({n.partition(".")[0] for n in sys.modules if not n.startswith("_")})
    for entry in entries:
        if not os.path.isdir(entry):
            continue
        for name in names:
            if name in sys.builtin_module_names:
                continue
            spec = importlib.machinery.PathFinder.find_spec(name, [entry])
            # A namespace portion (a plain directory of that name) never wins over a real module.
            if spec is not None and spec.origin not in (None, "namespace"):
                found.append(f"{name} ({spec.origin or entry})")
    return found


def apply(message: Mapping[str, Any], fds: list[int], warmed: Warmed) -> list[str]:
    """Turn this process into the job's rank 0; returns the kernel's arguments. Refused: the process exits."""
    env = {str(k): str(v) for k, v in message["env"].items()}
    cwd = str(message["cwd"])
    conflicts = env_conflicts(warmed.before, env, warmed.read)
    if conflicts:
        raise Refused("the job's environment differs in " + ", ".join(conflicts[:8]))
    if len(fds) != 3:
        raise Refused(f"the bind carried {len(fds)} descriptors, not the job's stdout, stderr and report pipe")
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise Refused(f"cannot enter {cwd}: {exc}") from None
    before = os.environ.get("PYTHONPATH", "")
    dropped = {os.path.abspath(p) for p in before.split(os.pathsep) if p} | {sys.path[0]}
    base = list(sys.path)
    os.environ.clear()
    os.environ.update(env)  # putenv too: C libraries loaded later (CUDA) read the job's values
    os.environ.update(warmed.written)
    for name in warmed.removed:
        os.environ.pop(name, None)
    path, new = job_sys_path(cwd, env.get("PYTHONPATH", ""), base, dropped)
    clash = shadowed(new)
    if clash:
        raise Refused("the job's path has its own " + ", ".join(clash[:5]))
    sys.path[:] = path
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    tempfile.tempdir = None  # gettempdir() caches TMPDIR
    time.tzset()
    os.umask(int(message["umask"]))
    for name, (soft, hard) in dict(message.get("rlimits") or {}).items():
        limit = getattr(resource, name)
        if resource.getrlimit(limit) != (soft, hard):
            resource.setrlimit(limit, (soft, hard))
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds[:2]:
        os.close(fd)
    os.environ[REPORT_FD_ENV] = str(fds[2])  # this process's number for the pipe, whatever the agent's was
    _no_parent_death_signal()  # a launched job keeps running if an unisolated agent dies; so does this one
    argv = [str(a) for a in message["argv"]]
    sys.argv = [os.path.abspath(getattr(sys.modules["__main__"], "__file__", None) or sys.argv[0]), *argv]
    return argv


def _parent_death_signal(sig: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, ctypes.c_ulong(sig), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))  # PR_SET_PDEATHSIG


def _no_parent_death_signal() -> None:
    _parent_death_signal(0)


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One newline-terminated JSON message; the descriptors ride on its first bytes."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
    while not data.endswith(b"\n"):
        more = sock.recv(1 << 16)
        if not more or len(data) > MAX_MESSAGE:
            raise Refused("the bind message was cut off (or the agent is gone)")
        data += more
    return json.loads(data), list(fds)


def wait_for_bind(fd: int, watch: list[str] | None = None) -> list[str]:
    """Warm up, report ready, and return the job's kernel arguments once bound; exit when refused.

    `watch`: the session's directories; the ready message lists what the imports opened or listed there
    (the agent keeps the process across a session boundary only when that list is empty).
    """
    import signal

    _parent_death_signal(signal.SIGKILL)  # an idle pre-started kernel never outlives its agent
    sock = socket.socket(fileno=fd)
    touches = Touches(watch or [])
    warmed = Warmed()
    with open(f"/proc/{os.getpid()}/status", "rb") as f:
        rss = next((int(line.split()[1]) for line in f if line.startswith(b"VmRSS:")), 0)
    _answer(sock, {"ready": True, "rss_kib": rss, "touched": sorted(set(touches.found))})
    try:
        message, fds = receive(sock)
        touches.stop()  # from here on the job's own code runs: what it opens is its business
        argv = apply(message, fds, warmed)
    except Refused as exc:
        _answer(sock, {"refused": str(exc)})
        sys.exit(0)
    except Exception as exc:  # anything unforeseen: refuse rather than run a half-bound kernel
        _answer(sock, {"refused": f"bind failed: {exc!r}"})
        sys.exit(0)
    _answer(sock, {"bound": True})
    sock.close()
    return argv


def _answer(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the agent is gone (then so is this process) or gave up waiting
