"""Processes beside the job: `GET /v1/exec` starts a command in the session's sandbox, relayed over pipes.

`GET /v1/exec?argv=<JSON list>&env=<JSON object>&cwd=&session=&stdin=0|1` with `Upgrade: firepool-exec`
starts `argv` (no shell) in the session's context (`sessionspawn`: the job environment under the broker's
`env`, the pod's cgroup, gone at the next reset or session end; 409 on a pod that holds no session or
another one), in its own process group, in the workspace or `cwd` (relative to the workspace, or
absolute). Then frames flow (`execframes`): `started` with the pid, stdout and stderr as they are read, and
`exit` last; stdin, close-stdin and signals (to the whole group) in. A process started with stdin=0
reads /dev/null.

Back-pressure, never unbounded buffers: the pipes are not read while MAX_OUTPUT bytes wait for the
client, and the client is not read while MAX_PENDING bytes of stdin wait for the process; signals and stdin
still flow while output waits. A client that
goes away before the exit hangs the process up (SIGHUP to its group, SIGKILL after a grace): its only
reader is gone. At most MAX_PROCESSES run at once per pod (429 past it).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import subprocess
import threading
import time
from collections.abc import Mapping

from firepool_agent import execframes, limits, ptyframes, sessionspawn
from firepool_agent.attempts import Attempts
from firepool_agent.wire import HttpError

log = logging.getLogger(__name__)
CHUNK = 64 << 10
MAX_PENDING = 1 << 20
"""Stdin waiting for the process to read it; past this the client is not read (back-pressure)."""
MAX_OUTPUT = 1 << 20
"""Output framed but not yet sent to the client; past this the pipes are not read (back-pressure)."""
DRAIN_QUIET_S = 0.2
MAX_DRAIN_S = 5.0
"""After the exit, the pipes are read to their end, but only while they keep giving output at least every
DRAIN_QUIET_S, and for at most MAX_DRAIN_S (a background child may hold them open forever)."""
MAX_PROCESSES = 64
MAX_QUERY = 1 << 20
QUERY = frozenset({"argv", "env", "cwd", "session", "stdin"})
_slots = threading.BoundedSemaphore(MAX_PROCESSES)


class ExecRequest:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None, session: str | None,
                 stdin: bool) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.session = session
        self.stdin = stdin


def parse_query(query: Mapping[str, list[str]]) -> ExecRequest:
    """The request from the query (HttpError 400 when malformed or holding an unknown field)."""
    unknown = sorted(set(query) - QUERY)
    if unknown:
        raise HttpError(400, f"unknown field {unknown[0]!r}")

    def last(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else None

    raw = last("argv")
    if raw is None or len(raw) > MAX_QUERY:
        raise HttpError(400, f"argv, a JSON list of strings of at most {MAX_QUERY} bytes, is required")
    try:
        argv = json.loads(raw)
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise HttpError(400, "argv must be a non-empty JSON list of strings")
    try:
        limits.check_argv(argv, "argv")
    except limits.LimitError as exc:
        raise HttpError(400, exc.message) from None
    cwd = last("cwd")
    if cwd is not None and (not cwd or "\0" in cwd):
        raise HttpError(400, "cwd must be a non-empty path without NUL")
    stdin = last("stdin") or "0"
    if stdin not in ("0", "1"):
        raise HttpError(400, "stdin must be 0 or 1")
    return ExecRequest(argv, sessionspawn.parse_env(last("env")), cwd, last("session"), stdin == "1")


class ExecProcess(sessionspawn.ExitWatch):
    """One command with pipes; `relay` runs it against a connection until it has exited or the client went."""

    def __init__(self, attempts: Attempts, request: ExecRequest) -> None:
        super().__init__()
        self.attempts = attempts
        self.request = request
        self.stdin_w = -1
        self.out_r = -1
        self.err_r = -1
        self._slot = False
        self._closing_stdin = False

    def spawn(self) -> None:
        """Start the process (HttpError: no session or another one 409, too many 429, cannot start 400/500)."""
        if not _slots.acquire(blocking=False):
            raise HttpError(429, f"this sandbox runs {MAX_PROCESSES} exec'd processes already")
        self._slot = True
        workspace = self.attempts.config.workspace
        cwd = os.path.join(workspace, self.request.cwd) if self.request.cwd else workspace
        if not os.path.isdir(cwd):
            raise HttpError(400, f"cwd {self.request.cwd!r} is not a directory of the sandbox")
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if self.request.stdin else (-1, -1)
        argv = self.request.argv

        def start(env: dict[str, str]) -> subprocess.Popen[bytes]:
            env["FIREPOOL_EXEC"] = "1"
            try:
                return subprocess.Popen(argv, stdin=in_r if in_r >= 0 else subprocess.DEVNULL, stdout=out_w,
                                        stderr=err_w, env=env, cwd=cwd, start_new_session=True, close_fds=True)
            except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
                raise HttpError(400, f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
            except (OSError, subprocess.SubprocessError) as exc:
                raise HttpError(500, f"cannot start {argv[0]!r}: {exc}") from None

        try:
            self.pid = sessionspawn.spawn(self.attempts, self.request.session, self.request.env, "exec", start,
                                          self._on_exit)
        except BaseException:
            for fd in (out_r, err_r, in_w):
                _close(fd)
            raise
        finally:
            for fd in (out_w, err_w, in_r):
                _close(fd)
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.set_blocking(fd, False)
        self.out_r, self.err_r, self.stdin_w = out_r, err_r, in_w
        log.info("exec: process %d started (%s)", self.pid, argv[0])

    def relay(self, conn: socket.socket) -> None:
        """Pump frames both ways until the process has exited (EXIT sent) or the client has gone (hang up).

        Neither direction waits on the other: stdin and signals are read while output waits for a slow client,
        and each side's buffer is bounded (the pipes are not read past MAX_OUTPUT unsent, the client not past
        MAX_PENDING unwritten stdin), so a flood stalls the process, never the agent's memory."""
        conn.setblocking(False)
        decoder = execframes.decoder()
        pending, out = bytearray(), bytearray(execframes.started(self.pid))
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        pipes = {self.out_r: execframes.STDOUT, self.err_r: execframes.STDERR}
        client_gone = False
        quiet_until: float | None = None
        drain_until = 0.0
        try:
            while True:
                now = time.monotonic()
                if self._exited.is_set() and quiet_until is None:
                    quiet_until, drain_until = now + DRAIN_QUIET_S, now + MAX_DRAIN_S
                if quiet_until is not None and (not pipes or now >= min(quiet_until, drain_until)):
                    break
                _want(sel, conn.fileno(), (selectors.EVENT_READ if len(pending) < MAX_PENDING else 0)
                      | (selectors.EVENT_WRITE if out else 0), "conn")
                for fd in pipes:
                    _want(sel, fd, selectors.EVENT_READ if len(out) < MAX_OUTPUT else 0, "out")
                if self.stdin_w >= 0:
                    _want(sel, self.stdin_w, selectors.EVENT_WRITE if pending else 0, "stdin")
                timeout = None if quiet_until is None else max(0.0, min(quiet_until, drain_until) - now)
                for key, events in sel.select(timeout):
                    if key.data == "wake":
                        os.read(self._wake_r, 64)
                    elif key.data == "conn":
                        if not self._converse(conn, events, decoder, pending, out):
                            client_gone = True
                            return
                    elif key.data == "stdin":
                        self._write_stdin(pending)
                    elif self._read_pipe(key.fd, pipes, sel, out) and quiet_until is not None:
                        quiet_until = time.monotonic() + DRAIN_QUIET_S
                if self.stdin_w >= 0 and not pending and self._closing_stdin:
                    _want(sel, self.stdin_w, 0, "stdin")
                    _close(self.stdin_w)
                    self.stdin_w = -1
            conn.setblocking(True)
            code = sessionspawn.exit_code(self.status)
            sig = -os.waitstatus_to_exitcode(self.status) if self.status is not None and os.WIFSIGNALED(
                self.status) else None
            conn.sendall(bytes(out) + execframes.exited(code, sig))
        except (execframes.FrameError, OSError) as exc:
            client_gone = True
            log.info("exec %d: the stream ended (%s)", self.pid, exc)
        finally:
            sel.close()
            self.close(hang_up=client_gone and not self._exited.is_set())

    def _converse(self, conn: socket.socket, events: int, decoder: ptyframes.Decoder, pending: bytearray,
                  out: bytearray) -> bool:
        """Send queued output, take the client's frames; False once the client has closed its end."""
        try:
            if events & selectors.EVENT_WRITE:
                del out[:conn.send(out)]
            if events & selectors.EVENT_READ:
                data = conn.recv(CHUNK)
                if not data:
                    return False
                for kind, payload in decoder.feed(data):
                    self._from_client(kind, payload, pending)
        except BlockingIOError:
            pass
        return True

    def _from_client(self, kind: bytes, payload: bytes, pending: bytearray) -> None:
        if kind == execframes.STDIN:
            if self.stdin_w >= 0 and not self._closing_stdin:
                pending += payload
        elif kind == execframes.CLOSE_STDIN:
            self._closing_stdin = True
        elif kind == execframes.SIGNAL:
            sig = execframes.signal_number(payload.decode("ascii", "replace"))
            if sig is not None:
                sessionspawn.kill_group(self.pid, sig)
        else:
            raise execframes.FrameError(f"a client does not send {kind!r} frames")

    def _write_stdin(self, pending: bytearray) -> None:
        try:
            written = os.write(self.stdin_w, pending)
        except BlockingIOError:
            return
        except OSError:  # the process closed its stdin: what waits has nowhere to go
            written = len(pending)
            self._closing_stdin = True
        del pending[:written]

    def _read_pipe(self, fd: int, pipes: dict[int, bytes], sel: selectors.BaseSelector, out: bytearray) -> bool:
        """Queue what the process wrote as a frame; False when nothing was read (at EOF the pipe is dropped)."""
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return False
        if data:
            out += execframes.frame(pipes[fd], data)
            return True
        _want(sel, fd, 0, "out")
        del pipes[fd]
        return False

    def close(self, hang_up: bool = False) -> None:
        if hang_up:
            self._hang_up()
        if self._slot:
            self._slot = False
            _slots.release()
        self._close_fds(self.out_r, self.err_r, self.stdin_w)
        self.out_r = self.err_r = self.stdin_w = -1


def _want(sel: selectors.BaseSelector, fd: int, events: int, data: str) -> None:
    """Watch `fd` for `events` (none: not at all)."""
    try:
        key = sel.get_key(fd)
    except KeyError:
        if events:
            sel.register(fd, events, data)
        return
    if not events:
        sel.unregister(fd)
    elif key.events != events:
        sel.modify(fd, events, data)


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
