"""`firepool shell TAG`: the user's terminal attached to a shell in a session sandbox, like `kubectl exec -it`.

The terminal goes raw (every key, Ctrl-C included, goes to the remote shell) and is restored on the way out,
however that happens; SIGWINCH sends the new size; the command exits with the remote shell's exit code.
When the caller has no live session TAG, a short no-op job with that lease tag starts one first (in
`--pool`). `terminal_socket` is the websocket client the CLI, the tests and the bench share.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import shutil
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator
from types import FrameType
from typing import Any
from urllib.parse import quote, urlencode

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from broker.client import Client
from broker.errors import FirepoolError, NotFound, Unavailable, all_error_classes

MAX_MESSAGE = 16 << 20
EOF_REPEAT_S = 0.5
"""How often the end of piped input is said again (as Ctrl-D) until the terminal ends."""
"""The largest message the client takes from the broker (output frames are at most 64 KiB of bytes)."""


def terminal_url(base: str, tag: str, *, queue: str = "default", rows: int = 24, cols: int = 80,
                 command: str | None = None) -> str:
    params: dict[str, Any] = {"queue": queue, "rows": rows, "cols": cols}
    if command is not None:
        params["command"] = command
    scheme, _, rest = base.rstrip("/").partition("://")
    ws = {"http": "ws", "https": "wss"}.get(scheme, scheme)
    return f"{ws}://{rest}/v1/sessions/{quote(tag, safe='')}/terminal?{urlencode(params)}"


def terminal_socket(base: str, token: str, tag: str, **kw: Any) -> ClientConnection:
    """An open terminal websocket; the broker's typed refusal (NotFound, Unauthorized, ...) raised as such."""
    try:
        return connect(terminal_url(base, tag, **kw), additional_headers={"Authorization": f"Bearer {token}"},
                       max_size=MAX_MESSAGE, compression=None, open_timeout=30)
    except InvalidStatus as exc:
        raise refusal(exc.response.status_code, bytes(exc.response.body or b"")) from None
    except OSError as exc:  # refused, unreachable, timed out: the SDK's words for the same
        raise Unavailable(f"cannot reach the broker at {base} ({exc.strerror or exc or type(exc).__name__})",
                          {"url": base}) from None


def refusal(status: int, body: bytes) -> FirepoolError:
    """The broker's typed error from a refused handshake's status and JSON body."""
    try:
        error = json.loads(body)["error"]
        err = all_error_classes().get(error["class"], FirepoolError)(error["message"], error.get("details") or {})
    except (ValueError, KeyError, TypeError):
        err = FirepoolError(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
    err.status = status
    return err


def _size() -> tuple[int, int]:
    """The local terminal's rows and columns: the tty's own (COLUMNS and LINES go stale on a resize)."""
    for stream in (sys.stdout, sys.stdin):
        try:
            size = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError, AttributeError):
            continue
        if size.lines and size.columns:
            return size.lines, size.columns
    size = shutil.get_terminal_size((80, 24))
    return size.lines, size.columns


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """The terminal raw while inside (when it is one), restored as it was on the way out."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)  # keep typeahead: TCSAFLUSH would drop keys typed before attaching
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _pump_stdin(ws: ClientConnection, fd: int) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        try:
            if not data:  # end of piped input: Ctrl-D, which the remote terminal reads as end of input ...
                while not os.isatty(fd):  # ... again until it ends: one that reaches the PTY while a command
                    ws.send(json.dumps(["stdin", "\x04"]))  # runs is lost when the shell's line editor
                    time.sleep(EOF_REPEAT_S)  # takes the terminal back (raw mode drops the cooked EOF)
                return
            text = decoder.decode(data)
            if text:
                ws.send(json.dumps(["stdin", text]))
        except ConnectionClosed:
            return


def attach(ws: ClientConnection) -> int:
    """Relay this process's stdin/stdout to the terminal until the shell exits: its exit code."""
    out = sys.stdout.buffer
    fd = sys.stdin.fileno()

    def resized(signum: int, frame: FrameType | None) -> None:
        rows, cols = _size()
        with contextlib.suppress(ConnectionClosed):
            ws.send(json.dumps(["set_size", rows, cols]))

    old = signal.signal(signal.SIGWINCH, resized)
    try:
        with raw_mode(fd):
            threading.Thread(target=_pump_stdin, args=(ws, fd), name="stdin", daemon=True).start()
            try:
                for message in ws:
                    kind, *args = json.loads(message)
                    if kind == "stdout":
                        out.write(args[0].encode("utf-8", "replace"))
                        out.flush()
                    elif kind == "exit":
                        return int(args[0])
            except ConnectionClosed:
                pass
    finally:
        signal.signal(signal.SIGWINCH, old)
    reason = ws.close_reason or "the connection closed"
    print(f"\r\nfirepool: the terminal ended without an exit code ({reason})", file=sys.stderr)
    return 255


def shell(client: Client, tag: str, *, pool: str, queue: str = "default", command: str | None = None) -> int:
    rows, cols = _size()
    kw: dict[str, Any] = {"queue": queue, "rows": rows, "cols": cols, "command": command}
    if len(client.brokers.urls) > 1:
        client.whoami()  # a websocket does not move between brokers: find the leader first (client.url)
    try:
        ws = terminal_socket(client.url, client.found.token, tag, **kw)
    except NotFound:
        # No live session TAG of this caller: a no-op job with that lease tag starts one (and its sandbox).
        job = client.run(["true"], pool, lease_tag=tag, queue=queue)
        if job.state != "SUCCEEDED":
            print(f"firepool: starting session {tag!r} failed: job {job.id} {job.state}", file=sys.stderr)
            return 1
        ws = terminal_socket(client.url, client.found.token, tag, **kw)
    with ws:
        return attach(ws)
