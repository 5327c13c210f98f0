"""Pod status reading (pull errors, ends, ready records) and create pacing on the virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.backends.kubernetes import podstatus
from broker.backends.kubernetes.ratelimit import RateSettings, Retryable, TokenBucket, with_backoff
from broker.clock import VirtualClock


def status(phase: str, **kw: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "uid": "u"}, "spec": kw.pop("spec", {}), "status": {"phase": phase, **kw}}


def test_image_pull_backoff_is_reported_with_its_reason() -> None:
    pod = status("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff",
                                                                       "message": "Back-off pulling image x"}}}])
    assert podstatus.pull_error(pod) == "ImagePullBackOff: Back-off pulling image x"
    assert podstatus.pull_error(status("Pending")) == ""


def test_evicted_or_terminating_pod_has_ended() -> None:
    assert podstatus.ended(status("Failed", reason="Evicted", message="low memory")) == "Evicted: low memory"
    terminating = status("Running")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert podstatus.ended(terminating) == "being deleted"
    assert podstatus.ended(status("Running", podIP="10.0.0.1")) == ""


def test_ready_record_notes_each_stage_once_from_the_create() -> None:
    rec = podstatus.ReadyRecord(created=100.0)
    rec.observe(status("Pending", spec={"nodeName": "n1"}), 101.0)
    rec.observe(status("Running", podIP="10.0.0.1", containerStatuses=[
        {"imageID": "sha256:x", "state": {"running": {}}}]), 104.0)
    rec.observe(status("Running", spec={"nodeName": "n1"}), 109.0)
    rec.answered(104.5)
    assert rec.view() == {"scheduled": 1.0, "image_pulled": 4.0, "container_started": 4.0, "agent_answered": 4.5}
    assert podstatus.ReadyRecord.loads(100.0, rec.dumps()).view() == rec.view()  # survives a restart
    assert podstatus.ReadyRecord.loads(100.0, "not json").view()["scheduled"] is None


async def test_token_bucket_allows_a_burst_then_paces_at_qps() -> None:
    clock = VirtualClock()
    bucket = TokenBucket(clock, qps=2.0, burst=3)
    start = clock.now()
    for _ in range(3):
        await bucket.take()
    assert clock.now() == start
    task = asyncio.create_task(bucket.take())
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance_to(start + 0.5)
    await asyncio.sleep(0)
    await asyncio.wait_for(task, 1)


async def test_backoff_retries_429_then_surfaces_after_the_limit() -> None:
    clock = VirtualClock()
    calls: list[float] = []

    async def flaky() -> str:
        calls.append(clock.now())
        if len(calls) < 3:
            raise Retryable(429, "too many requests")
        return "ok"

    task = asyncio.create_task(with_backoff(clock, RateSettings(backoff_s=1.0), flaky))
    for _ in range(10):
        await asyncio.sleep(0)
        clock.advance_to(clock.now() + 1.0)
    assert await task == "ok"
    assert [round(c - calls[0], 3) for c in calls] == [0.0, 1.0, 3.0]  # 1 s, then 2 s

    async def always() -> str:
        raise Retryable(503, "unavailable", after_s=0.0)

    failing = asyncio.create_task(with_backoff(clock, RateSettings(retries=2), always))
    for _ in range(10):
        await asyncio.sleep(0)
        clock.advance_to(clock.now())
    with pytest.raises(Retryable):
        await asyncio.wait_for(failing, 1)


def test_the_catalog_sets_the_create_rate_and_refuses_a_zero_qps() -> None:
    from broker.pools import CatalogError, CreateRate, parse_catalog

    pools = [{"name": "cpu"}]
    assert parse_catalog({"pools": pools}).create_rate == CreateRate()
    assert parse_catalog({"pools": pools, "create_rate": {"qps": 5.0, "burst": 2}}).create_rate == CreateRate(5.0, 2)
    with pytest.raises(CatalogError, match="create_rate.qps"):
        parse_catalog({"pools": pools, "create_rate": {"qps": 0.0}})
