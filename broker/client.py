"""The Python SDK: `Client` (sync) and `AsyncClient` over httpx, with the broker's typed errors.

    from broker.client import Client
    with Client() as fp:                      # FIREPOOL_URL / FIREPOOL_TOKEN, or the local broker
        job = fp.run(["python3", "-c", "print(1)"], pool="cpu", lease_tag="my-session")
        print(job.state, job.exit_code, job.path, fp.logs(job.id))

Errors come back as the classes of `broker.errors` (same names as the wire `class`), so callers
switch on `UnknownPool`, `Unauthorized`, `NotFound`, ... instead of status codes.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from broker import packaging
from broker.errors import FirepoolError, Unavailable, all_error_classes
from broker.locations import Discovery, discover
from broker.retrying import RetryPolicy, retry_after, should_retry_error, should_retry_response

_ERRORS = all_error_classes()
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class JobInfo:
    """A job as the broker reported it; `raw` has every field."""

    id: str
    state: str
    caller: str
    pool: str
    exit_code: int | None
    error_class: str | None
    acquisition: list[dict[str, Any]]
    timings: dict[str, float]
    attempts: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def path(self) -> str | None:
        """Rank 0's acquisition path (warm, recycled, standby, new, custom_image)."""
        return self.acquisition[0]["path"] if self.acquisition else None

    @property
    def start_latency(self) -> float | None:
        """Submit -> first instruction, seconds."""
        t = self.timings
        if "first_instruction_at" in t and "submitted_at" in t:
            return t["first_instruction_at"] - t["submitted_at"]
        return None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobInfo:
        return cls(id=data["id"], state=data["state"], caller=data.get("caller", ""), pool=data.get("pool", ""),
                   exit_code=data.get("exit_code"), error_class=data.get("error_class"),
                   acquisition=data.get("acquisition", []), timings=data.get("timings", {}),
                   attempts=data.get("attempts", []), raw=data)


def _unreachable(found: Discovery, exc: httpx.TransportError) -> Unavailable:
    """The broker did not answer: say where we looked and, when we guessed, what to do."""
    why = str(exc) or type(exc).__name__
    hint = f"; {found.hint}" if found.hint else ""
    return Unavailable(f"cannot reach the broker at {found.url} ({why}){hint}", {"url": found.url})


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()["error"]
        cls = _ERRORS.get(body.get("class", ""), FirepoolError)
        err = cls(body.get("message", response.text), body.get("details") or {})
    except (ValueError, KeyError, TypeError):
        err = FirepoolError(f"HTTP {response.status_code}: {response.text[:200]}")
    err.status = response.status_code
    raise err


RUN_WAIT = {"wait_s": 60.0}
"""`run` submits and waits in one request; a job still running after it is waited for with GET, as `wait` does.
A broker that predates `wait_s` on POST ignores it and answers at once: `run` then waits with GET."""


