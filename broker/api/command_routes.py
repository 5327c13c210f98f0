"""`POST /v1/sessions/{tag}/commands`: one command in a session's sandbox, its output streamed as it runs.

The command is a job of the session (`lease_tag` = tag: its warm sandbox, its workspace), submitted and
followed in one request, so a client in any language gets what the SDK's `Sandbox.run` does from one
HTTP exchange. The answer is NDJSON, one event a line:

    {"event": "job", "job": {...}}            once queued (the job's view, as GET /v1/jobs/{id})
    {"event": "stdout", "data": "..."}        output as it is printed (UTF-8 text; invalid bytes replaced)
    {"event": "stderr", "data": "..."}
    {"event": "end", "job": {...}}            last: the job as it ended (state, exit_code, error_class)

A client that goes away before the end cancels the command: nothing keeps running that nobody reads. The job
is an ordinary one (its log stays readable, its output budget and `timeout_s` apply), and the session's pod
is held only while it runs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI, Query
from fastapi.responses import StreamingResponse
from pydantic import Field

from broker.api.schemas import Strict, job_view
from broker.errors import FirepoolError, InvalidRequest
from broker.jobs import Job, JobSpec
from broker.sandbox.wrappers import with_stdin
from firepool_agent.limits import MAX_ARGV_ITEMS, MAX_ENV_ENTRIES, MAX_NAME_CHARS

log = logging.getLogger(__name__)

MAX_STDIN_BYTES = 512 << 10
"""stdin travels as job arguments (execve caps a job's arguments and environment near 1 MiB in all)."""
MAX_INLINE_CHARS = 1 << 20
"""A stream's output a `stream=false` answer carries inline (past it: `*_truncated`, and the job's log has it all)."""
READ_WAIT_S = 5.0
"""How long one read of a running job's log waits at its agent for more output."""

FIRST_READ_S = 0.01
"""A running command's output is first read this long after its pod was claimed, unless its launch returns
sooner (a warm launch takes a few ms; the launch call waits up to 250 ms for a short command to end)."""


class CommandRequest(Strict):
    """POST /v1/sessions/{tag}/commands."""

    command: str | list[str] = Field(description="A string runs under `bash -c` in the workspace; a list is the "
                                                 "argv, run as is.")
    pool: str = Field(default="cpu", min_length=1, max_length=63)
    queue: str = Field(default="default", min_length=1, max_length=64)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_ENTRIES)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096,
                            description="Directory to run in, relative to the workspace (or absolute).")
    stdin: str | None = Field(default=None, description="Text fed to the command's stdin (else it reads /dev/null).")
    stdin_base64: str | None = Field(default=None, description="Bytes fed to stdin, base64 (instead of `stdin`).")
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400,
                                    description="Kill the command after this many seconds (it ends FAILED, "
                                                "error_class Timeout).")
    recycle: bool = Field(default=False, description="As POST /v1/jobs; false by default here: a session never "
                                                     "takes over another session's idle sandbox.")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=128)

    def argv(self) -> list[str]:
        tail = ["bash", "-c", self.command] if isinstance(self.command, str) else list(self.command)
        if not tail or len(tail) > MAX_ARGV_ITEMS - 5:
            raise InvalidRequest(f"command must have 1 to {MAX_ARGV_ITEMS - 5} items", {"field": "command"})
        data = self._stdin()
        if data is None and self.cwd is None:
            return tail
        return with_stdin(tail, self.cwd, data)

    def _stdin(self) -> bytes | None:
        if self.stdin is not None and self.stdin_base64 is not None:
            raise InvalidRequest("give stdin or stdin_base64, not both", {"field": "stdin"})
        data: bytes | None = None
        if self.stdin_base64 is not None:
            try:
                data = base64.b64decode(self.stdin_base64, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest("stdin_base64 is not base64", {"field": "stdin_base64"}) from None
        elif self.stdin is not None:
            data = self.stdin.encode()
        if data is not None and len(data) > MAX_STDIN_BYTES:
            raise InvalidRequest(f"stdin holds at most {MAX_STDIN_BYTES} bytes here (larger inputs: write a "
                                 "file first)", {"field": "stdin", "limit": MAX_STDIN_BYTES})
        return data

    def spec(self, tag: str) -> JobSpec:
        return JobSpec(pool=self.pool, command=tuple(self.argv()), env=dict(self.env), lease_tag=tag,
                       queue=self.queue, recycle=self.recycle, timeout_s=self.timeout_s,
                       idempotency_key=self.idempotency_key)


class LogChunkLike(Protocol):
    data: bytes
    next_offset: int
    complete: bool


class Jobs(Protocol):
    """What the route needs of the control plane."""

    async def submit(self, caller: str, spec: JobSpec) -> tuple[Job, bool]: ...
    async def get(self, caller: str, job_id: str) -> Job: ...
    async def wait(self, caller: str, job_id: str, wait_s: float) -> Job: ...
    async def cancel(self, caller: str, job_id: str) -> Job: ...
    async def read_log(self, caller: str, job_id: str, *, stream: str = ..., offset: int = ...,
                       max_bytes: int = ..., wait_s: float = ..., attempt: int | None = ...,
                       known: Job | None = ...) -> Any: ...
    def waiting_reason(self, job_id: str) -> str | None: ...


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


async def _pump(jobs: Jobs, caller: str, job_id: str, stream: str, out: asyncio.Queue[tuple[str, bytes] | None],
                changed: Callable[[str, float], Any]) -> None:
    """Copy one stream of the job's log into `out` as it grows; None when it is complete."""
    offset = 0
    try:
        while True:
            chunk = await jobs.read_log(caller, job_id, stream=stream, offset=offset, wait_s=READ_WAIT_S)
            if chunk.data:
                offset = chunk.next_offset
                await out.put((stream, chunk.data))
            if chunk.complete:
                break
            if not chunk.data:
                await changed(job_id, 0.05)  # queued, or between launch and the agent's first byte
    except FirepoolError as exc:  # the log is gone (the job was deleted): the end event says how it ended
        log.warning("command %s: %s log unreadable: %s", job_id, stream, exc)
    await out.put(None)


async def _launched(jobs: Jobs, changed: Callable[[str, float], Any], caller: str, job: Job) -> Job:
    """Wait until the job's launch returned (or it ended), or FIRST_READ_S after its claim: a read of its agent
    racing a warm launch slows the launch, and the launch call itself may wait for a short command's end."""
    deadline: float | None = None
    while not (job.terminal or "first_instruction_at" in job.timings):
        if job.attempts:  # claimed: its launch is on its way
            loop = asyncio.get_running_loop()
            deadline = deadline or loop.time() + FIRST_READ_S
            if loop.time() >= deadline:
                return job
            await changed(job.id, deadline - loop.time())
        else:
            await changed(job.id, READ_WAIT_S)
        job = await jobs.get(caller, job.id)
    return job


async def _stored(jobs: Jobs, caller: str, job: Job, stream: str) -> AsyncIterator[bytes]:
    """An ended job's stream, from the log store."""
    offset = 0
    while True:
        chunk = await jobs.read_log(caller, job.id, stream=stream, offset=offset, known=job)
        if chunk.data:
            offset = chunk.next_offset
            yield chunk.data
        if chunk.complete or not chunk.data:
            return


async def _output(jobs: Jobs, changed: Callable[[str, float], Any], caller: str,
                  job: Job) -> AsyncGenerator[tuple[str, str], None]:
    """(stream, text) as the job prints it: read whole from the log store when it has ended (a short command ends
    within its launch), else from its agent as it runs, both streams at once."""
    decoders = {s: codecs.getincrementaldecoder("utf-8")(errors="replace") for s in ("stdout", "stderr")}
    if job.terminal:
        for stream in ("stdout", "stderr"):
            async for data in _stored(jobs, caller, job, stream):
                if text := decoders[stream].decode(data):
                    yield stream, text
    else:
        out: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=64)
        pumps = [asyncio.create_task(_pump(jobs, caller, job.id, s, out, changed)) for s in ("stdout", "stderr")]
        try:
            open_streams = 2
            while open_streams:
                item = await out.get()
                if item is None:
                    open_streams -= 1
                elif text := decoders[item[0]].decode(item[1]):
                    yield item[0], text
        finally:
            for t in pumps:
                t.cancel()
    for stream, decoder in decoders.items():
        if rest := decoder.decode(b"", final=True):
            yield stream, rest


