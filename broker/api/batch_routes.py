"""`POST /v1/jobs:batch` and `POST /v1/jobs:watch`: a fan-out in one request, its results over one stream.

A batch is all or nothing: every item is validated and admitted before any is stored, and the first bad item's
error names its `index` (`details.index`; a malformed field also names it as `jobs.<i>.<field>`). The jobs are
then stored in one transaction and dispatched as single submits are. A watch streams Server-Sent Events:

    event: job        once per job as it ends (its view, as GET /v1/jobs/{id}), in the order they end
    data: {...}

    event: end        last: the ids still not terminal when `wait_s` ran out ([] when every job ended)
    data: {"pending": [...]}

A `: keep-alive` comment goes out every 15 s of silence. Jobs that end together leave in one write, and a busy
stream writes at most every 10 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Protocol

from fastapi import Depends, FastAPI
from fastapi.responses import Response, StreamingResponse
from pydantic import Field

from broker import jsonwire
from broker.api.schemas import JobRequest, Strict, job_view
from broker.intake import MAX_BATCH, MAX_WATCH, Watch
from broker.jobs import Job, JobSpec

KEEPALIVE_S = 15.0
GATHER_S = 0.01
"""A stream writes at most once in this long: at hundreds of jobs a second each write carries several (the first job
after a quiet spell leaves at once)."""


class BatchRequest(Strict):
    """POST /v1/jobs:batch."""

    jobs: list[JobRequest] = Field(min_length=1, max_length=MAX_BATCH,
                                   description=f"1 to {MAX_BATCH} jobs, each as POST /v1/jobs's body.")


class WatchRequest(Strict):
    """POST /v1/jobs:watch."""

    ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        min_length=1, max_length=MAX_WATCH, description=f"1 to {MAX_WATCH} of your job ids.")
    wait_s: float = Field(default=60.0, ge=0, le=300, description="End the stream after this long; the ids "
                                                                  "still running are listed in `end`.")


class Jobs(Protocol):
    async def submit_many(self, caller: str, specs: list[JobSpec]) -> list[tuple[Job, bool]]: ...

    async def watch(self, caller: str, ids: list[str]) -> Watch: ...

    def waiting_reason(self, job_id: str) -> str | None: ...


def add_batch_routes(app: FastAPI, jobs: Jobs, caller: Any, errors: dict[int | str, dict[str, Any]],
                     now: Callable[[], float]) -> None:
    """`caller` is the dependency giving the verified caller; `now` the broker's monotonic clock."""

    @app.post("/v1/jobs:batch", status_code=201, responses=errors)
    async def submit_batch(body: BatchRequest, who: str = Depends(caller)) -> Response:
        """Submit up to 1,000 jobs at once, all or none; their views in the items' order and how many were new
        (an item whose idempotency key was used before returns that first job)."""
        done = await jobs.submit_many(who, [item.to_spec() for item in body.jobs])
        views = [job_view(job, jobs.waiting_reason(job.id)) for job, _ in done]
        return Response(jsonwire.dumps({"jobs": views, "created": sum(created for _, created in done)}),
                        status_code=201, media_type="application/json")

    @app.post("/v1/jobs:watch", response_class=StreamingResponse,
              responses={200: {"content": {"text/event-stream": {}},
                               "description": "`job` events as the jobs end, then one `end`."}, **errors})
    async def watch(body: WatchRequest, who: str = Depends(caller)) -> StreamingResponse:
        """Follow your jobs `ids`: each one's view as it ends, over one Server-Sent Events stream."""
        watching = await jobs.watch(who, body.ids)
        return StreamingResponse(_events(watching, now() + body.wait_s, now), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _events(watching: Watch, deadline: float, now: Callable[[], float]) -> AsyncIterator[bytes]:
    try:
        written = -GATHER_S
        while watching.pending and (left := deadline - now()) > 0:
            ended = await watching.ended(min(left, KEEPALIVE_S))
            if ended:
                if watching.pending and (gather := written + GATHER_S - now()) > 0:
                    await asyncio.sleep(gather)  # a busy stream: what ends meanwhile leaves in this write
                    ended += watching.ended_now()
                written = now()
                yield b"".join(b"event: job\ndata: " + jsonwire.dumps(job_view(job)) + b"\n\n" for job in ended)
            elif deadline - now() > 0:
                yield b": keep-alive\n\n"
        yield b"event: end\ndata: " + jsonwire.dumps({"pending": sorted(watching.pending)}) + b"\n\n"
    finally:
        watching.close()
