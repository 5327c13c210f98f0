"""The agent's HTTP/1.1 API over a Unix socket or TCP: bearer auth, routing, one response per write.

    GET  /v1/health                       POST /v1/attempts?wait_s=      GET /v1/attempts/{id}?wait_s=
    GET  /v1/attempts/{id}/log?stream=&offset=&max_bytes=&wait_s=      POST /v1/reset
    GET  /v1/attempts/{id}/kernel?wait_s=  (a kernel attempt's connection info, keys included: broker only)
    POST /v1/kernels  {"keep": bool}      (the pool serves kernels: keep a pre-started one while idle)
    POST /v1/attempts/{id}/signal         POST /v1/attempts/{id}/cancel
    PUT  /v1/packages/{sha256}?max_extracted=   (a zip, unpacked into the package dir for the next launch)
    GET  /v1/tunnel?port=                 (Upgrade: firepool-tcp; a byte stream to a server of the sandbox)
    GET  /v1/terminal?rows=&cols=&command=&session=&env=   (Upgrade: firepool-pty; a shell on a PTY, `terminal`)
    GET  /v1/exec?argv=&env=&cwd=&session=&stdin=          (Upgrade: firepool-exec; a process on pipes, `execproc`)

A launch body may carry `reset_after` (the fields of `POST /v1/reset`): an attempt that ends within the
launch's wait, its logs inline, is reset before the answer, which carries the reset's outcome as `reset`.

A thread per connection; connections stay open between requests (the broker's launch path is
latency-bound). Every response goes out in one write, and TCP sockets set TCP_NODELAY, so no reply
waits on Nagle's algorithm.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import socketserver
import sys
import time
from functools import partial
from http.server import BaseHTTPRequestHandler
from typing import Any, BinaryIO, cast
from urllib.parse import parse_qs, unquote, urlsplit

from firepool_agent import (
    __version__,
    binding,
    execframes,
    execproc,
    httpreq,
    kernel_report,
    ptyframes,
    terminal,
    terms,
    tunnel,
    wire,
)
from firepool_agent.attempt import Attempt, Conflict
from firepool_agent.attempts import Attempts
from firepool_agent.config import AgentConfig
from firepool_agent.resetting import ResetOutcome, ResetSpec, Resetter

log = logging.getLogger(__name__)
MAX_BODY = 8 << 20
KEEP_LOCK_S = 2.0
"""How long `POST /v1/kernels` waits for a launch or reset in progress; after that the next reset acts on it."""


class Agent:
    """What the handlers act on: settings, the secret, the attempts and the resetter."""

    def __init__(self, config: AgentConfig, secret: bytes, attempts: Attempts,
                 broker_terms: terms.Terms | None = None) -> None:
        self.config = config
        self.secret = secret
        self.attempts = attempts
        self.terms = broker_terms or terms.Terms(config.state_dir)
        """The newest broker term and the last current broker's request (`terms`, `orphan`)."""
        self.resetter = Resetter(attempts)
        self.changes = 0
        """Changing requests served (all but resets): a reset is 'still clean' while none came after it."""
        self.clean_for: tuple[int, dict[str, Any] | str] | None = (0, "any")
        """(changes when it began, its spec) of the last clean reset; a new pod is clean for any reset."""
        attempts.prepare = partial(binding.prepare, attempts)
        self.started = time.monotonic()

    def health(self) -> dict[str, Any]:
        current = self.attempts.current
        return {
            "pod": self.config.pod, "isolated": self.config.isolated,
            "attempt": current.attempt_id if current is not None else None,
            "uptime_s": time.monotonic() - self.started, "incarnation": self.config.incarnation,
            "info": {"pid": os.getpid(), "python": sys.version.split()[0], "version": __version__,
                     "cuda_visible_devices": self.config.cuda_visible_devices,
                     "pid_namespace": os.getpid() == 1, "workspace": self.config.workspace,
                     "kernel_prestart": self.attempts.prestarter.state(),
                     "term": self.terms.newest, "stale_term_refused": self.terms.refused,
                     "clean_for": self.still_clean()},
        }

    def still_clean(self) -> dict[str, Any] | str | None:
        """The spec of the last reset when it was clean and nothing changed the pod since: a broker that takes
        over (docs/ha.md) need not reset such a pod again before it reuses it."""
        if self.clean_for is None or self.clean_for[0] != self.changes:
            return None
        return self.clean_for[1]

    def reset(self, spec: ResetSpec) -> ResetOutcome:
        began = self.changes
        outcome = self.resetter.reset(spec)
        clean = outcome.clean and self.changes == began
        self.clean_for = (began, {"wipe_workspace": spec.wipe_workspace, "wipe_paths": list(spec.wipe_paths),
                                  "keep_paths": list(spec.keep_paths)}) if clean else None
        return outcome

    def reset_after(self, spec: ResetSpec, attempt_id: str) -> ResetOutcome:
        """The reset a launch asked for as its attempt ended. It answers with the attempt's status: a reset that
        raises (a bug) reads as unclean, and the broker deletes the pod, rather than losing that answer and
        running the attempt again."""
        try:
            return self.reset(spec)
        except Exception as exc:
            log.exception("the reset after attempt %s failed", attempt_id)
            return ResetOutcome(clean=False, duration_s=0.0, killed=0, problems=[f"the reset failed: {exc!r}"],
                                incarnation=self.config.incarnation)

    def keep_kernels(self, keep: bool) -> dict[str, Any]:
        """The broker's word that the pod's pool serves kernels (or no longer does); acted on when idle."""
        prestarter = self.attempts.prestarter
        prestarter.told = keep  # a reset or boundary that runs now reads it when it ends
        if self.attempts.launch_lock.acquire(timeout=KEEP_LOCK_S):
            try:
                prestarter.keep(keep)
            finally:
                self.attempts.launch_lock.release()
        return prestarter.state()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "firepool-agent/" + __version__
    timeout = 300.0
    """Idle connections close after this; the broker's client drops its idle ones after 60 s, first."""
    agent: Agent  # set on the subclass made by `make_server`
    _term = 0
    """The term of the request being handled (`_check_term`)."""
    _changing = False
    """Whether the request being handled changes the pod: counted again as it ends (`Agent.changes`)."""
    raw_requestline: bytes  # set by http.server's handle_one_request

    def setup(self) -> None:
        super().setup()
        if self.request.family in (socket.AF_INET, socket.AF_INET6):
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def parse_request(self) -> bool:
        """http.server's, with the head read by `httpreq` (http.server's header parsing cost ~10 % of a job's agent CPU)."""
        self.command = None  # type: ignore[assignment]  # http.server's own "not parsed yet"
        self.request_version = "HTTP/1.1"  # an error about the head is answered with a status line
        self.close_connection = True
        self.requestline = self.raw_requestline.decode("latin-1").rstrip("\r\n")
        try:
            self.command, self.path, self.request_version = httpreq.request_line(self.raw_requestline)
            self.headers = cast(Any, httpreq.read_headers(cast(BinaryIO, self.rfile)))
        except wire.HttpError as exc:  # 400, 431 or 505
            self.send_error(exc.status, exc.message)
            return False
        connection = (self.headers.get("Connection") or "").lower()
        self.close_connection = connection == "close" or (self.request_version == "HTTP/1.0"
                                                          and connection != "keep-alive")
        if (self.headers.get("Expect") or "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would dominate the agent's log; errors are logged where they happen

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    # -- plumbing -------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        lines = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}",
                 f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if self.close_connection:
            lines.append("Connection: close")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload, separators=(",", ":")).encode())

    def _error(self, status: int, message: str, error_class: str | None = None, retryable: bool = False,
               details: dict[str, Any] | None = None) -> None:
        """The agent's error shape; a refusal the broker acts on also names its class (the broker's wire shape)."""
        error: dict[str, Any] = {"status": status, "message": message}
        if error_class is not None:
            error.update({"class": error_class, "retryable": retryable, "details": details or {}})
        self._json(status, {"error": error})

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise wire.HttpError(411, "chunked bodies are not supported; send Content-Length")
        try:
            size = int(length or 0)
        except ValueError:
            self.close_connection = True
            raise wire.HttpError(400, "bad Content-Length") from None
        if size > MAX_BODY:
            self.close_connection = True
            raise wire.HttpError(413, f"the body is larger than {MAX_BODY} bytes")
        return self.rfile.read(size) if size else b""

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        # compare_digest takes time independent of where the tokens differ.
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.agent.secret)

    def _handle(self, method: str) -> None:
        if not self._authorized():
            self.close_connection = True  # the body was not read; do not parse it as the next request
            self._error(401, "missing or wrong bearer secret")
            return
        try:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            self._changing = self._check_term(method, parts)
            query = parse_qs(url.query)
            body = self._body() if method == "POST" else b""
            try:
                self._route(method, parts, query, body)
            finally:
                if self._changing:  # counted as it ends too: one that waited out a reset still made the pod unclean
                    self.agent.changes += 1
        except wire.HttpError as exc:
            self._error(exc.status, exc.message)
        except terms.StaleTerm as exc:
            self.close_connection = True  # the body was not read
            self._error(409, str(exc), "StaleTerm", False, {"term": exc.newest})
        except Conflict as exc:
            self._error(409, str(exc), "Conflict", exc.retryable, exc.details)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            log.exception("request %s %s failed", method, self.path)
            self.close_connection = True
            self._error(500, f"agent error: {exc!r}")

    def _check_term(self, method: str, parts: list[str]) -> bool:
        """Learn a newer term; refuse a change sent under an older one (`terms`). Before any body is read."""
        try:
            sent = terms.parse(self.headers.get(terms.TERM_HEADER))
        except ValueError:
            self.close_connection = True
            raise wire.HttpError(400, f"{terms.TERM_HEADER} must be a non-negative integer") from None
        route = parts[1] if parts[:1] == ["v1"] and len(parts) > 1 else ""
        changing = terms.changes(method, route)
        self.agent.terms.check(sent, changing, f"{method} {'/'.join(parts)}")
        self._term = sent
        changing = changing and route not in ("reset", "kernels")  # a kept kernel is the pool's, not a job's
        if changing:
            self.agent.changes += 1
        return changing

    def _attempt(self, attempt_id: str) -> Attempt:
        attempt = self.agent.attempts.get(attempt_id)
        if attempt is None:
            raise wire.HttpError(404, f"this agent never ran attempt {attempt_id!r}")
        return attempt

    # -- routes ---------------------------------------------------------------------------------

    def _route(self, method: str, parts: list[str], query: dict[str, list[str]], body: bytes) -> None:
        attempts = self.agent.attempts
        if parts[:1] != ["v1"]:
            raise wire.HttpError(404, "no such endpoint")
        route = (method, *parts[1:2], len(parts))
        if route == ("GET", "health", 2):
            self._json(200, self.agent.health())
        elif route == ("POST", "attempts", 2):
            # `wait_s`: answer once the attempt ended or that long passed, so a short job's launch, wait
            # and logs cost the broker one round trip instead of two or more. Read before launching:
            # a bad query must not leave an attempt running that the broker was told failed.
            wait_s = wire.query_number(query, "wait_s", 0.0, wire.MAX_WAIT_S)
            inline = wire.query_number(query, "inline_logs", 0.0, float(wire.MAX_INLINE_LOGS))
            fence = partial(self.agent.terms.check, self._term, True, "POST v1/attempts")
            spec = wire.parse_launch(body)
            attempt = attempts.launch(spec, fence, waits=wait_s > 0)
            reset = spec.reset_after
            status = attempts.wait(attempt, wait_s, int(inline), keep=reset is not None) \
                if wait_s or inline else attempt.to_json()
            if reset is not None and "logs" in status:
                # Ended within the wait, its logs in the answer (and kept): reset now, sparing the broker the
                # reset request. The launch's change is counted before the reset, so a clean one leaves the pod
                # clean for a broker that takes over.
                self.agent.changes += 1
                self._changing = False
                status["reset"] = self.agent.reset_after(reset, attempt.attempt_id).to_json()
            self._json(201, status)
        elif route == ("GET", "attempts", 3):
            wait_s = wire.query_number(query, "wait_s", 0.0, wire.MAX_WAIT_S)
            inline = wire.query_number(query, "inline_logs", 0.0, float(wire.MAX_INLINE_LOGS))
            self._json(200, attempts.wait(self._attempt(parts[2]), wait_s, int(inline)))
        elif route == ("GET", "attempts", 4) and parts[3] == "log":
            self._log(self._attempt(parts[2]), query)
        elif route == ("GET", "attempts", 4) and parts[3] == "kernel":
            wait_s = wire.query_number(query, "wait_s", 0.0, wire.MAX_WAIT_S)
            self._json(200, kernel_report.wait(self._attempt(parts[2]), attempts.cond, wait_s))
        elif route == ("POST", "attempts", 4) and parts[3] == "signal":
            attempts.send_signal(self._attempt(parts[2]), wire.parse_signal(body))
            self._send(204)
        elif route == ("POST", "attempts", 4) and parts[3] == "cancel":
            attempts.cancel(self._attempt(parts[2]), wire.parse_cancel(body))
            self._send(202)
        elif route == ("PUT", "packages", 3):
            self._receive_package(parts[2], query)
        elif route == ("POST", "reset", 2):
            self._json(200, self.agent.reset(wire.parse_reset(body)).to_json())
        elif route == ("POST", "kernels", 2):
            self._json(200, self.agent.keep_kernels(wire.parse_kernels(body)))
        elif route == ("GET", "tunnel", 2):
            self._tunnel(wire.query_int(query, "port", 0, 1 << 20))
        elif route == ("GET", "terminal", 2):
            self._terminal(query)
        elif route == ("GET", "exec", 2):
            self._exec(query)
        else:
            raise wire.HttpError(404 if method in ("GET", "POST") else 405, "no such endpoint")

    def _upgrading(self, protocol: str) -> None:
        """Refuse a request that did not ask to switch to `protocol`; the connection is the stream after."""
        self.close_connection = True  # whatever happens, no HTTP request follows on this connection
        upgrade = self.headers.get("Upgrade", "").lower()
        if "upgrade" not in self.headers.get("Connection", "").lower() or upgrade != protocol:
            raise wire.HttpError(426, f"this endpoint needs Connection: Upgrade and Upgrade: {protocol}")

    def _tunnel(self, port: int) -> None:
        self._upgrading(tunnel.PROTOCOL)
        listen = self.agent.config.listen
        agent_port = int(listen.rpartition(":")[2]) if listen.startswith("tcp:") else None
        with tunnel.open_port(port, agent_port, self.agent.config.own_network) as target:
            tunnel.switch_protocols(self.wfile, tunnel.PROTOCOL)
            tunnel.splice(self.request, target)

    def _terminal(self, query: dict[str, list[str]]) -> None:
        self._upgrading(ptyframes.PROTOCOL)
        term = terminal.Terminal(self.agent.attempts, *terminal.parse_query(query))
        try:
            term.spawn()
        except BaseException:
            term.close()
            raise
        tunnel.switch_protocols(self.wfile, ptyframes.PROTOCOL)
        term.relay(self.request)

    def _exec(self, query: dict[str, list[str]]) -> None:
        self._upgrading(execframes.PROTOCOL)
        proc = execproc.ExecProcess(self.agent.attempts, execproc.parse_query(query))
        try:
            proc.spawn()
        except BaseException:
            proc.close()
            raise
        tunnel.switch_protocols(self.wfile, execframes.PROTOCOL)
        proc.relay(self.request)

    def _receive_package(self, digest: str, query: dict[str, list[str]]) -> None:
        """Stream the body straight to disk: packages are far larger than MAX_BODY."""
        if self.headers.get("Transfer-Encoding") or not (self.headers.get("Content-Length") or "").isdigit():
            self.close_connection = True
            raise wire.HttpError(411, "a package needs a Content-Length (no chunked bodies)")
        max_extracted = wire.query_int(query, "max_extracted", 2_000_000_000, 1 << 40)
        try:
            delivered = binding.receive_package(self.agent.attempts, digest, cast(BinaryIO, self.rfile),
                                                int(self.headers["Content-Length"]), max_extracted)
        except BaseException:
            self.close_connection = True  # the body may be partly unread
            raise
        self._json(200, {"digest": delivered.digest, "unpack_s": delivered.unpack_s,
                         "receive_s": delivered.receive_s, "extracted": delivered.extracted})

    def _log(self, attempt: Attempt, query: dict[str, list[str]]) -> None:
        stream = wire.query_stream(query)
        offset = wire.query_int(query, "offset", 0, 1 << 62)
        max_bytes = max(1, wire.query_int(query, "max_bytes", 1 << 20, wire.MAX_LOG_CHUNK))
        wait_s = wire.query_number(query, "wait_s", 0.0, wire.MAX_WAIT_S)
        try:
            data, next_offset, complete = self.agent.attempts.read_log(attempt, stream, offset, max_bytes, wait_s)
        except FileNotFoundError:
            raise wire.HttpError(410, f"the logs of {attempt.attempt_id!r} were wiped by a reset") from None
        self._send(200, data, "application/octet-stream",
                   {"X-Next-Offset": str(next_offset), "X-Complete": "1" if complete else "0"})


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False


class _TcpServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class _Tcp6Server(_TcpServer):
    address_family = socket.AF_INET6


def make_server(agent: Agent) -> socketserver.BaseServer:
    """Bind the listening socket named by `--listen` (a stale Unix socket file is replaced)."""
    handler = type("BoundHandler", (Handler,), {"agent": agent})
    listen = agent.config.listen
    if listen.startswith("unix:"):
        path = listen[len("unix:"):]
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        bind_path = path
        if len(path.encode()) > 100:
            # sun_path holds ~107 bytes; a long path is reached through an fd of its directory.
            dir_fd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            bind_path = f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}"
        old_umask = os.umask(0o177)  # the socket is ours alone (the broker is root or our uid)
        try:
            server: socketserver.BaseServer = _UnixServer(bind_path, handler)
        finally:
            os.umask(old_umask)
        return server
    host, _, port = listen[len("tcp:"):].rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    server_class = _Tcp6Server if ":" in host else _TcpServer
    return server_class((host, int(port)), handler)
