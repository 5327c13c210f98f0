"""The asynchronous SDK: `AsyncClient`, the same methods as `broker.client.Client`, awaited."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, overload
from urllib.parse import quote

import httpx

from broker import fanout_async, packaging
from broker.client_core import (
    KERNEL_RETRY,
    RUN_WAIT,
    JobInfo,
    job_body,
    kernel_wait,
    port_url,
    raise_for,
    stream_broken,
    unreachable,
)
from broker.errors import KernelNotReady
from broker.fanout import Item, map_args
from broker.locations import Brokers, discover
from broker.retrying import RetryPolicy, Tries

if TYPE_CHECKING:
    from broker.sandbox.handle import AsyncSandbox


class AsyncClient:
    """Asynchronous SDK (same methods as `Client`, awaited)."""

    def __init__(self, url: str | Sequence[str] | None = None, token: str | None = None, *,
                 state_dir: str | os.PathLike[str] | None = None, timeout: float = 330.0,
                 transport: httpx.AsyncBaseTransport | None = None, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.found = discover(url, token, state_dir)
        self.brokers = Brokers(self.found.urls)
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self.found.token}"}, timeout=timeout,
                                       transport=transport)

    @property
    def url(self) -> str:
        """As `Client.url`: the broker that answered last."""
        return self.brokers.current

    @property
    def urls(self) -> tuple[str, ...]:
        """As `Client.urls`: all its brokers, the current one first."""
        return self.brokers.ordered()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, policy: RetryPolicy | None = None, *, stream: bool = False,
                    **kw: Any) -> httpx.Response:
        """As `Client._send`, awaited (the same `Tries`: one rule for moving between brokers)."""
        tries = Tries(self.brokers, policy or self.retry)
        while True:
            request = self._http.build_request(method, tries.url + path, **kw)
            try:
                response = await self._http.send(request, stream=stream)
                if stream and response.status_code >= 400:
                    await response.aread()
            except httpx.TransportError as exc:
                wait = tries.after_error(exc, request)
                if wait is None:
                    raise unreachable(self.found, exc) from exc
            else:
                wait = tries.after_response(response)
                if wait is None:
                    return response
                await response.aclose()
            if wait:
                await self._sleep(wait)

    @contextlib.asynccontextmanager
    async def _stream(self, method: str, path: str, policy: RetryPolicy | None = None,
                      **kw: Any) -> AsyncIterator[httpx.Response]:
        """As `Client._stream`: opened with fail-over, never resumed (StreamBroken when it breaks off)."""
        response = await self._send(method, path, policy, stream=True, **kw)
        try:
            raise_for(response)
            yield response
        except httpx.TransportError as exc:
            raise stream_broken(response, exc) from exc
        finally:
            await response.aclose()

    async def _call(self, method: str, path: str, policy: RetryPolicy | None = None, **kw: Any) -> httpx.Response:
        response = await self._send(method, path, policy, **kw)
        raise_for(response)
        return response

    async def package(self, path: str | os.PathLike[str], excludes: Sequence[str] = ()) -> str:
        """Zip a directory deterministically, upload it unless the broker has it, and return its digest."""
        data, digest = await asyncio.to_thread(packaging.build, path, excludes)
        head = await self._send("HEAD", f"/v1/packages/{digest}")
        if head.status_code == 200:
            return digest
        await self._call("PUT", f"/v1/packages/{digest}", content=data, headers={"Content-Type": "application/zip"})
        return digest

    async def submit(self, command: Sequence[str], pool: str = "cpu", *, topology: str | None = None,
                     **fields: Any) -> JobInfo:
        response = await self._call("POST", "/v1/jobs", json=job_body(command, pool, {**fields, "topology": topology}))
        return JobInfo.from_json(response.json())

    async def submit_many(self, items: Iterable[Item], pool: str = "cpu", **fields: Any) -> list[JobInfo]:
        """As `Client.submit_many`."""
        return await fanout_async.submit_many(self, items, pool, fields)

    def as_completed(self, jobs_or_ids: Iterable[JobInfo | str],
                     timeout: float | None = None) -> AsyncIterator[JobInfo]:
        """As `Client.as_completed`: `async for job in fp.as_completed(jobs)`."""
        return fanout_async.as_completed(self, jobs_or_ids, timeout)

    @overload
    def map(self, items: Iterable[Item], pool: str = "cpu", /, *, ordered: bool = True,
            timeout: float | None = None, **fields: Any) -> AsyncIterator[JobInfo]: ...

    @overload
    def map(self, fn: Callable[[Any], Any], inputs: Iterable[Any], pool: str = "cpu", /, *, ordered: bool = True,
            timeout: float | None = None, **fields: Any) -> AsyncIterator[Any]: ...

    def map(self, items: Any, /, *args: Any, ordered: bool = True, timeout: float | None = None,
            **fields: Any) -> AsyncIterator[Any]:
        """As `Client.map`: `async for job in fp.map(items)`; the jobs are submitted when the iteration starts."""
        fn, inputs, pool, fields = map_args(items, args, fields)
        if fn is not None:
            return fanout_async.map_calls(self, fn, inputs, pool, ordered, timeout, fields)
        return fanout_async.map_jobs(self, inputs, pool, ordered, timeout, fields)

    async def get(self, job_id: str, wait_s: float = 0.0) -> JobInfo:
        params = {"wait_s": wait_s} if wait_s else None
        return JobInfo.from_json((await self._call("GET", f"/v1/jobs/{job_id}", params=params)).json())

    async def kernel(self, job_id: str, timeout: float | None = 120.0) -> dict[str, Any]:
        """As `Client.kernel`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                response = await self._call("GET", f"/v1/jobs/{job_id}/kernel", KERNEL_RETRY,
                                            params={"wait_s": kernel_wait(deadline)})
            except KernelNotReady:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                continue
            return dict(response.json()["connection"])

    async def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            job = await self.get(job_id, wait_s=left)
            if job.terminal or (deadline is not None and time.monotonic() >= deadline):
                return job

    async def run(self, command: Sequence[str], pool: str = "cpu", **fields: Any) -> JobInfo:
        body = job_body(command, pool, fields)
        job = JobInfo.from_json((await self._call("POST", "/v1/jobs", json=body, params=RUN_WAIT)).json())
        return job if job.terminal else await self.wait(job.id)

    async def cancel(self, job_id: str) -> JobInfo:
        return JobInfo.from_json((await self._call("POST", f"/v1/jobs/{job_id}/cancel")).json())

    async def signal(self, job_id: str, signal: str) -> JobInfo:
        response = await self._call("POST", f"/v1/jobs/{job_id}/signal", json={"signal": signal})
        return JobInfo.from_json(response.json())

    async def logs(self, job_id: str, stream: str = "combined", follow: bool = False) -> str:
        chunks = [c async for c in self.stream_logs(job_id, stream, follow)]
        return b"".join(chunks).decode(errors="replace")

    async def stream_logs(self, job_id: str, stream: str = "combined", follow: bool = True) -> AsyncIterator[bytes]:
        params = {"stream": stream, "follow": "true" if follow else "false"}
        async with self._stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as response:
            async for chunk in response.aiter_bytes():
                yield chunk

    async def jobs(self, state: str | None = None, limit: int = 100) -> list[JobInfo]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        response = await self._call("GET", "/v1/jobs", params=params)
        return [JobInfo.from_json(j) for j in response.json()["jobs"]]

    async def events(self, since: str | int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Fleet events oldest first (all of them for an admin token, the caller's own otherwise)."""
        params: dict[str, Any] = {"limit": limit}
        if since is not None:
            params["since"] = str(since)
        return list((await self._call("GET", "/v1/events", params=params)).json()["events"])

    async def quarantine(self) -> list[dict[str, Any]]:
        """Quarantined and failing devices and nodes (admin tokens only)."""
        return list((await self._call("GET", "/v1/admin/quarantine")).json()["quarantine"])

    async def release_quarantine(self, key: str) -> dict[str, Any]:
        return dict((await self._call("POST", f"/v1/admin/quarantine/{quote(key, safe='')}/release")).json())

    async def pools(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/v1/pools")).json()["pools"])

    async def pods(self, pool: str | None = None) -> list[dict[str, Any]]:
        response = await self._call("GET", "/v1/pods", params={"pool": pool} if pool else None)
        return list(response.json()["pods"])

    async def whoami(self) -> str:
        return str((await self._call("GET", "/v1/whoami")).json()["caller"])

    async def end_session(self, tag: str, queue: str = "default") -> dict[str, Any]:
        response = await self._call("DELETE", f"/v1/sessions/{quote(tag, safe='')}", params={"queue": queue})
        return dict(response.json())

    def port_url(self, tag: str, port: int) -> str:
        return port_url(self.url, tag, port)

    def sandbox(self, tag: str, *, pool: str = "cpu", queue: str = "default", keep: bool = False) -> AsyncSandbox:
        """As `Client.sandbox`: `async with fp.sandbox(tag) as sb`."""
        from broker.sandbox.handle import (
            AsyncSandbox,  # the sandbox is built on this client: it imports this module
        )

        return AsyncSandbox(self, tag, pool=pool, queue=queue, keep=keep)

    async def port_link(self, tag: str, port: int, ttl_s: float | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"port": port} if ttl_s is None else {"port": port, "ttl_s": ttl_s}
        response = await self._call("POST", f"/v1/sessions/{quote(tag, safe='')}/port-links", json=body)
        return dict(response.json())

    async def read_log(self, job_id: str, stream: str = "combined", offset: int = 0) -> bytes:
        """What the job's log holds from `offset` now, without following."""
        params = {"stream": stream, "follow": "false", "offset": offset}
        return (await self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)).content
