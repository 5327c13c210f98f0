"""PTYs for E2B's `sbx.pty`: a process on a pseudo-terminal beside the holding job, through the pod agent's
terminal stream (`GET /v1/terminal`, firepool-pty frames), shaped like an exec'd process for the registry.

The agent's terminal reports no pid, so a PTY's E2B pid is the broker's own handle (from PTY_PIDS up), unique
in its sandbox. Input goes to the PTY as typed; a resize is the terminal's resize frame; SIGKILL hangs the
terminal up (SIGHUP to its process group, SIGKILL two seconds later, by the agent), SIGTERM is sent as is.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shlex
from collections.abc import AsyncIterator
from typing import Any, Protocol

from broker.errors import AgentError
from firepool_agent import ptyframes

READ_CHUNK = 64 << 10
PTY_PIDS = itertools.count(1 << 22)
"""Above Linux's default pid_max (4194304), so a PTY's handle never equals a real process's pid."""


class Streams(Protocol):
    async def open(self, caller: str, tag: str, path: str, params: dict[str, Any], protocol: str,
                   queue: str = "default") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...


def command_of(argv: list[str], cwd: str | None) -> str:
    run = "exec " + shlex.join(argv)
    return f"cd -- {shlex.quote(cwd)} && {run}" if cwd else run


class PtyProcess:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.pid = next(PTY_PIDS)
        self._reader = reader
        self._writer = writer
        self._decoder = ptyframes.Decoder()
        self.hung_up = False

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """("pty", bytes) as the terminal prints, then ("exit", {"exit_code", "signal"})."""
        while True:
            data = await self._reader.read(READ_CHUNK)
            if not data:
                if self.hung_up:
                    yield "exit", {"exit_code": -1, "signal": "KILL"}
                    return
                raise AgentError(f"the terminal stream of PTY {self.pid} ended before its exit")
            try:
                frames = self._decoder.feed(data)
            except ptyframes.FrameError as exc:
                raise AgentError(f"the terminal stream of PTY {self.pid} is broken: {exc}") from None
            for kind, payload in frames:
                if kind == ptyframes.EXIT:
                    yield "exit", {"exit_code": ptyframes.parse_exit(payload), "signal": None}
                    return
                if kind == ptyframes.DATA:
                    yield "pty", payload

    async def _send(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise AgentError(f"the terminal stream of PTY {self.pid} is closed: {exc}") from None

    async def write_stdin(self, data: bytes) -> None:
        for start in range(0, len(data), ptyframes.MAX_PAYLOAD):
            await self._send(ptyframes.frame(ptyframes.DATA, data[start:start + ptyframes.MAX_PAYLOAD]))

    async def close_stdin(self) -> None:
        await self.write_stdin(b"\x04")  # end of input on a terminal: ^D

    async def resize(self, rows: int, cols: int) -> None:
        await self._send(ptyframes.resize(rows, cols))

    async def signal(self, sig: int | str) -> None:
        name = str(sig).upper().removeprefix("SIG")
        if name in ("KILL", "9"):
            self.hung_up = True
            self._writer.close()  # the agent hangs the terminal up: SIGHUP, then SIGKILL
            return
        await self._send(ptyframes.frame(ptyframes.SIGNAL, name.encode()))

    async def close(self) -> None:
        self.hung_up = True
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


async def open_pty(streams: Streams, caller: str, tag: str, argv: list[str], *, rows: int, cols: int,
                   env: dict[str, str], cwd: str | None, session: str | None) -> PtyProcess:
    params: dict[str, Any] = {"rows": str(max(1, min(rows or 24, ptyframes.MAX_SIZE))),
                              "cols": str(max(1, min(cols or 80, ptyframes.MAX_SIZE))),
                              "command": command_of(argv, cwd), "env": json.dumps(env)}
    if session is not None:
        params["session"] = session
    reader, writer = await streams.open(caller, tag, "/v1/terminal", params, ptyframes.PROTOCOL)
    return PtyProcess(reader, writer)
