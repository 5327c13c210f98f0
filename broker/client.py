"""The Python SDK: `Client` (sync) and `AsyncClient` over httpx, with the broker's typed errors.

    from broker.client import Client
    with Client() as fp:                      # FIREPOOL_URL / FIREPOOL_TOKEN, or the local broker
        job = fp.run(["python3", "-c", "print(1)"], pool="cpu", lease_tag="my-session")
        print(job.state, job.exit_code, job.path, fp.logs(job.id))

Errors come back as the classes of `broker.errors` (same names as the wire `class`), so callers
switch on `UnknownPool`, `Unauthorized`, `NotFound`, ... instead of status codes.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload
from urllib.parse import quote

import httpx

from broker import fanout_blocking, packaging
from broker.aclient import AsyncClient
from broker.client_core import (
    KERNEL_RETRY,
    RUN_WAIT,
    TERMINAL,
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
    from broker.sandbox.blocking import Sandbox

__all__ = ["TERMINAL", "AsyncClient", "Client", "JobInfo", "port_url"]


class Client:
    """Synchronous SDK."""

    def __init__(self, url: str | Sequence[str] | None = None, token: str | None = None, *,
                 state_dir: str | os.PathLike[str] | None = None, timeout: float = 330.0,
                 transport: httpx.BaseTransport | None = None, retry: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.found = discover(url, token, state_dir)
        self.brokers = Brokers(self.found.urls)
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._http = httpx.Client(headers={"Authorization": f"Bearer {self.found.token}"}, timeout=timeout,
                                  transport=transport)

    @property
    def url(self) -> str:
        """The broker this client talks to now: the one that answered last (of `FIREPOOL_URL`'s list)."""
        return self.brokers.current

    @property
    def urls(self) -> tuple[str, ...]:
        """All its brokers, the current one first (a client built from this one gets them)."""
        return self.brokers.ordered()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, policy: RetryPolicy | None = None, *, stream: bool = False,
              **kw: Any) -> httpx.Response:
        """One request, retried per `policy` or `self.retry` and moved to another broker when one does not
        serve (broker.retrying); raises Unavailable when unreachable. `stream`: the body is left unread
        (an error's is read)."""
        tries = Tries(self.brokers, policy or self.retry)
        while True:
            request = self._http.build_request(method, tries.url + path, **kw)
            try:
                response = self._http.send(request, stream=stream)
                if stream and response.status_code >= 400:
                    response.read()
            except httpx.TransportError as exc:
                wait = tries.after_error(exc, request)
                if wait is None:
                    raise unreachable(self.found, exc) from exc
            else:
                wait = tries.after_response(response)
                if wait is None:
                    return response
                response.close()
            if wait:
                self._sleep(wait)

    @contextlib.contextmanager
    def _stream(self, method: str, path: str, policy: RetryPolicy | None = None,
                **kw: Any) -> Iterator[httpx.Response]:
        """A streamed answer (a log, a command's events), opened like any request (moving on to the leader);
        once it flows it is not resumed: a broker that goes away mid-way raises StreamBroken."""
        response = self._send(method, path, policy, stream=True, **kw)
        try:
            raise_for(response)
            yield response
        except httpx.TransportError as exc:
            raise stream_broken(response, exc) from exc
        finally:
            response.close()

    def _call(self, method: str, path: str, policy: RetryPolicy | None = None, **kw: Any) -> httpx.Response:
        response = self._send(method, path, policy, **kw)
        raise_for(response)
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
        body = job_body(command, pool, {**fields, "topology": topology})
        return JobInfo.from_json(self._call("POST", "/v1/jobs", json=body).json())

    def submit_many(self, items: Iterable[Item], pool: str = "cpu", **fields: Any) -> list[JobInfo]:
        """Queue many jobs, 1000 a request (POST /v1/jobs:batch, each request all or nothing): argv lists, or job
        bodies with `command` whose fields win over `fields`; the jobs in the items' order (docs/sdk.md)."""
        return fanout_blocking.submit_many(self, items, pool, fields)

    def as_completed(self, jobs_or_ids: Iterable[JobInfo | str], timeout: float | None = None) -> Iterator[JobInfo]:
        """Each job once, as it ends (POST /v1/jobs:watch, watched again when a stream ends or breaks off);
        TimeoutError when some are not finished after `timeout` seconds."""
        return fanout_blocking.as_completed(self, jobs_or_ids, timeout)

    @overload
    def map(self, items: Iterable[Item], pool: str = "cpu", /, *, ordered: bool = True,
            timeout: float | None = None, **fields: Any) -> Iterator[JobInfo]: ...

    @overload
    def map(self, fn: Callable[[Any], Any], inputs: Iterable[Any], pool: str = "cpu", /, *, ordered: bool = True,
            timeout: float | None = None, **fields: Any) -> Iterator[Any]: ...

    def map(self, items: Any, /, *args: Any, ordered: bool = True, timeout: float | None = None,
            **fields: Any) -> Iterator[Any]:
        """submit_many now, then the jobs as they end: in the items' order (`ordered`) or as they finish.
        `map(fn, inputs, pool)`: `fn(input)` in a job per input, yielding the results (JSON in and out,
        a module-level function; docs/sdk.md); CallFailed for a call whose job failed."""
        fn, inputs, pool, fields = map_args(items, args, fields)
        if fn is not None:
            return fanout_blocking.map_calls(self, fn, inputs, pool, ordered, timeout, fields)
        return fanout_blocking.map_jobs(self, inputs, pool, ordered, timeout, fields)

    def get(self, job_id: str, wait_s: float = 0.0) -> JobInfo:
        params = {"wait_s": wait_s} if wait_s else None
        return JobInfo.from_json(self._call("GET", f"/v1/jobs/{job_id}", params=params).json())

    def kernel(self, job_id: str, timeout: float | None = 120.0) -> dict[str, Any]:
        """A kernel job's connection info (ip, ports, key, CurveZMQ keys) once its kernel is up: the owner's
        secret, never in the job's log. KernelNotReady after `timeout`, KernelEnded if the job ends first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                response = self._call("GET", f"/v1/jobs/{job_id}/kernel", KERNEL_RETRY,
                                      params={"wait_s": kernel_wait(deadline)})
            except KernelNotReady:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                continue
            return dict(response.json()["connection"])

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
        body = job_body(command, pool, fields)
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
        with self._stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as response:
            yield from response.iter_bytes()

    def read_log(self, job_id: str, stream: str = "combined", offset: int = 0) -> bytes:
        """What the job's log holds from `offset` now, without following."""
        params = {"stream": stream, "follow": "false", "offset": offset}
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params=params).content

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

    def port_url(self, tag: str, port: int) -> str:
        """Where port `port` of your session `tag` is served through the broker (send this client's token;
        docs/ports.md). Nothing is asked of the broker: a closed port answers 502 PortClosed when fetched."""
        return port_url(self.url, tag, port)

    def sandbox(self, tag: str, *, pool: str = "cpu", queue: str = "default", keep: bool = False) -> Sandbox:
        """The sandbox of your session `tag` (created on first use, resumed when it lives): commands with
        streamed output, files, a live Python kernel (docs/sdk.md). Leaving it (`with`, `close`) ends it
        unless `keep`."""
        from broker.sandbox.blocking import (
            Sandbox,  # the sandbox is built on this client: it imports this module
        )

        return Sandbox(self, tag, pool=pool, queue=queue, keep=keep)

    def port_link(self, tag: str, port: int, ttl_s: float | None = None) -> dict[str, Any]:
        """A short-lived signed link to the port for a browser: `url` (open it once: it sets a cookie for
        that session port and redirects), `expires_at`, `port_url`, and `host_url` under `--port-domain`."""
        body: dict[str, Any] = {"port": port} if ttl_s is None else {"port": port, "ttl_s": ttl_s}
        return dict(self._call("POST", f"/v1/sessions/{quote(tag, safe='')}/port-links", json=body).json())