def _job_body(command: Sequence[str], pool: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The submit request; it always carries an idempotency key, so a retried submit cannot duplicate."""
    body: dict[str, Any] = {"pool": pool, "command": list(command)}
    body.update({k: v for k, v in fields.items() if v is not None})
    body.setdefault("idempotency_key", f"sdk-{uuid.uuid4().hex}")
    return body


class Client:
    """Synchronous SDK."""

    def __init__(self, url: str | None = None, token: str | None = None, *, state_dir: str | os.PathLike[str] | None = None,
                 timeout: float = 330.0, transport: httpx.BaseTransport | None = None,
                 retry: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.found = discover(url, token, state_dir)
        self.url = self.found.url
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.found.token}"},
                                  timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request, retried per `self.retry` (see broker.retrying); raises Unavailable when unreachable."""
        request = self._http.build_request(method, path, **kw)
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            try:
                response = self._http.send(request)
            except httpx.TransportError as exc:
                if last or not should_retry_error(exc, request):
                    raise _unreachable(self.found, exc) from exc
                self._sleep(self.retry.delay(attempt))
                continue
            if last or not should_retry_response(response):
                return response
            response.close()
            self._sleep(self.retry.delay(attempt, retry_after(response)))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        response = self._send(method, path, **kw)
        _raise_for(response)
        return response

    def package(self, path: str | os.PathLike[str], excludes: Sequence[str] = ()) -> str:
        """Zip a directory deterministically, upload it unless the broker has it, and return its digest."""
        data, digest = packaging.build(path, excludes)
        head = self._send("HEAD", f"/v1/packages/{digest}")
        if head.status_code == 200:
            return digest
        self._call("PUT", f"/v1/packages/{digest}", content=data, headers={"Content-Type": "application/zip"})
        return digest

    def submit(self, command: Sequence[str], pool: str = "cpu", *, topology: str | None = None,
               **fields: Any) -> JobInfo:
        """Queue a job; `fields` are the REST request fields (lease_tag, env, pods, timeout_s, ...). `topology`
        (`node` | `domain` | `any`) keeps a gang's pods on one node or in one domain; None: the pool's."""
        body = _job_body(command, pool, {**fields, "topology": topology})
        return JobInfo.from_json(self._call("POST", "/v1/jobs", json=body).json())

    def get(self, job_id: str, wait_s: float = 0.0) -> JobInfo:
        params = {"wait_s": wait_s} if wait_s else None
        return JobInfo.from_json(self._call("GET", f"/v1/jobs/{job_id}", params=params).json())

    def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        """Block until the job is terminal (or `timeout` passes; then the job as it stands)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            job = self.get(job_id, wait_s=left)
            if job.terminal or (deadline is not None and time.monotonic() >= deadline):
                return job

    def run(self, command: Sequence[str], pool: str = "cpu", **fields: Any) -> JobInfo:
        """submit + wait: one request for a job that ends within a minute (POST /v1/jobs?wait_s=)."""
        body = _job_body(command, pool, fields)
        job = JobInfo.from_json(self._call("POST", "/v1/jobs", json=body, params=RUN_WAIT).json())
        return job if job.terminal else self.wait(job.id)

    def cancel(self, job_id: str) -> JobInfo:
        return JobInfo.from_json(self._call("POST", f"/v1/jobs/{job_id}/cancel").json())

    def signal(self, job_id: str, signal: str) -> JobInfo:
        """INT, TERM, HUP, USR1, USR2, QUIT or KILL to the running attempt (Conflict when none runs)."""
        return JobInfo.from_json(self._call("POST", f"/v1/jobs/{job_id}/signal", json={"signal": signal}).json())

    def jobs(self, state: str | None = None, limit: int = 100) -> list[JobInfo]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        return [JobInfo.from_json(j) for j in self._call("GET", "/v1/jobs", params=params).json()["jobs"]]

    def logs(self, job_id: str, stream: str = "combined", follow: bool = False) -> str:
        return b"".join(self.stream_logs(job_id, stream, follow)).decode(errors="replace")

    def stream_logs(self, job_id: str, stream: str = "combined", follow: bool = True) -> Iterator[bytes]:
        params = {"stream": stream, "follow": "true" if follow else "false"}
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                yield from response.iter_bytes()
        except httpx.TransportError as exc:
            raise _unreachable(self.found, exc) from exc

    def pools(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/pools").json()["pools"])

    def events(self, since: str | int | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Fleet events oldest first (all of them for an admin token, the caller's own otherwise)."""
        params: dict[str, Any] = {"limit": limit}
        if since is not None:
            params["since"] = str(since)
        return list(self._call("GET", "/v1/events", params=params).json()["events"])

    def pods(self, pool: str | None = None) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/pods", params={"pool": pool} if pool else None).json()["pods"])

    def quarantine(self) -> list[dict[str, Any]]:
        """Quarantined and failing devices and nodes (admin tokens only)."""
        return list(self._call("GET", "/v1/admin/quarantine").json()["quarantine"])

    def release_quarantine(self, key: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/admin/quarantine/{quote(key, safe='')}/release").json())

    def whoami(self) -> str:
        return str(self._call("GET", "/v1/whoami").json()["caller"])

    def end_session(self, tag: str, queue: str = "default") -> dict[str, Any]:
        """Retire the caller's sandbox(es) of session `tag` now (running jobs of it are cancelled)."""
        return dict(self._call("DELETE", f"/v1/sessions/{quote(tag, safe='')}", params={"queue": queue}).json())


class AsyncClient:
    """Asynchronous SDK (same methods as `Client`, awaited)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, state_dir: str | os.PathLike[str] | None = None,
                 timeout: float = 330.0, transport: httpx.AsyncBaseTransport | None = None,
                 retry: RetryPolicy | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.found = discover(url, token, state_dir)
        self.url = self.found.url
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._http = httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {self.found.token}"},
                                       timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request, retried per `self.retry` (see broker.retrying); raises Unavailable when unreachable."""
        request = self._http.build_request(method, path, **kw)
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            try:
                response = await self._http.send(request)
            except httpx.TransportError as exc:
                if last or not should_retry_error(exc, request):
                    raise _unreachable(self.found, exc) from exc
                await self._sleep(self.retry.delay(attempt))
                continue
            if last or not should_retry_response(response):
                return response
            await response.aclose()
            await self._sleep(self.retry.delay(attempt, retry_after(response)))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        response = await self._send(method, path, **kw)
        _raise_for(response)
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
        response = await self._call("POST", "/v1/jobs", json=_job_body(command, pool, {**fields, "topology": topology}))
        return JobInfo.from_json(response.json())

    async def get(self, job_id: str, wait_s: float = 0.0) -> JobInfo:
        params = {"wait_s": wait_s} if wait_s else None
        return JobInfo.from_json((await self._call("GET", f"/v1/jobs/{job_id}", params=params)).json())

    async def wait(self, job_id: str, timeout: float | None = None) -> JobInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 60.0 if deadline is None else max(0.0, min(60.0, deadline - time.monotonic()))
            job = await self.get(job_id, wait_s=left)
            if job.terminal or (deadline is not None and time.monotonic() >= deadline):
                return job

    async def run(self, command: Sequence[str], pool: str = "cpu", **fields: Any) -> JobInfo:
        body = _job_body(command, pool, fields)
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
        try:
            async with self._http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response)
                async for chunk in response.aiter_bytes():
                    yield chunk
        except httpx.TransportError as exc:
            raise _unreachable(self.found, exc) from exc

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

    async def read_log(self, job_id: str, stream: str = "combined", offset: int = 0) -> bytes:
        """What the job's log holds from `offset` now, without following."""
        params = {"stream": stream, "follow": "false", "offset": offset}
        return (await self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)).content
