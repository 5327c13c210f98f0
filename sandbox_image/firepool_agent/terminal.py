"""An interactive terminal in the session's sandbox: a shell on a PTY, relayed over an upgraded connection.

`GET /v1/terminal?rows=&cols=&command=&session=&env=` with `Upgrade: firepool-pty` starts the user's shell
(bash when the job PATH has it, else sh; `command` runs `shell -c command` instead) on a new
pseudo-terminal, in the workspace, with the environment a job of the session gets: the agent's base
(`Attempts.job_env`, GPUs included) under the broker's part (`env`, JSON: the pool's variables and the
session's FIREPOOL_* names), plus TERM. Then frames flow
(`ptyframes`): keystrokes, resizes and signals in; output and, last, the exit code out.

The shell is a process of the sandbox like a job's: it lives in the pod's cgroup (its memory and pids
count against the pod's limits), is the OOM killer's choice over the agent, and dies in the next reset or
at a session boundary (`proctree.kill_all` takes every process but the agent). It is spawned under the
launch lock, so a reset in progress either killed nothing of it yet or finishes before it starts; and
only on a pod that holds a session (a reset that ended the session leaves none to open a terminal in).

One thread relays each terminal (the agent's thread per connection), so other requests never wait on it.
A client that goes away hangs the shell up (SIGHUP to its process group, SIGKILL two seconds later).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import termios
import time
from collections.abc import Mapping

from firepool_agent import ptyframes, sessionspawn
from firepool_agent.attempts import SIGNALS, Attempts
from firepool_agent.wire import HttpError

log = logging.getLogger(__name__)
CHUNK = 64 << 10
DRAIN_AFTER_EXIT_S = 0.2
"""Output still in the PTY when the shell exits is relayed for at most this long (a background process may
hold the terminal open forever)."""
MAX_COMMAND = 64 << 10
MAX_PENDING = 1 << 20
"""Keystrokes waiting for the shell to read them; past this the client is not read (back-pressure)."""



def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _controlling_tty() -> None:
    """In the child between fork and exec, after setsid: the PTY on stdin becomes its controlling terminal,
    so Ctrl-C and job control work as at a console."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def shell_argv(path: str, command: str | None) -> list[str]:
    shell = shutil.which("bash", path=path) or shutil.which("sh", path=path) or "/bin/sh"
    return [shell, "-c", command] if command is not None else [shell]


