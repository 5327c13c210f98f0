"""`HttpAgentClient`: the `AgentClient` port spoken over HTTP to a pod agent (Unix socket or TCP).

Each pod's client keeps its connections open between calls, so a warm launch costs one request on an
established socket. The small JSON calls go through `broker.running.http1` (a keep-alive HTTP/1.1 client for
the agent's narrow dialect); package uploads, `https://` agents and an injected transport use httpx. Every
transport error and every unexpected status becomes an `AgentError` here, with `raise ... from`, so the
dispatcher sees one error class per boundary.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from broker import jsonwire
from broker.errors import AgentError
from broker.fencing import Term
from broker.ports.agent import (
    AgentHealth,
    AttemptStatus,
    KernelReport,
    LaunchRequest,
    LogChunk,
    PackageDelivered,
    ResetRequest,
    ResetResult,
)
from broker.running.http1 import AgentUnreachable, Http1Pool, Reply

STALE_TERM = "StaleTerm"
"""The class of an agent's refusal of a request under a term older than the newest it has seen."""
_STATUS_FIELDS = frozenset(f.name for f in dataclasses.fields(AttemptStatus))
SETUP_S = 660.0
"""Extra time a launch may take when the agent installs requirements before the first instruction."""
INLINE_LOGS = 256 << 10
"""A finished attempt's logs up to this size come with its status: no read per stream after a short job."""
_SLACK_S = 10.0
"""Added to a long-poll's own wait, so the HTTP timeout never fires before the agent answers."""


def _no_broker(reason: str) -> None:
    """A client of no broker has nothing to end: the refusal still raises."""


def _attempt_path(attempt_id: str, suffix: str = "") -> str:
    return f"/v1/attempts/{quote(attempt_id, safe='')}{suffix}"


def _status(payload: dict[str, Any]) -> AttemptStatus:
    # Newer agents may report more; only the fields this broker knows are read.
    fields = {k: v for k, v in payload.items() if k in _STATUS_FIELDS}
    if fields.get("logs") is not None:
        fields["logs"] = {str(stream): base64.b64decode(data, validate=True) for stream, data in fields["logs"].items()}
    if fields.get("reset") is not None:
        fields["reset"] = _reset_result(fields["reset"])
    return AttemptStatus(**fields)


def _reset_result(body: dict[str, Any]) -> ResetResult:
    return ResetResult(clean=body["clean"], duration_s=body["duration_s"], killed=body.get("killed", 0),
                       problems=tuple(body.get("problems", ())), incarnation=body.get("incarnation"))


def _reset_body(request: ResetRequest) -> dict[str, Any]:
    return {"wipe_workspace": request.wipe_workspace, "wipe_paths": list(request.wipe_paths),
            "keep_paths": list(request.keep_paths)}


