"""What a job's argv, environment and names may hold: one set of limits for the broker's door and the agent.

The broker checks every submit against these (broker.claiming.admission), so anything it stores can be
sent to an agent and exec'd; the agent checks each launch against the same numbers (firepool_agent.wire)
with the broker's additions counted. Standard library only: the agent imports it, and so does the broker.

Linux execve(2) takes each string, its NUL included, up to MAX_ARG_STRLEN (32 pages = 131072 bytes), and
all strings plus one pointer each up to RLIMIT_STACK / 4 (2 MiB with the usual 8 MiB stack). A caller gets
half of that 2 MiB, so the pool's env, the agent's base env, topology and GPU variables always fit beside it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

MAX_ARG_STRLEN = 32 * 4096
"""The kernel's cap on one argv or env string, its NUL included."""
MAX_ARGV_ITEMS = 4096
MAX_ARG_BYTES = MAX_ARG_STRLEN - 1
"""One argument, UTF-8, without its NUL."""
MAX_ENV_ENTRIES = 1024
MAX_ENV_NAME_BYTES = 255
MAX_ENV_ENTRY_BYTES = MAX_ARG_STRLEN - 1
"""One `NAME=value`, UTF-8, without its NUL."""
MAX_CALLER_EXEC_BYTES = 1 << 20
"""A caller's argv and env together, counted as execve counts them (string, NUL, pointer)."""
EXEC_HEADROOM = 64 << 10
"""Kept free below the kernel's total at the agent: its base env, GPU variables, the file name, auxv."""
MAX_NAME_CHARS = 255
"""Longest lease tag (and the store's key columns: queue, pool, idempotency key)."""
MAX_LOG_OFFSET = 1 << 62
"""Largest log offset a reader may ask for (a file offset is a signed 64-bit value)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
"""A caller's variable name. The agent takes any name execve can carry (ANY_ENV_NAME): an operator's pool env
is checked by the catalog, not here."""
ANY_ENV_NAME = re.compile(r"[^=\x00\ud800-\udfff]+\Z")

_POINTER = 8
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class LimitError(ValueError):
    """A value the store, the agent or execve would refuse; `field` names where, `limit` the bound."""

    def __init__(self, field: str, message: str, limit: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.limit = limit


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as UTF-8 text or passed to execve (NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return "contains a NUL character"
    if value.isascii():  # O(1): the string's own flag
        return None
    found = _SURROGATE.search(value)
    if found is not None:
        return f"contains a lone surrogate (U+{ord(found.group()):04X}), which is not valid Unicode text"
    return None


def utf8_size(value: str) -> int:
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))


def exec_bytes(argv: Iterable[str], env: Mapping[str, str]) -> int:
    """Bytes execve counts for these strings: each string, its NUL and a pointer (`NAME=value` for env)."""
    args = list(argv)
    text = "".join(args) + "".join(env) + "".join(env.values())  # one encode, not one per string
    return utf8_size(text) + len(args) * (1 + _POINTER) + len(env) * (2 + _POINTER)


def check_argv(argv: Iterable[str], field: str = "command") -> None:
    """A program name, then arguments: no NUL, no lone surrogate, each at most MAX_ARG_BYTES; at most
    MAX_ARGV_ITEMS of them."""
    items = list(argv)
    if len(items) > MAX_ARGV_ITEMS:
        raise LimitError(field, f"{field} has {len(items)} arguments; at most {MAX_ARGV_ITEMS}", MAX_ARGV_ITEMS)
    if items and not items[0]:
        raise LimitError(f"{field}.0", f"{field}[0], the program to run, is empty")
    for i, arg in enumerate(items):
        problem = text_problem(arg)
        if problem is not None:
            raise LimitError(f"{field}.{i}", f"{field}[{i}] {problem}")
        if utf8_size(arg) > MAX_ARG_BYTES:
            raise LimitError(f"{field}.{i}", f"{field}[{i}] is {utf8_size(arg)} bytes; execve takes at most "
                             f"{MAX_ARG_BYTES} per argument", MAX_ARG_BYTES)


def check_env(env: Mapping[str, str], field: str = "env", *, names: re.Pattern[str] = ENV_NAME) -> None:
    """Each entry: a name `names` matches, no NUL or lone surrogate, `NAME=value` within MAX_ENV_ENTRY_BYTES."""
    if len(env) > MAX_ENV_ENTRIES:
        raise LimitError(field, f"{field} has {len(env)} entries; at most {MAX_ENV_ENTRIES}", MAX_ENV_ENTRIES)
    for name, value in env.items():
        if not names.match(name) or len(name) > MAX_ENV_NAME_BYTES:
            raise LimitError(field, f"{field} name {name!r} is not a variable name (letters, digits, _; "
                             f"at most {MAX_ENV_NAME_BYTES})")
        if value.isascii() and name.isascii() and "\x00" not in value \
                and len(name) + 1 + len(value) <= MAX_ENV_ENTRY_BYTES:
            continue  # the common case, decided without a call per check
        problem = text_problem(value)
        if problem is not None:
            raise LimitError(f"{field}.{name}", f"{field} value of {name} {problem}")
        size = utf8_size(name) + 1 + utf8_size(value)
        if size > MAX_ENV_ENTRY_BYTES:
            raise LimitError(f"{field}.{name}", f"{field} entry {name} is {size} bytes; execve takes at most "
                             f"{MAX_ENV_ENTRY_BYTES} per entry", MAX_ENV_ENTRY_BYTES)


def check_exec(argv: Iterable[str], env: Mapping[str, str], budget: int) -> None:
    """argv and env together within `budget` bytes (as execve counts them)."""
    size = exec_bytes(argv, env)
    if size > budget:
        raise LimitError("command", f"command and env take {size} bytes as execve counts them; at most "
                         f"{budget}", budget)


def check_name(field: str, value: str, max_chars: int = MAX_NAME_CHARS) -> None:
    """A tag or key: printable text (no control characters, NUL or lone surrogates), at most `max_chars`."""
    problem = text_problem(value)
    if problem is None and _CONTROL.search(value):
        problem = "contains a control character"
    if problem is not None:
        raise LimitError(field, f"{field} {problem}")
    if len(value) > max_chars:
        raise LimitError(field, f"{field} is {len(value)} characters; at most {max_chars}", max_chars)


def exec_limit() -> int:
    """The kernel's total for argv and env here (RLIMIT_STACK / 4, at least 128 KiB), less EXEC_HEADROOM."""
    try:
        total = int(os.sysconf("SC_ARG_MAX"))
    except (ValueError, OSError):
        total = 2 << 20
    return max(total, MAX_ARG_STRLEN) - EXEC_HEADROOM
