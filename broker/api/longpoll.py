"""A job's long poll ends with its client: a wait whose caller went away stops waiting, instead of holding a task,
a connection and a place among the caller's open requests (broker.api.openrequests) until its `wait_s` ends.

The first QUICK_S of a wait run without watching the client (most jobs a caller waits on end sooner, and the
watch costs a task and a receive); after it, the wait races the client's disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request

from broker.jobs import Job

QUICK_S = 1.0
"""Seconds of a wait that run without watching the client."""

T = TypeVar("T")


async def wait_job(request: Request, wait: Callable[[float], Awaitable[Job]], wait_s: float) -> Job | None:
    """`wait(wait_s)`'s job, as a long poll: None once the client disconnected (nobody reads the answer)."""
    job = await wait(min(wait_s, QUICK_S))
    if job.terminal or wait_s <= QUICK_S:
        return job
    return await while_connected(request, wait(wait_s - QUICK_S))


async def while_connected(request: Request, waiting: Awaitable[T]) -> T | None:
    """`waiting`'s result; None, and `waiting` cancelled, once the client disconnected first."""
    task = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            pending.cancel()
    return task.result() if task.done() and not task.cancelled() else None


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone: after the body, the server's next message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
