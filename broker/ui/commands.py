"""A job's command as the dashboard shows it: what the caller asked for, quoted as a shell would.

A plain argv is `shlex.join`ed (`sh -c 'echo hi'`, not `sh -c echo hi`). The sandbox layer's calls
(`broker.sandbox.wrappers`: the MCP server's and the SDK's) arrive inside a bash wrapper (`bash -c WRAPPER
firepool-call CWD MODE ...`, about 900 characters before the user's own command), as its file helper
(`python3 -c FILES OP JSON`), or as a session command with a directory or stdin (`bash -c STDIN_WRAPPER firepool
CWD STDIN ...`); those are reduced to the call they carry. The wrappers are recognised by their exact text.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from broker.sandbox.wrappers import FILES, WRAPPER, stdin_wrapped

WRAPPER_NAME = "firepool-call"
"""`$0` of the command wrapper's `bash -c`."""
MODES = ("shell", "argv")
FILE_OPS = ("write", "read", "list", "remove", "install", "info")


def display_command(argv: Sequence[str]) -> str:
    """The command a person asked for, as one shell-quoted line."""
    args = [str(a) for a in argv]
    inner = _unwrap(args) or _session_command(args)
    if inner is not None:
        return inner
    files = _files_call(args)
    return files if files is not None else shlex.join(args)


def _unwrap(args: list[str]) -> str | None:
    """The MCP wrapper's own call (`bash -c WRAPPER firepool-call CWD MODE ARGS...`), or None."""
    if len(args) < 6 or args[0].rsplit("/", 1)[-1] != "bash" or args[1] != "-c" or args[3] != WRAPPER_NAME:
        return None
    if args[2] != WRAPPER or args[5] not in MODES:
        return None
    cwd, mode, rest = args[4], args[5], args[6:]
    if mode == "shell":
        if len(rest) != 1:
            return None
        inner = rest[0]
    else:
        if not rest:
            return None
        inner = display_command(rest)
    return f"cd {shlex.quote(cwd)} && {inner}" if cwd else inner


def _session_command(args: list[str]) -> str | None:
    """A session command run in a directory or with stdin (`broker.sandbox.wrappers.with_stdin`)."""
    found = stdin_wrapped(args)
    if found is None:
        return None
    cwd, stdin, rest = found
    inner = rest[2] if rest[:2] == ["bash", "-c"] and len(rest) == 3 else display_command(rest)
    if stdin:
        inner += " < (stdin)"
    return f"cd {shlex.quote(cwd)} && {inner}" if cwd else inner


def _files_call(args: list[str]) -> str | None:
    """The MCP file helper's operation (`python3 [-I -S] -c FILES OP JSON...`) in words, or None."""
    if len(args) < 4 or not args[0].rsplit("/", 1)[-1].startswith("python"):
        return None
    at = 1
    while at < len(args) and args[at] in ("-I", "-S"):
        at += 1
    if len(args) < at + 3 or args[at] != "-c" or args[at + 1] != FILES:
        return None
    op = args[at + 2]
    if op not in FILE_OPS:
        return None
    try:
        payload = json.loads("".join(args[at + 3:]) or "{}")
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    if op == "install":
        packages = [str(p) for p in payload.get("packages") or []]
        return shlex.join(["pip", "install", *[str(a) for a in payload.get("pip_args") or []], *packages])
    if op == "remove":
        return shlex.join(["files.remove", *[str(p) for p in payload.get("paths") or []]])
    if op in ("write", "read"):
        items = payload.get("files") or []
        paths = [str(f.get("path", "?")) for f in items if isinstance(f, dict)]
        return shlex.join([f"files.{op}", *paths])
    if op == "list":
        return shlex.join(["files.list", str(payload.get("path") or ".")])
    return "files.info"
