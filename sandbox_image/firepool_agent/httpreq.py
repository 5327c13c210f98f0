"""A request head read without `email.parser`: http.server's own parser took a fifth of the agent's Python time.

The broker sends a handful of plain headers per request. This reads the request line and the header block with
http.client's limits (a line of at most 64 KiB, at most 100 headers) into `Headers`, a case-insensitive map whose
`get` answers like `email.message.Message.get` (the first value of a repeated name). Obsolete line folding and
lines without a colon are refused: RFC 9112 lets a server answer them with 400. Errors never quote the head: its
target may carry an exec's environment and its headers the bearer secret, and a caller may log the answer.
"""

from __future__ import annotations

from typing import BinaryIO

from firepool_agent.wire import HttpError

MAX_LINE = 65536
MAX_HEADERS = 100
VERSIONS = ("HTTP/1.0", "HTTP/1.1")


class Headers:
    """Request headers by lower-cased name; the first value of a repeated name wins."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, str]) -> None:
        self._values = values

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name.lower(), default)

    def __getitem__(self, name: str) -> str | None:  # email.message.Message answers None for a missing name
        return self._values.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._values


def request_line(raw: bytes) -> tuple[str, str, str]:
    """(method, target, version) of an HTTP/1.x request line."""
    words = raw.decode("latin-1").rstrip("\r\n").split()
    if len(words) != 3:
        raise HttpError(400, f"a request line needs a method, a target and a version ({len(words)} words)")
    method, target, version = words
    if version not in VERSIONS:
        raise HttpError(505 if version.startswith("HTTP/") else 400, f"unsupported version {version[:20]!r}")
    return method, target, version


def read_headers(rfile: BinaryIO) -> Headers:
    """The header block up to its empty line."""
    values: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise HttpError(431, "a header line is longer than 64 KiB")
        if line in (b"\r\n", b"\n", b""):
            return Headers(values)
        if line[:1] in (b" ", b"\t"):
            raise HttpError(400, "folded header lines are not accepted")
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(400, "a header line without a name and a colon")
        values.setdefault(name.lower(), value.strip())
    raise HttpError(431, f"more than {MAX_HEADERS} headers")
