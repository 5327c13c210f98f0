"""One tool call as one broker job in the session's sandbox: submit, follow with progress, collect.

A timeout is a result (`timed_out: true` with the partial output), not an exception; a cancelled tool
call cancels its job before the cancellation propagates, so nothing keeps running in the sandbox.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from broker.client import AsyncClient, JobInfo
from mcp_server import sandbox_code

TAIL_BYTES = 8 * 1024
"""Inline output per stream; the full log stays readable as a resource and through job_status."""
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
    job: JobInfo
    stdout: Tail
    stderr: Tail
    duration_s: float
    timed_out: bool
    artifacts: list[tuple[int, str]] = field(default_factory=list)

    @property
    def acquisition(self) -> str | None:
        return self.job.path


def tail_of(data: bytes) -> Tail:
    return Tail(data[-TAIL_BYTES:].decode(errors="replace"), len(data))


def last_line(data: bytes) -> str:
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


class Calls:
    """Runs jobs for one verified caller; `pool` and `queue` are where the session's sandbox lives."""

    def __init__(self, client: AsyncClient, *, pool: str = "cpu", queue: str = "default") -> None:
        self.client = client
        self.pool = pool
        self.queue = queue

    async def submit(self, argv: Sequence[str], session: str, *, timeout_s: float | None,
                     env: dict[str, str] | None = None) -> JobInfo:
        # recycle=False: a conversation never runs on (and so retires) another live conversation's sandbox.
        return await self.client.submit(list(argv), pool=self.pool, lease_tag=session, queue=self.queue,
                                        timeout_s=timeout_s, env=env or None, recycle=False)

    async def run(self, argv: Sequence[str], session: str, *, timeout_s: float,
                  env: dict[str, str] | None = None, progress: Progress | None = None) -> CallOutcome:
        """Run `argv` in the session's sandbox to its end (or its timeout) and collect its output."""
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
        out, err = await asyncio.gather(self.client.read_log(job.id, "stdout"), self.client.read_log(job.id, "stderr"))
        text, artifacts = sandbox_code.split_artifacts(err.decode(errors="replace"))
        stderr = text.encode()
        return CallOutcome(job=job, stdout=tail_of(out), stderr=tail_of(stderr), duration_s=time.monotonic() - began,
                           timed_out=timed_out, artifacts=artifacts)

    async def _cancel_quietly(self, job_id: str) -> None:
        try:
            await self.client.cancel(job_id)
        except Exception:  # noqa: BLE001 - best effort: the job may have ended, the broker may be gone
            pass

    async def helper(self, op: str, args: dict[str, Any], session: str, *, timeout_s: float = 120.0,
                     progress: Progress | None = None) -> tuple[dict[str, Any], CallOutcome]:
        """Run one file-helper operation; its JSON answer and the call's outcome."""
        outcome = await self.run(sandbox_code.files_op(op, args), session, timeout_s=timeout_s, progress=progress)
        stdout = (await self.client.read_log(outcome.job.id, "stdout")).decode(errors="replace") \
            if outcome.stdout.truncated else outcome.stdout.text
        answer = sandbox_code.parse_result(stdout)
        if answer is None:
            answer = {"error": "HelperFailed",
                      "message": f"the sandbox helper ended {outcome.job.state} ({outcome.job.error_class}) without "
                                 f"an answer: {outcome.stderr.text[-500:]}"}
        return answer, outcome
