"""The SDK's `run` submits and waits in one request (POST /v1/jobs?wait_s=), and waits on with GET when the
job outlives that request or the broker answered at once."""

from __future__ import annotations

import httpx

from broker.client import AsyncClient, Client

QUEUED = {"id": "j-1", "state": "QUEUED", "caller": "alice", "pool": "cpu"}
DONE = {**QUEUED, "state": "SUCCEEDED", "exit_code": 0}


def recorder(*answers: dict) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201 if request.method == "POST" else 200, json=answers[len(seen) - 1])

    return httpx.MockTransport(handle), seen


def test_run_of_a_job_that_ends_within_the_wait_is_one_request() -> None:
    transport, seen = recorder(DONE)
    with Client("http://fp", "tok", transport=transport) as fp:
        job = fp.run(["true"], pool="cpu")
    assert job.state == "SUCCEEDED" and len(seen) == 1
    assert (
        seen[0].method == "POST" and seen[0].url.path == "/v1/jobs" and seen[0].url.params["wait_s"] == "60.0"
    )


def test_run_waits_with_get_when_the_job_is_still_running() -> None:
    transport, seen = recorder(QUEUED, DONE)  # a broker that predates wait_s on POST answers at once
    with Client("http://fp", "tok", transport=transport) as fp:
        job = fp.run(["true"], pool="cpu")
    assert job.state == "SUCCEEDED" and [r.method for r in seen] == ["POST", "GET"]
    assert seen[1].url.path == "/v1/jobs/j-1" and float(seen[1].url.params["wait_s"]) > 0


async def test_the_async_client_runs_the_same_way() -> None:
    transport, seen = recorder(QUEUED, DONE)
    async with AsyncClient("http://fp", "tok", transport=transport) as fp:
        job = await fp.run(["true"], pool="cpu", lease_tag="s")
    assert job.state == "SUCCEEDED" and [r.method for r in seen] == ["POST", "GET"]
    assert seen[0].url.params["wait_s"] == "60.0" and b'"lease_tag":"s"' in seen[0].content.replace(b" ", b"")
