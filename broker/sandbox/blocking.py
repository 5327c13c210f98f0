"""`Sandbox`: the synchronous form of `AsyncSandbox` (same methods, same results), for scripts and agents.

    from broker.client import Client
    with Client() as fp, fp.sandbox("conv-1", pool="cpu") as sb:
        r = sb.run("echo hi; echo err >&2", on_stdout=print)       # r.exit_code, r.stdout, r.stderr
        sb.files.write("a.txt", "x"); sb.files.read("a.txt")        # "x"
        sb.run_code("x = 41"); sb.run_code("x + 1").text            # "42"

A command that runs as a job goes over the client's own connection, its output callbacks called on the
calling thread. The rest (the kernel's websocket, commands beside it, files) lives on a private event loop
in a daemon thread; each call runs there and blocks for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Literal, overload

from broker.aclient import AsyncClient
from broker.errors import StreamBroken
from broker.kernel_blocking import BackgroundLoop
from broker.sandbox import commands
from broker.sandbox.files import AsyncFiles, Entry
from broker.sandbox.handle import DEFAULT_TIMEOUT_S, ME, AsyncSandbox
from broker.sandbox.results import CodeResult, CommandResult
from broker.sdk_protocols import SyncCalls

OnText = Callable[[str], None]


class Files:
    """`sandbox.files`, synchronous (see `AsyncFiles`)."""

    def __init__(self, loop: BackgroundLoop, files: AsyncFiles) -> None:
        self._loop, self._files = loop, files

    def write(self, path: str, data: str | bytes) -> int:
        return self._loop.run(self._files.write(path, data))

    def write_files(self, files: dict[str, str | bytes]) -> int:
        return self._loop.run(self._files.write_files(files))

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    def read(self, path: str, format: Literal["text", "bytes"] = "text") -> str | bytes:
        if format == "bytes":
            return self._loop.run(self._files.read(path, "bytes"))
        return self._loop.run(self._files.read(path))

    def list(self, path: str = ".", depth: int = 1, limit: int = 1000) -> list[Entry]:
        return self._loop.run(self._files.list(path, depth, limit))

    def exists(self, path: str) -> bool:
        return self._loop.run(self._files.exists(path))

    def remove(self, *paths: str) -> None:
        self._loop.run(self._files.remove(*paths))

    def upload(self, local: str | os.PathLike[str], to: str = ".") -> int:
        return self._loop.run(self._files.upload(local, to))

    def download(self, path: str, local: str | os.PathLike[str], depth: int = 64) -> int:
        return self._loop.run(self._files.download(path, local, depth))


class Sandbox:
    """The sandbox of session `tag`, synchronous (see `AsyncSandbox` for what each call does)."""

    def __init__(self, fp: SyncCalls, tag: str, *, pool: str = "cpu", queue: str = "default", keep: bool = False) -> None:
        self._fp = fp
        self._loop = BackgroundLoop()
        self._client = AsyncClient(fp.urls, fp.found.token, retry=fp.retry)
        self._sandbox = AsyncSandbox(self._client, tag, pool=pool, queue=queue, keep=keep)
        self.tag, self.pool, self.queue = tag, pool, queue
        self.files = Files(self._loop, self._sandbox.files)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the sandbox (with `keep=True`: stop its kernel, saving its namespace, and leave it warm)."""
        try:
            self._loop.run(self._sandbox.close())
        finally:
            self._loop.run(self._client.close())
            self._loop.stop()

    def run(self, cmd: str | Sequence[str], *, on_stdout: OnText | None = None, on_stderr: OnText | None = None,
            stdin: str | bytes | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
            timeout: float | None = None, check: bool = False) -> CommandResult:
        """As `AsyncSandbox.run`. A command that runs as a job goes over this thread's own connection and its
        callbacks are called on this thread; beside a live kernel it runs on the sandbox's loop."""
        if self._sandbox.kernels.live(ME, self.tag) is not None:
            return self._loop.run(self._sandbox.run(cmd, on_stdout=on_stdout, on_stderr=on_stderr, stdin=stdin,
                                                    cwd=cwd, env=env, timeout=timeout, check=check))
        data = stdin.encode() if isinstance(stdin, str) else stdin
        result = self._as_job(cmd, data, cwd, env, timeout or DEFAULT_TIMEOUT_S, commands.Events(on_stdout, on_stderr))
        return result.check() if check else result

    def _as_job(self, cmd: str | Sequence[str], stdin: bytes | None, cwd: str | None, env: dict[str, str] | None,
                timeout: float, events: commands.Events) -> CommandResult:
        fp = self._fp
        request = commands.body(cmd, stdin, cwd, env, timeout, self.pool, self.queue)
        where = commands.path(self.tag)
        if events.out.callback is None and events.err.callback is None:  # nobody listens: one answer at its end
            end, stdout, stderr = commands.answered(
                fp._call("POST", where, json=request, params=commands.STREAM_FALSE, timeout=None).json())
            return commands.result(end, stdout if stdout is not None else self._log(end["id"], "stdout"),
                                   stderr if stderr is not None else self._log(end["id"], "stderr"), events.began)
        try:
            with fp._stream("POST", where, json=request, timeout=None) as response:
                for line in response.iter_lines():
                    events.feed(line)
        except StreamBroken:
            if events.job is None:
                raise
        if events.end is None:  # the broker went away mid-command: the job is durable; its end and log are not lost
            assert events.job is not None
            job_id = str(events.job["id"])
            info = fp.wait(job_id)
            return commands.result(info.raw, self._log(job_id, "stdout"), self._log(job_id, "stderr"), events.began)
        return commands.result(events.end, events.out.text, events.err.text, events.began)

    def _log(self, job_id: str, stream: str) -> str:
        return self._fp.logs(job_id, stream)[-commands.KEEP_CHARS:]

    def run_code(self, code: str, *, timeout: float = DEFAULT_TIMEOUT_S, on_stdout: OnText | None = None,
                 on_stderr: OnText | None = None, check: bool = False) -> CodeResult:
        return self._loop.run(self._sandbox.run_code(code, timeout=timeout, on_stdout=on_stdout,
                                                     on_stderr=on_stderr, check=check))

    def get_url(self, port: int) -> str:
        return self._sandbox.get_url(port)

    def get_link(self, port: int, ttl_s: float | None = None) -> str:
        return self._loop.run(self._sandbox.get_link(port, ttl_s))

    def end(self) -> None:
        self._loop.run(self._sandbox.end())
