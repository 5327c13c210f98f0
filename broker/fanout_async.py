"""The async loops of fan-out (`AsyncClient.submit_many`, `as_completed`, `map`): broker.fanout_blocking's,
awaited, over the narrow `AsyncJobsHttp` protocol (this module never imports the client that calls it)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import httpx

from broker.client_core import JobInfo
from broker.errors import FirepoolError, StreamBroken
from broker.fanout import (
    BATCH_PATH,
    WATCH_PATH,
    InOrder,
    Item,
    Watch,
    batch_error,
    batch_items,
    batches,
    job_ids,
    jobs_of,
    watch_timeout,
)
from broker.fanout_calls import LOG_TAIL_CHARS, CallFailed, call_fields, call_spec, result_line
from broker.retrying import RetryPolicy


class AsyncJobsHttp(Protocol):
    """What the loops use of an async client."""

    retry: RetryPolicy
    _sleep: Callable[[float], Awaitable[None]]

    async def _call(self, method: str, path: str, policy: RetryPolicy | None = None,
                    **kw: Any) -> httpx.Response: ...

    def _stream(self, method: str, path: str, policy: RetryPolicy | None = None,
                **kw: Any) -> AbstractAsyncContextManager[httpx.Response]: ...

    async def package(self, path: str | os.PathLike[str], excludes: Sequence[str] = ()) -> str: ...

    async def read_log(self, job_id: str, stream: str = "combined", offset: int = 0) -> bytes: ...


async def submit_many(http: AsyncJobsHttp, items: Iterable[Item], pool: str,
                      fields: Mapping[str, Any]) -> list[JobInfo]:
    """As `fanout_blocking.submit_many`."""
    jobs: list[JobInfo] = []
    for offset, chunk in batches(batch_items(items, pool, fields)):
        try:
            answer = await http._call("POST", BATCH_PATH, json={"jobs": chunk})
        except FirepoolError as exc:
            raise batch_error(exc, offset) from None
        jobs += jobs_of(answer.json())
    return jobs


async def as_completed(http: AsyncJobsHttp, jobs_or_ids: Iterable[JobInfo | str],
                       timeout: float | None = None) -> AsyncIterator[JobInfo]:
    """As `fanout_blocking.as_completed`."""
    watch = Watch(job_ids(jobs_or_ids), timeout)
    while watch.pending:
        body = watch.body()
        try:
            async with http._stream("POST", WATCH_PATH, json=body, timeout=watch_timeout(body)) as response:
                async for line in response.aiter_lines():
                    job = watch.feed(line)
                    if job is not None:
                        yield job
                    elif watch.ended:
                        break
            if not watch.ended:
                watch.broken()
        except StreamBroken as exc:
            watch.broken(exc)
        if watch.breaks:
            await http._sleep(http.retry.delay(watch.breaks - 1))


async def map_jobs(http: AsyncJobsHttp, items: Iterable[Item], pool: str, ordered: bool, timeout: float | None,
                   fields: Mapping[str, Any]) -> AsyncIterator[JobInfo]:
    """As `fanout_blocking.map_jobs`, but the jobs are submitted when the iteration starts."""
    jobs = await submit_many(http, items, pool, fields)
    async for job in _follow(http, jobs, ordered, timeout):
        yield job


async def map_calls(http: AsyncJobsHttp, fn: Callable[[Any], Any], inputs: Iterable[Any], pool: str,
                    ordered: bool, timeout: float | None, fields: Mapping[str, Any]) -> AsyncIterator[Any]:
    """As `fanout_blocking.map_calls`, submitted when the iteration starts."""
    spec = call_spec(fn)
    commands = [spec.command(value) for value in inputs]
    fields = {**call_fields(fields), "package": await http.package(spec.root)}
    jobs = await submit_many(http, commands, pool, fields)
    index = {job.id: i for i, job in enumerate(jobs)}
    async for job in _follow(http, jobs, ordered, timeout):
        stdout = (await http.read_log(job.id, "stdout")).decode(errors="replace") if job.state == "SUCCEEDED" else ""
        text = result_line(job, stdout)
        if text is None:
            tail = (await http.read_log(job.id)).decode(errors="replace")[-LOG_TAIL_CHARS:]
            raise CallFailed(job, index[job.id], tail)
        yield json.loads(text)


async def _follow(http: AsyncJobsHttp, jobs: list[JobInfo], ordered: bool,
                  timeout: float | None) -> AsyncIterator[JobInfo]:
    order = InOrder([j.id for j in jobs])
    async for job in as_completed(http, jobs, timeout):
        for due in order.add(job) if ordered else [job]:
            yield due
