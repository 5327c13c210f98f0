"""A session command over `POST /v1/sessions/{tag}/commands`, the parts the sync and async sandboxes share: the
request, the output as it arrives (to callbacks, and kept), and the result from the job's end."""

from __future__ import annotations

import base64
import inspect
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

from broker.sandbox.results import CommandResult

OnOutput = Callable[[str], "Awaitable[None] | None"]
"""Called with each piece of output as the command prints it (a plain function, or an async one)."""

KEEP_CHARS = 32 << 20
"""Output a result keeps per stream (the end of it); callbacks see all of it."""
STREAM_FALSE = {"stream": "false"}
"""Asked when no callback listens: one answer at the end, output inline."""


def path(tag: str) -> str:
    return f"/v1/sessions/{quote(tag, safe='')}/commands"


def body(cmd: str | Sequence[str], stdin: bytes | None, cwd: str | None, env: dict[str, str] | None,
         timeout: float, pool: str, queue: str) -> dict[str, Any]:
    """The request; its idempotency key makes a retried submit find the same job."""
    out: dict[str, Any] = {"command": cmd if isinstance(cmd, str) else list(cmd), "pool": pool, "queue": queue,
                           "timeout_s": timeout, "idempotency_key": f"sdk-{uuid.uuid4().hex}"}
    out.update({k: v for k, v in (("env", env), ("cwd", cwd)) if v})
    if stdin:
        out["stdin_base64"] = base64.b64encode(stdin).decode()
    return out


class Output:
    """One stream of a command: what a result keeps of it, and its callback."""

    def __init__(self, callback: OnOutput | None) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.callback = callback
        self.pending: list[Awaitable[None]] = []

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)
        if self.size > 2 * KEEP_CHARS:
            kept = "".join(self.parts)[-KEEP_CHARS:]
            self.parts, self.size = [kept], len(kept)
        if self.callback is not None:
            result = self.callback(text)
            if inspect.isawaitable(result):
                self.pending.append(result)

    @property
    def text(self) -> str:
        return "".join(self.parts)[-KEEP_CHARS:]

    async def settle(self) -> str:
        """The kept text, once the async callbacks have run."""
        for pending in self.pending:
            await pending
        return self.text


class Events:
    """The NDJSON answer of a streamed command, fed line by line."""

    def __init__(self, on_stdout: OnOutput | None, on_stderr: OnOutput | None) -> None:
        self.out, self.err = Output(on_stdout), Output(on_stderr)
        self.job: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        self.began = time.monotonic()

    def feed(self, line: str) -> None:
        if not line:
            return
        event = json.loads(line)
        kind = event.get("event")
        if kind == "stdout":
            self.out.add(event["data"])
        elif kind == "stderr":
            self.err.add(event["data"])
        elif kind == "job":
            self.job = event["job"]
        elif kind == "end":
            self.end = event["job"]


def result(end: dict[str, Any], stdout: str, stderr: str, began: float) -> CommandResult:
    return CommandResult(exit_code=end.get("exit_code"), stdout=stdout, stderr=stderr, state=end["state"],
                         error_class=end.get("error_class"), job_id=end["id"], duration_s=time.monotonic() - began)


def answered(answer: dict[str, Any]) -> tuple[dict[str, Any], str | None, str | None]:
    """A `stream=false` answer: the job's end and its output, None for a stream the log must give whole."""
    return (answer["job"], None if answer.get("stdout_truncated") else answer["stdout"],
            None if answer.get("stderr_truncated") else answer["stderr"])