class HttpAgentClient:
    """Talks to one pod's agent. `endpoint` is `unix:/path/to/agent.sock`, `tcp:host:port` or a URL."""

    def __init__(self, endpoint: str, secret: str, *, pod: str = "", timeout_s: float = 10.0,
                 uds_path: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 term: Term | None = None) -> None:
        """`uds_path` overrides the socket path actually dialled (e.g. a short /proc/self/fd alias).

        `term` is the broker's (`broker.fencing`), one object for all its clients: every request names its current
        value, and an agent that refuses it as stale deposes the broker. None: a client of no broker (a test, a
        tool) speaks as term 0, and a stale-term refusal only raises."""
        self.endpoint = endpoint
        self.pod = pod
        self.timeout_s = timeout_s
        self.term = term if term is not None else Term(on_deposed=_no_broker)
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=8, keepalive_expiry=60.0)
        # Plain HTTP needs no CA bundle: loading one costs 50-100 ms per pod's client, which made a
        # restarted broker's first health checks of its pods (before dispatching) take half a second.
        verify = endpoint.startswith("https://")
        auth = {"Authorization": f"Bearer {secret}"}
        self._fast: Http1Pool | None = None
        if transport is None and endpoint.startswith("unix:"):
            self._fast = Http1Pool(uds=uds_path or endpoint[len("unix:"):], headers=auth, current=self.term.headers)
        elif transport is None and endpoint.startswith("tcp:"):
            host, _, port = endpoint[len("tcp:"):].rpartition(":")
            self._fast = Http1Pool(host=host.strip("[]"), port=int(port), headers=auth, current=self.term.headers)
        if endpoint.startswith("unix:"):
            base_url = "http://agent"
            transport = transport or httpx.AsyncHTTPTransport(uds=uds_path or endpoint[len("unix:"):], limits=limits,
                                                              verify=verify)
        elif endpoint.startswith("tcp:"):
            base_url = "http://" + endpoint[len("tcp:"):]
        elif endpoint.startswith(("http://", "https://")):
            base_url = endpoint
        else:
            raise ValueError(f"agent endpoint must be unix:PATH, tcp:HOST:PORT or a URL, got {endpoint!r}")
        if transport is None:
            transport = httpx.AsyncHTTPTransport(limits=limits, verify=verify)
        # trust_env=False: a proxy configured for the broker must never carry agent traffic.
        self._client = httpx.AsyncClient(base_url=base_url, transport=transport, trust_env=False,
                                         headers=auth,
                                         timeout=httpx.Timeout(timeout_s))

    async def _request(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None,
                       wait_s: float = 0.0, ok: tuple[int, ...] = (200,)) -> httpx.Response | Reply:
        seconds = self.timeout_s + wait_s + (_SLACK_S if wait_s else 0.0)
        if self._fast is not None:
            target = path + ("?" + urlencode(params) if params else "")
            body = None if json is None else jsonwire.dumps(json)
            try:
                reply = await self._fast.request(method, target, body, seconds)
            except RuntimeError as exc:
                raise AgentError(f"the client of pod {self.pod or self.endpoint} was closed (pod deleted?)",
                                 {"pod": self.pod, "endpoint": self.endpoint}) from exc
            except AgentUnreachable as exc:
                raise AgentError(f"agent of pod {self.pod or self.endpoint} unreachable: {exc}",
                                 {"pod": self.pod, "endpoint": self.endpoint}) from exc
            if reply.status_code not in ok:
                raise self._refusal(method, path, reply)
            return reply
        timeout = httpx.Timeout(seconds)
        try:
            response = await self._client.request(method, path, json=json, params=params, timeout=timeout,
                                                  headers=self.term.headers())
        except RuntimeError as exc:
            if not self._client.is_closed:
                raise
            raise AgentError(f"the client of pod {self.pod or self.endpoint} was closed (pod deleted?)",
                             {"pod": self.pod, "endpoint": self.endpoint}) from exc
        except httpx.HTTPError as exc:
            raise AgentError(f"agent of pod {self.pod or self.endpoint} unreachable: {type(exc).__name__}: {exc}",
                             {"pod": self.pod, "endpoint": self.endpoint}) from exc
        if response.status_code not in ok:
            raise self._refusal(method, path, response)
        return response

    def _refusal(self, method: str, path: str, response: httpx.Response | Reply) -> AgentError:
        """The AgentError of a refusal; one for a stale term first deposes this broker (`broker.fencing`)."""
        error_class: str | None = None
        try:
            error = response.json()["error"]
            message = error["message"]
            error_class = error.get("class")
        except (ValueError, KeyError, TypeError, AttributeError):
            message = response.text[:200]
        details: dict[str, Any] = {"pod": self.pod, "status": response.status_code, "agent_message": message}
        if isinstance(error_class, str):
            details["agent_class"] = error_class
            details["agent_retryable"] = bool(error.get("retryable"))
        refused = AgentError(f"agent of pod {self.pod or self.endpoint} refused {method} {path}: "
                             f"{response.status_code} {message}", details)
        if response.status_code == 409 and error_class == STALE_TERM:
            self.term.deposed(f"the agent of pod {self.pod or self.endpoint} refused {method} {path} under term "
                              f"{self.term.value}: {message}")
        return refused

    @contextmanager
    def _decoding(self) -> Iterator[None]:
        """Turn a reply that is not the expected JSON into an AgentError."""
        try:
            yield
        except (ValueError, KeyError, TypeError) as exc:
            raise AgentError(f"agent of pod {self.pod or self.endpoint} sent a malformed reply: {exc!r}",
                             {"pod": self.pod}) from exc

    async def health(self) -> AgentHealth:
        response = await self._request("GET", "/v1/health")
        with self._decoding():
            body = response.json()
            return AgentHealth(pod=body["pod"], isolated=body["isolated"], attempt=body.get("attempt"),
                               uptime_s=body.get("uptime_s", 0.0), info=body.get("info", {}),
                               incarnation=body.get("incarnation"))

    async def launch(self, request: LaunchRequest) -> AttemptStatus:
        payload = {"attempt_id": request.attempt_id, "argv": list(request.argv), "env": dict(request.env),
                   "session": request.session, "cwd": request.cwd, "timeout_s": request.timeout_s,
                   "extra": dict(request.extra)}
        if request.reset_after is not None:
            payload["reset_after"] = _reset_body(request.reset_after)
        setup = SETUP_S if request.extra.get("requirements") is not None else 0.0
        path = "/v1/attempts"
        if request.wait_s > 0:  # the status once the attempt ended (logs inline) or wait_s passed
            path += f"?wait_s={request.wait_s}&inline_logs={INLINE_LOGS}"
        response = await self._request("POST", path, json=payload, ok=(201,), wait_s=setup + request.wait_s)
        with self._decoding():
            return _status(response.json())

    async def wait(self, attempt_id: str, timeout_s: float) -> AttemptStatus:
        wait_s = max(0.0, timeout_s)
        response = await self._request("GET", _attempt_path(attempt_id, f"?wait_s={wait_s}&inline_logs={INLINE_LOGS}"),
                                       wait_s=wait_s)
        with self._decoding():
            return _status(response.json())

    async def status(self, attempt_id: str) -> AttemptStatus | None:
        response = await self._request("GET", _attempt_path(attempt_id), ok=(200, 404))
        if response.status_code == 404:
            return None
        with self._decoding():
            return _status(response.json())

    async def read_log(self, attempt_id: str, stream: str = "combined", offset: int = 0,
                       max_bytes: int = 1 << 20, wait_s: float = 0.0) -> LogChunk:
        params = {"stream": stream, "offset": offset, "max_bytes": max_bytes, "wait_s": wait_s}
        response = await self._request("GET", _attempt_path(attempt_id, "/log"), params=params, wait_s=wait_s)
        with self._decoding():
            next_offset = int(response.headers["x-next-offset"])
        return LogChunk(data=response.content, next_offset=next_offset,
                        complete=response.headers.get("x-complete") == "1")

    async def kernel(self, attempt_id: str, wait_s: float = 0.0) -> KernelReport:
        response = await self._request("GET", _attempt_path(attempt_id, "/kernel"), params={"wait_s": wait_s},
                                       wait_s=wait_s)
        with self._decoding():
            body = response.json()
            connection = body["connection"]
            if connection is not None and not isinstance(connection, dict):
                raise TypeError("connection is not an object")
            return KernelReport(running=bool(body["running"]), connection=connection)

    async def signal(self, attempt_id: str, signal: str) -> None:
        await self._request("POST", _attempt_path(attempt_id, "/signal"), json={"signal": signal}, ok=(204,))

    async def cancel(self, attempt_id: str, grace_s: float = 5.0) -> None:
        """TERM the attempt's processes, KILL them after `grace_s`; the status gets `cancelled`."""
        await self._request("POST", _attempt_path(attempt_id, "/cancel"), json={"grace_s": grace_s}, ok=(202,))

    async def reset(self, request: ResetRequest) -> ResetResult:
        response = await self._request("POST", "/v1/reset", json=_reset_body(request))
        with self._decoding():
            return _reset_result(response.json())

    async def keep_kernels(self, keep: bool) -> None:
        await self._request("POST", "/v1/kernels", json={"keep": keep})

    async def put_package(self, digest: str, path: str, max_extracted: int, timeout_s: float) -> PackageDelivered:
        """Stream the archive from disk over this pod's connection (the sandbox may have no network)."""
        size = os.path.getsize(path)

        async def chunks() -> AsyncIterator[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk

        try:
            response = await self._client.put(
                f"/v1/packages/{digest}", content=chunks(), params={"max_extracted": max_extracted},
                headers={"Content-Length": str(size), "Content-Type": "application/zip", **self.term.headers()},
                timeout=httpx.Timeout(timeout_s))
        except httpx.HTTPError as exc:
            raise AgentError(f"pushing package {digest[:12]} to pod {self.pod or self.endpoint} failed: "
                             f"{type(exc).__name__}: {exc}", {"pod": self.pod}) from exc
        if response.status_code != 200:
            raise self._refusal("PUT", f"/v1/packages/{digest[:12]}", response)
        with self._decoding():
            body = response.json()
            return PackageDelivered(digest=body["digest"], unpack_s=body["unpack_s"],
                                    receive_s=body.get("receive_s", 0.0), extracted=body.get("extracted", 0))

    async def upgrade(self, path: str, params: dict[str, Any], protocol: str
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream the agent switched to `protocol` at `path` (a tunnel to a port, a terminal).

        AgentError when the agent refused (its status and message in the details) or could not be reached."""
        if self._fast is None:
            raise AgentError(f"the agent of pod {self.pod or self.endpoint} is not reached over unix: or tcp:, "
                             "which streams need", {"pod": self.pod, "endpoint": self.endpoint})
        target = path + ("?" + urlencode(params) if params else "")
        try:
            answer = await self._fast.upgrade(target, protocol, self.timeout_s)
        except RuntimeError as exc:
            raise AgentError(f"the client of pod {self.pod or self.endpoint} was closed (pod deleted?)",
                             {"pod": self.pod, "endpoint": self.endpoint}) from exc
        except AgentUnreachable as exc:
            raise AgentError(f"agent of pod {self.pod or self.endpoint} unreachable: {exc}",
                             {"pod": self.pod, "endpoint": self.endpoint}) from exc
        if isinstance(answer, Reply):
            raise self._refusal("GET", path, answer)
        return answer

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.aclose()
        await self._client.aclose()
