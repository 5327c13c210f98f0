"""The sync loops of fan-out (`Client.submit_many`, `as_completed`, `map`), over the narrow `JobsHttp`
protocol rather than `Client` itself, so this module never imports the client that calls it. What the loops
send and how they read the watch stream is in broker.fanout; the async twins are in broker.fanout_async.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import httpx

from broker.client_core import JobInfo
from broker.errors import FirepoolError, StreamBroken
from broker.fanout import (
    BATCH_PATH,
    WATCH_PATH,
    Item,
    Watch,
    batch_error,
    batch_items,
    batches,
    finished_in_order,
    job_ids,
    jobs_of,
    watch_timeout,
)
from broker.fanout_calls import LOG_TAIL_CHARS, CallFailed, call_fields, call_spec, result_line
from broker.retrying import RetryPolicy


class JobsHttp(Protocol):
    """What the loops use of a sync client."""

    retry: RetryPolicy
    _sleep: Callable[[float], None]

    def _call(self, method: str, path: str, policy: RetryPolicy | None = None, **kw: Any) -> httpx.Response: ...

    def _stream(self, method: str, path: str, policy: RetryPolicy | None = None,
                **kw: Any) -> AbstractContextManager[httpx.Response]: ...

    def package(self, path: str | os.PathLike[str], excludes: Sequence[str] = ()) -> str: ...

    def read_log(self, job_id: str, stream: str = "combined", offset: int = 0) -> bytes: ...


def submit_many(http: JobsHttp, items: Iterable[Item], pool: str, fields: Mapping[str, Any]) -> list[JobInfo]:
    """Every item as a job, MAX_BATCH to a request; see `Client.submit_many`."""
    jobs: list[JobInfo] = []
    for offset, chunk in batches(batch_items(items, pool, fields)):
        try:
            answer = http._call("POST", BATCH_PATH, json={"jobs": chunk})
        except FirepoolError as exc:
            raise batch_error(exc, offset) from None
        jobs += jobs_of(answer.json())
    return jobs


def as_completed(http: JobsHttp, jobs_or_ids: Iterable[JobInfo | str],
                 timeout: float | None = None) -> Iterator[JobInfo]:
    """Each job once, as it ends; see `Client.as_completed`."""
    watch = Watch(job_ids(jobs_or_ids), timeout)
    while watch.pending:
        body = watch.body()
        try:
            with http._stream("POST", WATCH_PATH, json=body, timeout=watch_timeout(body)) as response:
                for line in response.iter_lines():
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
            http._sleep(http.retry.delay(watch.breaks - 1))


def map_jobs(http: JobsHttp, items: Iterable[Item], pool: str, ordered: bool, timeout: float | None,
             fields: Mapping[str, Any]) -> Iterator[JobInfo]:
    """Submits now (one request per MAX_BATCH items); the iterator follows the jobs."""
    return _follow(http, submit_many(http, items, pool, fields), ordered, timeout)


def map_calls(http: JobsHttp, fn: Callable[[Any], Any], inputs: Iterable[Any], pool: str, ordered: bool,
              timeout: float | None, fields: Mapping[str, Any]) -> Iterator[Any]:
    """`fn(input)` as one job per input, its module packaged once (broker.fanout_calls); submits now."""
    spec = call_spec(fn)
    commands = [spec.command(value) for value in inputs]
    jobs = submit_many(http, commands, pool, {**call_fields(fields), "package": http.package(spec.root)})
    return _results(http, _follow(http, jobs, ordered, timeout), {job.id: i for i, job in enumerate(jobs)})


def _follow(http: JobsHttp, jobs: list[JobInfo], ordered: bool, timeout: float | None) -> Iterator[JobInfo]:
    finished = as_completed(http, jobs, timeout)
    return finished_in_order([j.id for j in jobs], finished) if ordered else finished


def _results(http: JobsHttp, jobs: Iterator[JobInfo], index: dict[str, int]) -> Iterator[Any]:
    for job in jobs:
        stdout = http.read_log(job.id, "stdout").decode(errors="replace") if job.state == "SUCCEEDED" else ""
        text = result_line(job, stdout)
        if text is None:
            tail = http.read_log(job.id).decode(errors="replace")[-LOG_TAIL_CHARS:]
            raise CallFailed(job, index[job.id], tail)
        yield json.loads(text)