async def command_events(jobs: Jobs, changed: Callable[[str, float], Any], caller: str, job: Job, *,
                         stream: bool = True) -> AsyncIterator[bytes]:
    """The answer to a submitted command job: NDJSON events as it runs, or (`stream` false) one JSON document at its
    end with its output inline up to MAX_INLINE_CHARS a stream. Whoever goes away first cancels the command."""
    ended = False
    inline: dict[str, list[str]] = {"stdout": [], "stderr": []}
    sizes = {"stdout": 0, "stderr": 0}
    try:
        if stream:
            yield _line({"event": "job", "job": job_view(job, jobs.waiting_reason(job.id))})
        now = await _launched(jobs, changed, caller, job) if stream else job
        while not (stream or now.terminal):  # nobody reads it as it runs: its end, then its whole log
            now = await jobs.wait(caller, job.id, 60.0)
        async with contextlib.aclosing(_output(jobs, changed, caller, now)) as output:
            async for name, text in output:
                if stream:
                    yield _line({"event": name, "data": text})
                elif sizes[name] < MAX_INLINE_CHARS:
                    inline[name].append(text[:MAX_INLINE_CHARS - sizes[name]])
                sizes[name] += len(text)
        final = now
        while not final.terminal:
            final = await jobs.wait(caller, job.id, 60.0)
        ended = True
        if stream:
            yield _line({"event": "end", "job": job_view(final)})
        else:
            yield json.dumps({"job": job_view(final), **{n: "".join(parts) for n, parts in inline.items()},
                              **{f"{n}_truncated": size > MAX_INLINE_CHARS for n, size in sizes.items()}}).encode()
    finally:
        if not ended:  # the client went away (or the broker is stopping): the command must not live on
            await asyncio.shield(_cancel_quietly(jobs, caller, job.id))


