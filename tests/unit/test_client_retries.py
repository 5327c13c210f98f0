"""The SDK retries what the broker calls retryable (and connection failures) with bounded, jittered
exponential backoff, and never repeats a request that could act twice."""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import httpx
import pytest

from broker.client import AsyncClient, Client
from broker.errors import QuotaExceeded, Unavailable, UnknownPool
from broker.retrying import RetryPolicy

JOB = {"id": "j-1", "state": "QUEUED", "caller": "alice", "pool": "cpu"}


def error(status: int, cls: str, retryable: bool) -> httpx.Response:
    return httpx.Response(status, json={"error": {"class": cls, "message": f"{cls} said no",
                                                  "retryable": retryable, "details": {}}})


Handler = Callable[[httpx.Request], httpx.Response]


def scripted(*steps: httpx.Response | type[Exception]) -> tuple[Handler, list[httpx.Request]]:
    """A transport handler answering each request with the next step (a response or an exception class)."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        step = steps[min(len(seen), len(steps)) - 1]
        if isinstance(step, httpx.Response):
            return step
        raise step("scripted failure", request=request)  # type: ignore[call-arg]

    return handle, seen


def client(handler: Handler, sleeps: list[float], attempts: int = 4) -> Client:
    return Client("http://fp", "tok", transport=httpx.MockTransport(handler), sleep=sleeps.append,
                  retry=RetryPolicy(attempts=attempts, rng=random.Random(1)))


def test_a_retryable_error_is_retried_until_it_succeeds() -> None:
    handler, seen = scripted(error(503, "StoreError", True), error(429, "QuotaExceeded", True),
                             httpx.Response(200, json={"jobs": []}))
    sleeps: list[float] = []
    assert client(handler, sleeps).jobs() == []
    assert len(seen) == 3 and len(sleeps) == 2


def test_a_non_retryable_error_is_raised_at_once() -> None:
    handler, seen = scripted(error(400, "UnknownPool", False))
    sleeps: list[float] = []
    with pytest.raises(UnknownPool, match="UnknownPool said no"):
        client(handler, sleeps).submit(["true"], pool="nosuch")
    assert len(seen) == 1 and sleeps == []


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    handler, seen = scripted(error(429, "QuotaExceeded", True))
    sleeps: list[float] = []
    with pytest.raises(QuotaExceeded):
        client(handler, sleeps, attempts=3).jobs()
    assert len(seen) == 3 and len(sleeps) == 2


def test_a_503_without_an_error_body_is_retried() -> None:
    handler, seen = scripted(httpx.Response(503, text="upstream busy"), httpx.Response(200, json={"caller": "a"}))
    assert client(handler, []).whoami() == "a" and len(seen) == 2


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    policy = RetryPolicy(base=1.0, cap=5.0, rng=random.Random(3))
    for retry, ceiling in ((0, 1.0), (1, 2.0), (2, 4.0), (3, 5.0), (8, 5.0)):
        waits = {policy.delay(retry) for _ in range(50)}
        assert all(ceiling / 2 <= w <= ceiling for w in waits) and len(waits) > 1
    assert policy.delay(0, retry_after=3.0) == 3.0 and policy.delay(0, retry_after=60.0) == 5.0


def test_every_submit_carries_an_idempotency_key_and_a_retry_repeats_it() -> None:
    handler, seen = scripted(httpx.ReadTimeout, httpx.Response(201, json=JOB))
    job = client(handler, []).submit(["true"], pool="cpu")
    keys = [json.loads(r.content)["idempotency_key"] for r in seen]
    assert job.id == "j-1" and len(keys) == 2 and keys[0] == keys[1] and keys[0].startswith("sdk-")


def test_the_callers_own_idempotency_key_is_kept() -> None:
    handler, seen = scripted(httpx.Response(201, json=JOB))
    client(handler, []).submit(["true"], pool="cpu", idempotency_key="mine-1")
    assert json.loads(seen[0].content)["idempotency_key"] == "mine-1"


def test_a_signal_that_may_have_reached_the_broker_is_not_repeated() -> None:
    handler, seen = scripted(httpx.ReadError, httpx.Response(200, json=JOB))
    with pytest.raises(Unavailable):
        client(handler, []).signal("j-1", "INT")
    assert len(seen) == 1


def test_a_signal_that_never_connected_is_retried() -> None:
    handler, seen = scripted(httpx.ConnectError, httpx.Response(200, json=JOB))
    assert client(handler, []).signal("j-1", "INT").id == "j-1" and len(seen) == 2


def test_a_retryable_answer_to_a_signal_is_not_repeated() -> None:
    handler, seen = scripted(error(503, "Unavailable", True), httpx.Response(200, json=JOB))
    with pytest.raises(Unavailable):
        client(handler, []).signal("j-1", "INT")
    assert len(seen) == 1


def test_an_unreachable_broker_names_the_url_and_what_to_do(tmp_path: object) -> None:
    handler, seen = scripted(httpx.ConnectError)
    fp = Client(transport=httpx.MockTransport(handler), sleep=lambda _: None, state_dir=str(tmp_path),
                retry=RetryPolicy(attempts=2))
    fp.found = fp.found.__class__(url=fp.url, token="", source="default", hint="start one with `firepool serve`")
    with pytest.raises(Unavailable, match=r"cannot reach the broker at .*firepool serve"):
        fp.pools()
    assert len(seen) == 2


async def test_the_async_client_retries_the_same_way() -> None:
    handler, seen = scripted(httpx.ConnectError, error(502, "BackendError", True), httpx.Response(201, json=JOB))
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with AsyncClient("http://fp", "tok", transport=httpx.MockTransport(handler), sleep=sleep,
                           retry=RetryPolicy(rng=random.Random(2))) as fp:
        job = await fp.submit(["true"], pool="cpu")
    keys = {json.loads(r.content)["idempotency_key"] for r in seen}
    assert job.id == "j-1" and len(seen) == 3 and len(sleeps) == 2 and len(keys) == 1


async def test_the_async_client_does_not_repeat_a_signal_that_may_have_arrived() -> None:
    handler, seen = scripted(httpx.RemoteProtocolError, httpx.Response(200, json=JOB))

    async def sleep(seconds: float) -> None:
        raise AssertionError("no retry expected")

    async with AsyncClient("http://fp", "tok", transport=httpx.MockTransport(handler), sleep=sleep) as fp:
        with pytest.raises(Unavailable):
            await fp.signal("j-1", "TERM")
    assert len(seen) == 1
