"""Processes beside a session's job, from the broker: `open_exec` starts one through the session pod's agent
(`GET /v1/exec`, `firepool_agent.execproc`) and returns an `ExecProcess` to stream, feed and signal it.

Owner-only as every session stream (`SessionStreams.pod`: another caller's tag is a 404 like a tag never
used). Errors are typed: NotFound (no live session of the caller), Conflict (the pod holds no session or
another one now), QuotaExceeded (the pod runs its most exec'd processes), InvalidRequest (the agent refused
the command: not found, cwd not a directory), AgentError (the agent was unreachable, or its stream broke:
the pod was reset or is gone). Closing before the exit hangs the process up (the agent SIGHUPs its group,
then SIGKILLs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Literal, Protocol

from broker.errors import AgentError, Conflict, InvalidRequest, QuotaExceeded
from firepool_agent import execframes, ptyframes

READ_CHUNK = 64 << 10
EventKind = Literal["stdout", "stderr", "exit"]
_KIND: dict[bytes, EventKind] = {execframes.STDOUT: "stdout", execframes.STDERR: "stderr"}


class Streams(Protocol):
    async def open(self, caller: str, tag: str, path: str, params: dict[str, Any], protocol: str,
                   queue: str = "default") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]: ...


class ExecProcess:
    """A process started by `open_exec`: `pid` (in the sandbox), its events, its stdin and signals."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int,
                 decoder: ptyframes.Decoder, early: list[tuple[bytes, bytes]]) -> None:
        self.pid = pid
        self.exit: dict[str, Any] | None = None
        """{"exit_code": N, "signal": S | None} once the exit event was read."""
        self._reader = reader
        self._writer = writer
        self._decoder = decoder
        self._early = early

    async def events(self) -> AsyncIterator[tuple[EventKind, Any]]:
        """("stdout" | "stderr", bytes) as the process writes, then ("exit", {"exit_code", "signal"}) last
        (the stream is closed then). AgentError when the stream ends without an exit (the pod was reset or is gone)."""
        frames, self._early = self._early, []
        while self.exit is None:
            for kind, payload in frames:
                if kind == execframes.EXIT:
                    self.exit = execframes.parse_exit(payload)
                    self._writer.close()  # nothing follows the exit
                    yield "exit", self.exit
                    return
                name = _KIND.get(kind)
                if name is None:
                    raise AgentError(f"the exec stream of process {self.pid} sent an unexpected frame {kind!r}")
                yield name, payload
            data = await self._reader.read(READ_CHUNK)
            if not data:
                self._writer.close()
                raise AgentError(f"the exec stream of process {self.pid} ended before its exit "
                                 "(the sandbox was reset or is gone)", {"pid": self.pid})
            try:
                frames = self._decoder.feed(data)
            except execframes.FrameError as exc:
                self._writer.close()
                raise AgentError(f"the exec stream of process {self.pid} is broken: {exc}") from None

    async def _send(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise AgentError(f"the exec stream of process {self.pid} is closed: {exc}", {"pid": self.pid}) from None

    async def write_stdin(self, data: bytes) -> None:
        """Send `data` to the process's stdin (dropped by the agent when it was opened with stdin=False)."""
        for start in range(0, len(data), execframes.MAX_PAYLOAD):
            await self._send(execframes.frame(execframes.STDIN, data[start:start + execframes.MAX_PAYLOAD]))

    async def close_stdin(self) -> None:
        """End of input: the process reads EOF once what was sent is read."""
        await self._send(execframes.frame(execframes.CLOSE_STDIN))

    async def signal(self, sig: int | str) -> None:
        """Send a signal (a number, or a name such as "KILL" or "SIGINT") to the process's whole group."""
        number = execframes.signal_number(sig)
        if number is None:
            raise InvalidRequest(f"{sig!r} names no signal", {"field": "signal"})
        await self._send(execframes.frame(execframes.SIGNAL, str(number).encode()))

    async def close(self) -> None:
        """Drop the stream; a process that has not exited is hung up (SIGHUP, then SIGKILL) by the agent."""
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> ExecProcess:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


async def open_exec(streams: Streams, caller: str, tag: str, argv: list[str], *, env: dict[str, str] | None = None,
                    cwd: str | None = None, stdin: bool = False, queue: str = "default",
                    session: str | None = None) -> ExecProcess:
    """Start `argv` (no shell) beside the job of `caller`'s session `tag`, once it runs (its pid is known).

    `env`: variables over the job environment the agent gives (pass the pool's and the session's names, as the
    terminal's `terminal_env`); `cwd`: relative to the workspace, or absolute; `stdin`: False reads /dev/null;
    `session`: the session's agent id (`jobenv.session_id`), so a pod that moved on refuses (409)."""
    params: dict[str, Any] = {"argv": json.dumps(list(argv)), "stdin": "1" if stdin else "0"}
    if env:
        params["env"] = json.dumps(env)
    if cwd is not None:
        params["cwd"] = cwd
    if session is not None:
        params["session"] = session
    try:
        reader, writer = await streams.open(caller, tag, "/v1/exec", params, execframes.PROTOCOL, queue)
    except AgentError as exc:
        raise _typed(exc, tag) from None
    decoder = execframes.decoder()
    frames: list[tuple[bytes, bytes]] = []
    try:
        while not frames:
            data = await reader.read(READ_CHUNK)
            if not data:
                raise AgentError(f"the exec stream of session {tag!r} ended before the process started")
            frames = decoder.feed(data)
        kind, payload = frames.pop(0)
        if kind != execframes.STARTED:
            raise AgentError(f"the exec stream of session {tag!r} began with {kind!r}, not started")
        pid = execframes.parse_started(payload)
    except execframes.FrameError as exc:
        writer.close()
        raise AgentError(f"the exec stream of session {tag!r} is broken: {exc}") from None
    except BaseException:
        writer.close()
        raise
    return ExecProcess(reader, writer, pid, decoder, frames)


def _typed(exc: AgentError, tag: str) -> Exception:
    status, message = exc.details.get("status"), exc.details.get("agent_message")
    details = {"tag": tag}
    if status == 409:
        return Conflict(f"session {tag!r}'s sandbox cannot run a process now: {message}", details)
    if status == 429:
        return QuotaExceeded(f"session {tag!r}'s sandbox runs too many processes: {message}", details)
    if status == 400:
        return InvalidRequest(f"session {tag!r}'s sandbox cannot run that: {message}", details)
    return exc


async def run_collected(streams: Streams, caller: str, tag: str, argv: list[str], *, stdin_data: bytes | None = None,
                        env: dict[str, str] | None = None, cwd: str | None = None, queue: str = "default",
                        session: str | None = None, max_bytes: int = 1 << 20,
                        timeout_s: float | None = None) -> tuple[int, bytes, bytes]:
    """Run `argv` to its end: (exit code, stdout, stderr), each output cut at `max_bytes` (the rest is read
    and dropped). `stdin_data` is fed then closed (without it the process reads /dev/null). TimeoutError
    after `timeout_s`: the process is hung up."""
    proc = await open_exec(streams, caller, tag, argv, env=env, cwd=cwd, stdin=stdin_data is not None,
                           queue=queue, session=session)
    out, err = bytearray(), bytearray()
    feeding: asyncio.Task[None] | None = None

    async def collect() -> int:
        async for kind, data in proc.events():
            if kind == "exit":
                return int(data["exit_code"])
            buf = out if kind == "stdout" else err
            buf += data[:max(0, max_bytes - len(buf))]
        raise AssertionError("unreachable: events end with the exit")

    async def feed(data: bytes) -> None:
        await proc.write_stdin(data)
        await proc.close_stdin()

    try:
        if stdin_data is not None:
            feeding = asyncio.create_task(feed(stdin_data))
        async with asyncio.timeout(timeout_s):
            code = await collect()
    finally:
        if feeding is not None:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
        await proc.close()
    return code, bytes(out), bytes(err)