async def _cancel_quietly(jobs: Jobs, caller: str, job_id: str) -> None:
    try:
        await jobs.cancel(caller, job_id)
    except FirepoolError:
        pass  # it ended meanwhile


def add_command_routes(app: FastAPI, jobs: Jobs, changed: Callable[[str, float], Any], caller: Any,
                       errors: dict[int | str, dict[str, Any]]) -> None:
    """`caller` is the dependency giving the verified caller; `changed(job_id, timeout)` waits for a change."""

    @app.post("/v1/sessions/{tag}/commands", response_class=StreamingResponse,
              responses={200: {"content": {"application/x-ndjson": {}, "application/json": {}},
                               "description": "NDJSON events (job, then stdout/stderr chunks, then end); with "
                                              "stream=false one JSON object at the end: job, stdout, stderr, "
                                              "stdout_truncated, stderr_truncated."}, **errors})
    async def run_command(tag: str, body: CommandRequest, who: str = Depends(caller),
                          stream: Annotated[bool, Query(description="false: answer once, at the end")] = True,
                          ) -> StreamingResponse:
        """Run a command in your session `tag`'s sandbox (its warm pod, its workspace) and stream its output as
        it runs: NDJSON events `job`, then `stdout` / `stderr` chunks, then `end` with the job's state and exit
        code; or, with `stream=false`, one JSON object when it ends, its output inline (up to 1 MiB a stream; the
        job's log holds the rest). Closing the connection before the end cancels the command."""
        if not tag or len(tag) > MAX_NAME_CHARS:
            raise InvalidRequest(f"the session tag must be 1 to {MAX_NAME_CHARS} characters", {"field": "tag"})
        job, _ = await jobs.submit(who, body.spec(tag))
        return StreamingResponse(command_events(jobs, changed, who, job, stream=stream),
                                 media_type="application/x-ndjson" if stream else "application/json",
                                 headers={"X-Job-Id": job.id, "Cache-Control": "no-store"})
