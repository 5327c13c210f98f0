"""The exec stream's frames between the broker and the agent (standard library only: both import it).

After `GET /v1/exec` switched to `firepool-exec`, each side sends frames as the terminal's
(`ptyframes`: one kind byte, a 4-byte big-endian payload length, the payload; at most MAX_PAYLOAD).

agent -> broker:
    STARTED      b"p"  JSON {"pid": N}: first, once the process runs
    STDOUT       b"o"  bytes the process wrote to its stdout, as read
    STDERR       b"e"  bytes the process wrote to its stderr, as read
    EXIT         b"x"  JSON {"exit_code": N, "signal": S | null}: last; N as a shell reports it (128+S)
broker -> agent:
    STDIN        b"i"  bytes for the process's stdin (dropped when it was started without stdin)
    CLOSE_STDIN  b"c"  empty: the process reads end-of-file once what was sent is read
    SIGNAL       b"s"  ASCII name ("INT", "SIGKILL") or number ("9"): to the process's whole group
"""

from __future__ import annotations

import json
import signal
from typing import Any

from firepool_agent.ptyframes import HEADER, MAX_PAYLOAD, Decoder, FrameError, frame

__all__ = ["HEADER", "MAX_PAYLOAD", "FrameError", "frame", "decoder", "started", "exited", "parse_started",
           "parse_exit", "signal_number"]

PROTOCOL = "firepool-exec"
STARTED = b"p"
STDOUT = b"o"
STDERR = b"e"
EXIT = b"x"
STDIN = b"i"
CLOSE_STDIN = b"c"
SIGNAL = b"s"
KINDS = frozenset({STARTED, STDOUT, STDERR, EXIT, STDIN, CLOSE_STDIN, SIGNAL})


def decoder() -> Decoder:
    return Decoder(KINDS)


def started(pid: int) -> bytes:
    return frame(STARTED, json.dumps({"pid": pid}).encode())


def exited(exit_code: int, sig: int | None) -> bytes:
    return frame(EXIT, json.dumps({"exit_code": exit_code, "signal": sig}).encode())


def _object(payload: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(payload)
    except ValueError:
        raise FrameError(f"a {what} frame carries a JSON object") from None
    if not isinstance(value, dict):
        raise FrameError(f"a {what} frame carries a JSON object")
    return value


def parse_started(payload: bytes) -> int:
    pid = _object(payload, "started").get("pid")
    if type(pid) is not int or pid <= 0:
        raise FrameError("a started frame carries the process's pid")
    return pid


def parse_exit(payload: bytes) -> dict[str, Any]:
    value = _object(payload, "exit")
    code, sig = value.get("exit_code"), value.get("signal")
    if type(code) is not int or not (sig is None or type(sig) is int) or set(value) != {"exit_code", "signal"}:
        raise FrameError("an exit frame carries exit_code (a number) and signal (a number or null)")
    return {"exit_code": code, "signal": sig}


def signal_number(name: str | int) -> int | None:
    """A signal given as a number or a name ("KILL", "SIGKILL", "9"); None when it names no signal."""
    text = str(name).strip().upper()
    if text.isdigit():
        number = int(text)
        return number if number in signal.valid_signals() else None
    try:
        return int(signal.Signals["SIG" + text.removeprefix("SIG")])
    except KeyError:
        return None
