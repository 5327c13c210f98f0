"""An in-memory broker of the fan-out routes (`POST /v1/jobs:batch`, `POST /v1/jobs:watch`, a job's log and the
package routes) for httpx.MockTransport, sync and async: enough of the contract to pin the SDK's side of it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


class Events(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A watch stream's bytes, for either client; `breaks` ends it with a reset instead of closing."""

    def __init__(self, chunks: list[bytes], breaks: bool = False) -> None:
        self.chunks, self.breaks = chunks, breaks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.breaks:
            raise httpx.ReadError("connection reset by peer")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.breaks:
            raise httpx.ReadError("connection reset by peer")


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass
class Plan:
    """What one watch request does: send at most `events` jobs (all when None), then `end` or, with `breaks`,
    a reset."""

    events: int | None = None
    breaks: bool = False
    keep_alive: bool = True


@dataclass
class FakeBroker:
    finish_order: str = "fifo"  # or "reverse": the last submitted finishes first
    plans: list[Plan] = field(default_factory=list)
    stdout: dict[str, str] = field(default_factory=dict)  # by job index
    refuse: dict[int, int] = field(default_factory=dict)  # batch number -> item index to refuse
    fails: set[int] = field(default_factory=set)  # job indexes that end FAILED (as does a command naming "fail")
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    batches: list[list[dict[str, Any]]] = field(default_factory=list)
    watches: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.url.host)
        path = request.url.path
        if path == "/v1/jobs:batch":
            return self.batch(json.loads(request.content))
        if path == "/v1/jobs:watch":
            return self.watch(json.loads(request.content))
        if path.startswith("/v1/packages/"):
            self.packages.append(request.method)
            return httpx.Response(404 if request.method == "HEAD" else 201)
        if path.endswith("/logs"):
            job = self.jobs[path.split("/")[3]]
            out = self.stdout.get(str(job["index"]), "")
            return httpx.Response(200, content=(out if request.url.params["stream"] == "stdout"
                                                else out + "Traceback: boom\n").encode())
        raise AssertionError(f"unexpected {request.method} {path}")

    def batch(self, body: dict[str, Any]) -> httpx.Response:
        self.batches.append(body["jobs"])
        bad = self.refuse.get(len(self.batches) - 1)
        if bad is not None:
            return httpx.Response(422, json={"error": {"class": "InvalidRequest", "message": f"jobs.{bad}: bad",
                                                       "retryable": False, "details": {"index": bad}}})
        views = []
        for item in body["jobs"]:
            key = item["idempotency_key"]
            if key not in self.keys:
                job_id = f"j-{len(self.jobs)}"
                self.keys[key] = job_id
                failed = "fail" in item["command"] or len(self.jobs) in self.fails
                self.jobs[job_id] = {"id": job_id, "state": "QUEUED", "caller": "alice", "pool": item["pool"],
                                     "index": len(self.jobs), "end": ("FAILED", 1) if failed else ("SUCCEEDED", 0)}
            views.append(self.view(self.keys[key], terminal=False))
        return httpx.Response(201, json={"jobs": views, "created": len(views)})

    def view(self, job_id: str, terminal: bool = True) -> dict[str, Any]:
        job = self.jobs[job_id]
        view = {k: v for k, v in job.items() if k != "end"}
        if terminal:
            view["state"], view["exit_code"] = job["end"]
        return view

    def watch(self, body: dict[str, Any]) -> httpx.Response:
        self.watches.append(body)
        plan = self.plans.pop(0) if self.plans else Plan()
        ids = list(body["ids"])
        if self.finish_order == "reverse":
            ids.sort(key=lambda i: -self.jobs[i]["index"])
        sent = ids if plan.events is None else ids[:plan.events]
        chunks = [b": keep-alive\n\n"] if plan.keep_alive else []
        chunks += [sse("job", self.view(i)) for i in sent]
        if not plan.breaks:
            chunks.append(sse("end", {"pending": [i for i in ids if i not in sent]}))
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=Events(chunks, plan.breaks))
