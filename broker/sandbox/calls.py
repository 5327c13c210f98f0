"""One tool call as one broker job in the session's sandbox: submit, follow with progress, collect.

A timeout is a result (`timed_out: true` with the partial output), not an exception; a cancelled tool
call cancels its job before the cancellation propagates, so nothing keeps running in the sandbox.
While the session has a live Python kernel (see `broker.sandbox.kernels`) the kernel job holds the
session's pod, so the call runs as a subprocess of the kernel instead, with the same result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from broker.client_core import JobInfo
from broker.sandbox import wrappers
from broker.sdk_protocols import AsyncCalls

if TYPE_CHECKING:
    from broker.sandbox.kernels import Kernels

TAIL_BYTES = 8 * 1024
"""Inline output per stream; the full log stays readable as a resource and through job_status."""
ERR_END_BYTES = 256 * 1024
"""The end of stderr a call reads: its tail and the artifact block the wrapper writes last."""
PROGRESS_EVERY_S = 2.0
"""How often a running call reports progress (with the last output line)."""
GRACE_S = 20.0
"""How long past its timeout a call waits for the agent's kill before cancelling the job itself."""

Progress = Callable[[float, float | None, str], Awaitable[None]]


@dataclass
class Tail:
    """The end of one output stream."""

    text: str
    total_bytes: int

    @property
    def truncated(self) -> bool:
        return self.total_bytes > TAIL_BYTES


@dataclass
class CallOutcome:
    job_id: str
    state: str
    exit_code: int | None
    error_class: str | None
    acquisition: str | None
    pod: str | None
    stdout: Tail
    stderr: Tail
    duration_s: float
    timed_out: bool
    artifacts: list[tuple[int, str]] = field(default_factory=list)
    reason: str | None = None
    """Why a warmer sandbox was not used (the job's acquisition reason)."""
    via: str = "job"
    """`job`: a broker job of its own; `kernel`: a subprocess of the session's live kernel (job_id is the
    kernel job's, and there is no job log of this call to read back)."""
    full_stdout: str | None = None
    """The kernel path keeps all of stdout here (the file helper's answer line may be long)."""

    @classmethod
    def of_job(cls, job: JobInfo, stdout: Tail, stderr: Tail, duration_s: float, timed_out: bool,
               artifacts: list[tuple[int, str]]) -> CallOutcome:
        return cls(job_id=job.id, state=job.state, exit_code=job.exit_code, error_class=job.error_class,
                   acquisition=job.path, pod=job.acquisition[0].get("pod") if job.acquisition else None,
                   stdout=stdout, stderr=stderr, duration_s=duration_s, timed_out=timed_out, artifacts=artifacts,
                   reason=job.acquisition[0].get("reason") if job.acquisition else None)


def tail_of(data: bytes, total: int | None = None) -> Tail:
    return Tail(data[-TAIL_BYTES:].decode(errors="replace"), len(data) if total is None else total)


def last_line(data: bytes) -> str:
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


class PoolChoice:
    """The pool of the sessions' sandboxes: the one configured, else (asked once) the broker's `cpu` pool,
    its only pool, or its first pool without GPUs."""

    def __init__(self, pool: str | None) -> None:
        self.pool = pool

    async def resolve(self, client: AsyncCalls) -> str:
        if self.pool is None:
            self.pool = choose_pool(await client.pools())
        return self.pool


def choose_pool(views: list[dict[str, Any]]) -> str:
    names = [str(v.get("name")) for v in views]
    if "cpu" in names or not names:
        return "cpu"  # no pools at all: the broker's UnknownPool says so on the first call
    if len(names) == 1:
        return names[0]
    cpu_only = sorted(str(v.get("name")) for v in views if not v.get("gpus"))
    return cpu_only[0] if cpu_only else sorted(names)[0]


