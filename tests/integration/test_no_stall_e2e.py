"""No stall through a real broker (issue 10, finding 2): a single-use job cancelled 20 ms after its submit
leaves no pod behind, and a normal job behind it runs (`max_count: 2`, `idle_timeout: 15`)."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import run_job

pytestmark = pytest.mark.integration

POOLS = """
pools:
  - name: cpu
    max_count: 2
    max_idle_count: 2
    idle_timeout: 15
    template: {start_delay_s: 1}
"""


def _pool(c) -> dict:
    return next(p for p in c.get("/v1/pools").json()["pools"] if p["name"] == "cpu")


def test_a_single_use_job_cancelled_20_ms_after_submit_leaves_no_pod_and_no_queue(broker_factory) -> None:
    b = broker_factory(pools=POOLS)
    alice = b.client("alice")
    for _ in range(2):  # one orphan per slot of the ceiling was enough to stall the pool for good
        job = alice.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "single_use": True}).json()
        time.sleep(0.02)
        assert alice.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "CANCELLED"
    # Single-use pods made for the cancelled jobs go at once. A plain pod the scaler started for the
    # queued demand may stay idle for its keep-alive: it is supply for the next job, not a stall.
    deadline = time.monotonic() + 10
    while (pool := _pool(alice))["single_use"] or pool["physical"] != pool["idle"]:
        assert time.monotonic() < deadline, f"pods made for cancelled jobs stayed: {pool}"
        time.sleep(0.1)
    started = time.monotonic()
    done = run_job(alice, {"pool": "cpu", "command": ["true"]}, wait=30)
    assert done["state"] == "SUCCEEDED" and time.monotonic() - started < 15
