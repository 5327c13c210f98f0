"""The terminal stream's frames between the broker and the agent (standard library only: both import it).

After `GET /v1/terminal` switched to `firepool-pty`, each side sends frames: one kind byte, a 4-byte
big-endian payload length, the payload.

    DATA    b"d"  bytes: the keyboard (broker -> agent) or the terminal's output (agent -> broker)
    RESIZE  b"z"  "!HH" rows, cols (broker -> agent)
    SIGNAL  b"s"  ASCII name, e.g. "INT" (broker -> agent): sent to the terminal's foreground process group
    EXIT    b"x"  "!i" the shell's exit code, 128+N when signal N ended it (agent -> broker, last frame)

A frame over MAX_PAYLOAD ends the stream: neither side buffers more than that per frame.
"""

from __future__ import annotations

import struct

PROTOCOL = "firepool-pty"
DATA = b"d"
RESIZE = b"z"
SIGNAL = b"s"
EXIT = b"x"
KINDS = frozenset({DATA, RESIZE, SIGNAL, EXIT})
HEADER = struct.Struct("!cI")
MAX_PAYLOAD = 1 << 20
MAX_SIZE = 4096
"""Rows and columns are 1..MAX_SIZE."""


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def resize(rows: int, cols: int) -> bytes:
    return frame(RESIZE, struct.pack("!HH", rows, cols))


def exit_code(code: int) -> bytes:
    return frame(EXIT, struct.pack("!i", code))


class Decoder:
    """Frames out of a byte stream fed in arbitrary pieces (`kinds`: those of the protocol spoken)."""

    def __init__(self, kinds: frozenset[bytes] = KINDS) -> None:
        self._buf = bytearray()
        self._kinds = kinds

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buf)
            if kind not in self._kinds:
                raise FrameError(f"unknown frame kind {kind!r}")
            if length > MAX_PAYLOAD:
                raise FrameError(f"a frame of {length} bytes is over the {MAX_PAYLOAD}-byte limit")
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append((kind, bytes(self._buf[HEADER.size:end])))
            del self._buf[:end]
        return frames


def parse_resize(payload: bytes) -> tuple[int, int]:
    if len(payload) != 4:
        raise FrameError("a resize frame carries rows and cols as two 16-bit numbers")
    rows, cols = struct.unpack("!HH", payload)
    return max(1, min(rows, MAX_SIZE)), max(1, min(cols, MAX_SIZE))


def parse_exit(payload: bytes) -> int:
    if len(payload) != 4:
        raise FrameError("an exit frame carries one 32-bit code")
    return int(struct.unpack("!i", payload)[0])