class Calls:
    """Runs jobs for one verified caller; `pool` and `queue` are where the session's sandbox lives."""

    def __init__(self, client: AsyncCalls, *, pool: str | None = "cpu", queue: str = "default", caller: str = "",
                 kernels: Kernels | None = None, choice: PoolChoice | None = None) -> None:
        self.client = client
        self.pool = pool
        self.choice = choice or PoolChoice(pool)
        self.queue = queue
        self.caller = caller
        self.kernels = kernels

    async def submit(self, argv: Sequence[str], session: str, *, timeout_s: float | None,
                     env: dict[str, str] | None = None, kernel: bool = False) -> JobInfo:
        # recycle=False: a conversation never runs on (and so retires) another live conversation's sandbox.
        extra: dict[str, Any] = {"kernel": True} if kernel else {}
        return await self.client.submit(list(argv), pool=await self.pool_name(), lease_tag=session, queue=self.queue,
                                        timeout_s=timeout_s, env=env or None, recycle=False, **extra)

    async def pool_name(self) -> str:
        return await self.choice.resolve(self.client)

    async def run(self, argv: Sequence[str], session: str, *, timeout_s: float,
                  env: dict[str, str] | None = None, progress: Progress | None = None) -> CallOutcome:
        """Run `argv` in the session's sandbox to its end (or its timeout) and collect its output."""
        live = self.kernels.live(self.caller, session) if self.kernels is not None else None
        if live is not None and self.kernels is not None:
            from broker.sandbox.kernel_io import KernelGone

            try:
                return await self._in_kernel(live, argv, timeout_s, env)
            except KernelGone:
                pass  # it ended while this call waited for it: the pod is free for a job again
        began = time.monotonic()
        job = await self.submit(argv, session, timeout_s=timeout_s, env=env)
        try:
            job, timed_out = await self._follow(job, began, timeout_s, progress)
        except BaseException:
            # The client cancelled the tool call (or the transport died): the job must not live on.
            with anyio.CancelScope(shield=True):
                await self._cancel_quietly(job.id)
            raise
        return await self.collect(job, began, timed_out)

    async def _follow(self, job: JobInfo, began: float, timeout_s: float,
                      progress: Progress | None) -> tuple[JobInfo, bool]:
        deadline = began + timeout_s + GRACE_S
        offset, last = 0, ""
        next_report = began + PROGRESS_EVERY_S
        while not job.terminal:
            now = time.monotonic()
            if now >= deadline:
                await self._cancel_quietly(job.id)
                job = await self.client.wait(job.id, timeout=30.0)
                return job, True
            wait = min(deadline, next_report) - now if progress is not None else deadline - now
            job = await self.client.get(job.id, wait_s=max(0.01, min(60.0, wait)))
            if progress is not None and not job.terminal and time.monotonic() >= next_report:
                data = await self.client.read_log(job.id, "combined", offset)
                offset += len(data)
                last = last_line(data) or last
                elapsed = time.monotonic() - began
                await progress(elapsed, timeout_s, f"{job.state.lower()} {elapsed:.0f}s" + (f": {last}" if last else ""))
                next_report = time.monotonic() + PROGRESS_EVERY_S
        return job, job.error_class == "Timeout"

    async def collect(self, job: JobInfo, began: float, timed_out: bool) -> CallOutcome:
        # Only the ends are kept as the logs stream by (the server may run inside the broker: `serve --mcp`);
        # the wrapper's artifact block closes stderr, so the end of stderr holds it.
        (out, out_bytes), (err, err_bytes) = await asyncio.gather(
            self._end_of(job.id, "stdout", TAIL_BYTES), self._end_of(job.id, "stderr", ERR_END_BYTES))
        text, artifacts = wrappers.split_artifacts(err.decode(errors="replace"))
        stderr = Tail(text.encode()[-TAIL_BYTES:].decode(errors="replace"),
                      err_bytes - (len(err) - len(text.encode())))
        return CallOutcome.of_job(job, tail_of(out, out_bytes), stderr, time.monotonic() - began, timed_out, artifacts)

    async def _end_of(self, job_id: str, stream: str, keep: int) -> tuple[bytes, int]:
        """The last `keep` bytes of a finished job's stream, and its length."""
        end, total = b"", 0
        async for chunk in self.client.stream_logs(job_id, stream, follow=False):
            end = (end + chunk)[-keep:]
            total += len(chunk)
        return end, total

    async def _in_kernel(self, live: Any, argv: Sequence[str], timeout_s: float,
                         env: dict[str, str] | None) -> CallOutcome:
        assert self.kernels is not None
        ex, res = await self.kernels.run_argv(live, list(argv), env, timeout_s, GRACE_S)
        if res is None:
            why = (f"{ex.error.get('ename')}: {ex.error.get('evalue')}" if ex.error else "no answer from the kernel")
            return CallOutcome(job_id=live.job.id, state="FAILED", exit_code=None,
                               error_class="Timeout" if ex.timed_out else "KernelError", acquisition="warm",
                               pod=_pod(live.job), stdout=tail_of(b""), stderr=tail_of(why.encode()),
                               duration_s=ex.duration_s, timed_out=ex.timed_out, via="kernel")
        text, artifacts = wrappers.split_artifacts(res["stderr"])
        rc = res["exit_code"]
        timed_out = bool(res["timed_out"])
        state = "SUCCEEDED" if rc == 0 and not timed_out else "FAILED"
        error_class = "Timeout" if timed_out else None if rc == 0 else "NonZeroExit"
        stdout = Tail(res["stdout"][-TAIL_BYTES:], res["stdout_bytes"])
        stderr = Tail(text[-TAIL_BYTES:], len(text.encode()))
        return CallOutcome(job_id=live.job.id, state=state, exit_code=None if timed_out else rc, error_class=error_class,
                           acquisition="warm", pod=_pod(live.job), stdout=stdout, stderr=stderr,
                           duration_s=res["duration_s"], timed_out=timed_out, artifacts=artifacts[:wrappers.MAX_ARTIFACTS],
                           via="kernel", full_stdout=res["stdout"])

    async def _cancel_quietly(self, job_id: str) -> None:
        try:
            await self.client.cancel(job_id)
        except Exception:  # noqa: BLE001 - best effort: the job may have ended, the broker may be gone
            pass

    async def helper(self, op: str, args: dict[str, Any], session: str, *, timeout_s: float = 120.0,
                     progress: Progress | None = None) -> tuple[dict[str, Any], CallOutcome]:
        """Run one file-helper operation; its JSON answer and the call's outcome."""
        outcome = await self.run(wrappers.files_op(op, args), session, timeout_s=timeout_s, progress=progress)
        if outcome.full_stdout is not None:
            stdout = outcome.full_stdout
        elif outcome.stdout.truncated:
            stdout = (await self.client.read_log(outcome.job_id, "stdout")).decode(errors="replace")
        else:
            stdout = outcome.stdout.text
        answer = wrappers.parse_result(stdout)
        if answer is None:
            answer = {"error": "HelperFailed",
                      "message": f"the sandbox helper ended {outcome.state} ({outcome.error_class}) without "
                                 f"an answer: {outcome.stderr.text[-500:]}"}
        return answer, outcome


def _pod(job: JobInfo) -> str | None:
    return job.acquisition[0].get("pod") if job.acquisition else None
