"""`AsyncSandbox`: one session's sandbox (a warm pod and its workspace, named by the session's tag), driven
through the broker's REST API and Jupyter gateway. `broker.sandbox.blocking.Sandbox` is its synchronous form.

    async with AsyncClient() as fp, fp.sandbox("conv-1", pool="cpu") as sb:
        r = await sb.run("pip list | head -3", on_stdout=print)     # streamed as it prints
        await sb.files.write("data.csv", b"a,b\\n1,2\\n")
        print((await sb.run_code("import pandas as pd; pd.read_csv('data.csv')")).text)

A command is a job of the session (`POST /v1/sessions/{tag}/commands`, its output streamed back as it runs).
`run_code` runs in the session's live kernel, a kernel of the broker's gateway started on first use, which
then holds the session's pod: while it lives, commands and file operations run as its subprocesses, in the
same workspace, with the same results. An idle kernel is ended (its namespace saved) by the pool's keep-alive
rules and the next `run_code` restores it (`broker.sandbox.kernels`).
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.errors import NotFound, StreamBroken
from broker.sandbox import commands
from broker.sandbox.calls import GRACE_S, Calls
from broker.sandbox.commands import OnOutput
from broker.sandbox.files import AsyncFiles
from broker.sandbox.kernel_io import KernelGone
from broker.sandbox.kernels import Kernels, LiveKernel
from broker.sandbox.results import CodeResult, CommandResult
from broker.sdk_protocols import AsyncCalls

DEFAULT_TIMEOUT_S = 600.0
CWD_WRAPPER = 'cd -- "$1" || exit 2; shift; exec "$@"'
"""Runs the rest of its arguments in directory $1 (a command beside the live kernel)."""
ME = ""
"""The caller key of this process's kernels: one client, one caller."""


