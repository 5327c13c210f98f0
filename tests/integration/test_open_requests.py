"""A caller holding the broker's per-caller number of open requests is refused more (429, retryable) while other
callers are served, and gets its places back as its streams end or its clients give up their long polls."""

from __future__ import annotations

import contextlib
import time

import httpx
import pytest

from broker.client import Client
from broker.errors import TooManyOpenRequests
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration


def test_a_caller_holding_its_open_requests_is_refused_more_while_others_are_served(broker_factory) -> None:
    broker: BrokerProcess = broker_factory(extra=("--max-open-requests", "3"))
    alice, bob = broker.client("alice"), broker.client("bob")
    job = alice.post("/v1/jobs", json={"pool": "cpu", "command": ["sleep", "60"]}).json()
    with contextlib.ExitStack() as streams:
        for _ in range(3):
            watch = streams.enter_context(alice.stream("POST", "/v1/jobs:watch", json={"ids": [job["id"]]}))
            assert watch.status_code == 200
        refused = alice.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["class"] == "TooManyOpenRequests" and error["retryable"] is True and error["details"] == {"limit": 3}
        with Client(broker.url, token=broker.tokens["alice"]) as sdk, pytest.raises(TooManyOpenRequests):
            sdk.get(job["id"])
        assert bob.get("/v1/jobs").status_code == 200  # another caller's door is open
        assert bob.get("/healthz").status_code == 200
    # The streams are closed: once the broker sees the disconnects (not before the next request, necessarily),
    # their places are back.
    deadline = time.monotonic() + 10
    while (status := alice.get(f"/v1/jobs/{job['id']}").status_code) == 429 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == 200
    for _ in range(3):  # long polls their client gave up on: each ends with its client, not at its wait_s
        with pytest.raises(httpx.TimeoutException):
            alice.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}, timeout=0.2)
    began = time.monotonic()
    while (status := alice.get(f"/v1/jobs/{job['id']}").status_code) == 429 and time.monotonic() < began + 10:
        time.sleep(0.05)
    assert status == 200 and time.monotonic() - began < 5
    alice.post(f"/v1/jobs/{job['id']}/cancel")
