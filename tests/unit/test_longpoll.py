"""A job's long poll ends with its client: the wait is cancelled once the client disconnects."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from starlette.requests import Request

from broker.api import longpoll
from broker.api.longpoll import wait_job, while_connected
from broker.claiming.admission import admit
from broker.jobs import Job, JobSpec
from tests.unit.harness import cpu_pool


def _request(messages: asyncio.Queue[dict[str, Any]]) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": []}, messages.get)


async def test_the_wait_answers_when_it_ends_before_the_client_goes() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    assert await while_connected(_request(messages), asyncio.sleep(0.01, result="done")) == "done"


async def test_a_client_that_disconnects_ends_the_wait_and_cancels_it() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    waiting = asyncio.ensure_future(asyncio.sleep(60))
    answer = asyncio.ensure_future(while_connected(_request(messages), waiting))
    await asyncio.sleep(0.01)
    assert not answer.done()
    await messages.put({"type": "http.disconnect"})
    assert await asyncio.wait_for(answer, 5) is None
    assert waiting.cancelled()


async def test_a_long_poll_past_its_quick_part_watches_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(longpoll, "QUICK_S", 0.01)
    job = admit(JobSpec(pool="cpu", command=("sleep", "30")), "alice", {"cpu": cpu_pool()}, time.time(), None)
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    waits: list[float] = []

    async def wait(seconds: float) -> Job:
        waits.append(seconds)
        await asyncio.sleep(seconds)
        return job

    answer = asyncio.ensure_future(wait_job(_request(messages), wait, 60.0))
    await asyncio.sleep(0.05)
    await messages.put({"type": "http.disconnect"})
    assert await asyncio.wait_for(answer, 5) is None
    assert waits == [0.01, 60.0 - 0.01]
    assert await wait_job(_request(messages), wait, 0.005) is job  # within the quick part: the client unwatched
    assert waits[-1] == 0.005