class Terminal(sessionspawn.ExitWatch):
    """One shell on one PTY; `relay` runs it against a connection until either ends."""

    def __init__(self, attempts: Attempts, rows: int, cols: int, command: str | None, session: str | None,
                 env: Mapping[str, str]) -> None:
        super().__init__()
        self.attempts = attempts
        self.env = env
        self.rows = rows
        self.cols = cols
        self.command = command
        self.session = session
        self.master = -1

    def spawn(self) -> None:
        """Start the shell (HttpError when this pod holds no session, or another one)."""
        master, slave = os.openpty()
        argv: list[str] = []

        def start(env: dict[str, str]) -> subprocess.Popen[bytes]:
            env.update({"TERM": "xterm-256color", "COLORTERM": "truecolor", "FIREPOOL_TERMINAL": "1"})
            argv[:] = shell_argv(env["PATH"], self.command)
            env["SHELL"] = argv[0]
            try:
                return subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                        cwd=self.attempts.config.workspace, start_new_session=True,
                                        close_fds=True, preexec_fn=_controlling_tty)
            except (OSError, subprocess.SubprocessError) as exc:
                raise HttpError(500, f"cannot start {argv[0]!r}: {exc}") from None

        try:
            _set_size(slave, self.rows, self.cols)
            self.pid = sessionspawn.spawn(self.attempts, self.session, self.env, "terminal", start, self._on_exit)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self.master = master
        log.info("terminal: shell %d started (%s)", self.pid, argv[0])

    @property
    def exit_code(self) -> int:
        return sessionspawn.exit_code(self.status)

    def _signal(self, payload: bytes) -> None:
        name = payload.decode("ascii", "replace").upper().removeprefix("SIG")
        sig = SIGNALS.get(name) or {"WINCH": signal.SIGWINCH, "CONT": signal.SIGCONT,
                                    "STOP": signal.SIGSTOP, "TSTP": signal.SIGTSTP}.get(name)
        if sig is None:
            return
        try:
            group = os.tcgetpgrp(self.master)
        except OSError:
            group = self.pid
        for target in dict.fromkeys((group, self.pid)):
            try:
                os.killpg(target, sig)
                return
            except (ProcessLookupError, PermissionError):
                continue

    def relay(self, conn: socket.socket) -> None:
        """Pump frames both ways until the shell has exited (EXIT sent) or the client has gone (hang up)."""
        conn.settimeout(None)
        decoder = ptyframes.Decoder()
        to_pty = bytearray()
        sel = selectors.DefaultSelector()
        sel.register(conn, selectors.EVENT_READ, "conn")
        sel.register(self.master, selectors.EVENT_READ, "pty")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        client_gone = False
        pty_open = True
        reading_client = True
        drain_until: float | None = None
        try:
            while True:
                if self._exited.is_set() and drain_until is None:
                    drain_until = time.monotonic() + DRAIN_AFTER_EXIT_S
                if drain_until is not None and (not pty_open or time.monotonic() >= drain_until):
                    break
                timeout = None if drain_until is None else max(0.0, drain_until - time.monotonic())
                for key, events in sel.select(timeout):
                    if key.data == "wake":
                        os.read(self._wake_r, 64)
                    elif key.data == "conn":
                        data = conn.recv(CHUNK)
                        if not data:
                            client_gone = True
                            return
                        for kind, payload in decoder.feed(data):
                            self._from_client(kind, payload, to_pty)
                    else:
                        if events & selectors.EVENT_WRITE and to_pty:
                            self._write_pty(to_pty)
                        if events & selectors.EVENT_READ and not self._read_pty(conn):
                            pty_open = False
                            sel.unregister(self.master)
                            to_pty.clear()
                if pty_open:  # write when there is input; read the client only while little is pending
                    wanted = selectors.EVENT_READ | (selectors.EVENT_WRITE if to_pty else 0)
                    if sel.get_key(self.master).events != wanted:
                        sel.modify(self.master, wanted, "pty")
                if reading_client != (len(to_pty) < MAX_PENDING):
                    reading_client = not reading_client
                    if reading_client:
                        sel.register(conn, selectors.EVENT_READ, "conn")
                    else:
                        sel.unregister(conn)
            conn.sendall(ptyframes.exit_code(self.exit_code))
        except (ptyframes.FrameError, OSError) as exc:
            client_gone = True
            log.info("terminal %d: the stream ended (%s)", self.pid, exc)
        finally:
            sel.close()
            self.close(hang_up=client_gone and not self._exited.is_set())

    def _from_client(self, kind: bytes, payload: bytes, to_pty: bytearray) -> None:
        if kind == ptyframes.DATA:
            to_pty += payload
            return
        try:
            if kind == ptyframes.RESIZE:
                _set_size(self.master, *ptyframes.parse_resize(payload))
            elif kind == ptyframes.SIGNAL:
                self._signal(payload)
        except OSError:
            pass  # the terminal is closing: its exit comes next

    def _write_pty(self, to_pty: bytearray) -> None:
        try:
            written = os.write(self.master, to_pty)
        except BlockingIOError:
            return
        except OSError:  # nothing reads the terminal any more: the input has nowhere to go
            written = len(to_pty)
        del to_pty[:written]

    def _read_pty(self, conn: socket.socket) -> bool:
        """Relay what the terminal printed; False once no process holds it open (EOF or EIO)."""
        try:
            out = os.read(self.master, CHUNK)
        except BlockingIOError:
            return True
        except OSError as exc:  # EIO: the last process holding the terminal has gone
            if exc.errno != errno.EIO:
                raise
            return False
        if out:
            conn.sendall(ptyframes.frame(ptyframes.DATA, out))
        return bool(out)

    def close(self, hang_up: bool = False) -> None:
        if hang_up:
            self._hang_up()
        self._close_fds(self.master)


def parse_query(query: Mapping[str, list[str]]) -> tuple[int, int, str | None, str | None, dict[str, str]]:
    """rows, cols, command, session and env from the request's query (HttpError 400 when malformed)."""
    def size(name: str, default: int) -> int:
        values = query.get(name)
        if not values:
            return default
        try:
            value = int(values[-1])
        except ValueError:
            raise HttpError(400, f"{name} must be an integer") from None
        if not 1 <= value <= ptyframes.MAX_SIZE:
            raise HttpError(400, f"{name} must be 1-{ptyframes.MAX_SIZE}")
        return value

    def last(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else None

    command = last("command")
    if command is not None and ("\0" in command or len(command.encode()) > MAX_COMMAND):
        raise HttpError(400, f"command must be at most {MAX_COMMAND} bytes without NUL")
    return size("rows", 24), size("cols", 80), command, last("session"), sessionspawn.parse_env(last("env"))