class AsyncSandbox:
    """The sandbox of session `tag` (created on first use, resumed when it exists) in `pool` and `queue`."""

    def __init__(self, client: AsyncCalls, tag: str, *, pool: str = "cpu", queue: str = "default",
                 keep: bool = False) -> None:
        if not tag:
            raise ValueError("a sandbox needs a session tag")
        self.client, self.tag, self.pool, self.queue, self.keep = client, tag, pool, queue, keep
        self.kernels = Kernels()
        self.calls = Calls(client, pool=pool, queue=queue, caller=ME, kernels=self.kernels)
        self.files = AsyncFiles(self.calls, tag)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Leave the sandbox: end it, or with `keep=True` only stop the kernel (its namespace saved in the
        workspace, restored by the next `run_code` of this session) and leave the sandbox warm."""
        if self.keep:
            await self.kernels.close(save=True)
        else:
            await self.end()

    # ---------------------------------------------------------------- commands

    async def run(self, cmd: str | Sequence[str], *, on_stdout: OnOutput | None = None,
                  on_stderr: OnOutput | None = None, stdin: str | bytes | None = None, cwd: str | None = None,
                  env: dict[str, str] | None = None, timeout: float | None = None,
                  check: bool = False) -> CommandResult:
        """Run `cmd` (a string under `bash -c`, or an argv) in the workspace and wait for its end; its output
        comes to `on_stdout` / `on_stderr` as it is printed, and whole in the result. `timeout` (seconds,
        default 600) kills it (`timed_out` in the result); `check` raises CommandFailed unless it exits 0."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        events = commands.Events(on_stdout, on_stderr)
        live = self.kernels.live(ME, self.tag)
        result = None
        if live is not None:
            try:
                result = await self._beside_kernel(live, argv, data, cwd, env, timeout or DEFAULT_TIMEOUT_S,
                                                   events.out, events.err)
            except KernelGone:
                pass  # it ended while this call waited for it: the pod is free for a job again
        if result is None:
            result = await self._as_job(cmd, data, cwd, env, timeout or DEFAULT_TIMEOUT_S, events)
        return result.check() if check else result

    async def _as_job(self, cmd: str | Sequence[str], stdin: bytes | None, cwd: str | None,
                      env: dict[str, str] | None, timeout: float, events: commands.Events) -> CommandResult:
        request = commands.body(cmd, stdin, cwd, env, timeout, self.pool, self.queue)
        where = commands.path(self.tag)
        if events.out.callback is None and events.err.callback is None:  # nobody listens: one answer at its end
            answer = await self.client._call("POST", where, json=request, params=commands.STREAM_FALSE, timeout=None)
            end, stdout, stderr = commands.answered(answer.json())
            return commands.result(end, stdout if stdout is not None else await self._log(end["id"], "stdout"),
                                   stderr if stderr is not None else await self._log(end["id"], "stderr"),
                                   events.began)
        try:
            async with self.client._stream("POST", where, json=request, timeout=None) as response:
                async for line in response.aiter_lines():
                    events.feed(line)
        except StreamBroken:
            if events.job is None:
                raise
        if events.end is None:  # the broker went away mid-command: the job is durable; its end and log are not lost
            assert events.job is not None
            job_id = str(events.job["id"])
            info = await self.client.wait(job_id)
            return commands.result(info.raw, await self._log(job_id, "stdout"), await self._log(job_id, "stderr"),
                                   events.began)
        return commands.result(events.end, await events.out.settle(), await events.err.settle(), events.began)

    async def _log(self, job_id: str, stream: str) -> str:
        return (await self.client.logs(job_id, stream))[-commands.KEEP_CHARS:]

    async def _beside_kernel(self, live: LiveKernel, argv: list[str], stdin: bytes | None, cwd: str | None,
                             env: dict[str, str] | None, timeout: float, out: commands.Output,
                             err: commands.Output) -> CommandResult:
        if cwd:
            argv = ["bash", "-c", CWD_WRAPPER, "firepool", cwd, *argv]

        def stream(name: str, text: str) -> None:
            (err if name == "stderr" else out).add(text)

        ex, res = await self.kernels.run_argv(live, argv, env, timeout, GRACE_S, stdin=stdin, on_stream=stream)
        stdout, stderr = await out.settle(), await err.settle()
        if res is None:  # it did not end: the kernel was interrupted (or lost) with it
            why = f"{ex.error.get('ename')}: {ex.error.get('evalue')}" if ex.error else "no answer from the kernel"
            return CommandResult(exit_code=None, stdout=stdout, stderr=stderr + why, state="FAILED",
                                 error_class="Timeout" if ex.timed_out else "KernelError", job_id=live.job.id,
                                 duration_s=ex.duration_s)
        timed_out = bool(res["timed_out"])
        rc = res["exit_code"]
        if rc is not None and rc < 0:  # killed by a signal: the job's convention (a shell's), 128 + its number
            rc = 128 - rc
        return CommandResult(exit_code=rc, stdout=stdout, stderr=stderr, state="SUCCEEDED" if rc == 0 else "FAILED",
                             error_class="Timeout" if timed_out else None if rc == 0 else "NonZeroExit",
                             job_id=live.job.id, duration_s=float(res["duration_s"]))

    # ---------------------------------------------------------------- code

    async def run_code(self, code: str, *, timeout: float = DEFAULT_TIMEOUT_S, on_stdout: OnOutput | None = None,
                       on_stderr: OnOutput | None = None, check: bool = False) -> CodeResult:
        """Run Python in the session's live kernel (started on first use; its variables, imports and files
        stay between calls). Rich outputs (images, HTML, DataFrames) are in `results`; an exception in the code
        is the result's `error` (`check` raises it as CodeFailed). `timeout` interrupts the cell, the kernel
        and its state stay."""
        out, err = commands.Output(on_stdout), commands.Output(on_stderr)

        def stream(name: str, text: str) -> None:
            (err if name == "stderr" else out).add(text)

        k = await self.kernels.ensure(self.calls, ME, self.tag)
        ex = await self.kernels.execute(k, code, timeout_s=timeout, on_stream=stream)
        await out.settle()
        await err.settle()
        result = CodeResult.of(ex.stdout, ex.stderr, ex.outputs, ex.error, ex.execution_count, ex.timed_out)
        return result.check() if check else result

    # ---------------------------------------------------------------- the rest

    def get_url(self, port: int) -> str:
        """Where port `port` of this sandbox is served through the broker (send the client's token), e.g. a
        server the code started on 127.0.0.1:port; a browser wants `get_link`."""
        return self.client.port_url(self.tag, port)

    async def get_link(self, port: int, ttl_s: float | None = None) -> str:
        """A short-lived signed link to the port a browser can open (it sets a cookie for that port only)."""
        return str((await self.client.port_link(self.tag, port, ttl_s))["url"])

    async def end(self) -> None:
        """End the sandbox now: its kernel, any command of it still running, its pod and its workspace."""
        await self.kernels.end(ME, self.tag, "the sandbox was ended", save=False)
        self.kernels.forget(ME, self.tag)
        await self.kernels.close(save=False)
        try:
            await self.client.end_session(self.tag, self.queue)
        except NotFound:
            pass  # nothing ran in it yet, or it had already ended
