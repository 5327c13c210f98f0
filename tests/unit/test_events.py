"""The fleet's event log: hold breaks and budget throttling emit, GET /v1/events pages by id or time,
an admin sees everything and a caller only what is about its own jobs and pods."""

from __future__ import annotations

import asyncio
import datetime
import threading

import httpx
import pytest

from broker.api.app import create_app, parse_since
from broker.api.auth import TokenAuth
from broker.clock import VirtualClock
from broker.errors import InvalidRequest
from broker.events import Event, EventLog
from broker.jobs import JobState
from tests.unit.harness import Harness, cpu_pool, gpu_pool

ALICE, BOB, OPS = "tok-alice", "tok-bob", "tok-ops"


async def test_a_broken_hold_is_an_event_for_its_owner() -> None:
    h = await Harness([cpu_pool(max_count=1, caller_hold_seconds=600.0, idle_timeout=600.0,
                                template={"start_delay_s": 2.0})]).start()
    try:
        await h.run_job("alice", lease_tag="a")
        await h.run_for(61.0)  # past the hold tenure
        done = await h.run_job("bob", lease_tag="b")
        assert done.state is JobState.SUCCEEDED
        broken = [e for e in h.store.list_events() if e.kind == "hold.broken"]
        assert len(broken) == 1 and broken[0].caller == "alice"
        assert "at its ceiling" in broken[0].why and broken[0].cost_gpu_s == 2.0  # the cold start alice pays next
    finally:
        await h.stop()


async def test_budget_throttling_is_one_event_while_it_lasts() -> None:
    h = await Harness([gpu_pool(max_count=4, step=4)], gpus=4, budgets={"fake-gpu": 1.0}).start()
    try:
        jobs = [await h.submit("alice", pool="gpu", lease_tag=f"t{i}", command=("sleep", "5")) for i in range(3)]
        await h.run_for(3.0)
        throttled = [e for e in h.store.list_events() if e.kind == "budget.throttled"]
        assert len(throttled) == 1 and throttled[0].subject == "gpu" and throttled[0].caller is None
        assert "budget of fake-gpu exhausted" in throttled[0].why
        assert next(v for v in h.cp.pools_view() if v["name"] == "gpu")["budget_throttled"] is True
        for job in jobs:
            await h.finish(job, timeout=60.0)
    finally:
        await h.stop()


@pytest.mark.parametrize(("since", "parsed"), [
    (None, (None, None)), ("", (None, None)), ("42", (42, None)), ("1764525600.5", (None, 1764525600.5)),
    ("2026-11-30T18:00:00Z", (None, datetime.datetime(2026, 11, 30, 18, tzinfo=datetime.UTC).timestamp())),
    ("9" * 40, (2**31 - 1, None)),  # no database integer overflows on a caller's huge id
])
def test_since_is_an_event_id_or_a_time(since: str | None, parsed: tuple[int | None, float | None]) -> None:
    assert parse_since(since) == parsed


@pytest.mark.parametrize("since", ["yesterday", "nan", "inf", "1e999", "²"])
def test_a_since_that_is_neither_is_refused(since: str) -> None:
    with pytest.raises(InvalidRequest, match="since must be"):
        parse_since(since)


async def test_an_admin_sees_every_event_and_a_caller_only_its_own() -> None:
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth({ALICE: "alice", BOB: "bob", OPS: {"caller": "ops", "admin": True}}))
    try:
        h.cp.events.emit("preemption", "j-a", "borrowed", 60.0, "alice", {"for_job": "j-x"})
        h.cp.events.emit("preemption", "j-b", "borrowed", 30.0, "bob")
        h.cp.events.emit("budget.throttled", "gpu", "budget exhausted")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
            def get(token: str, **params: object) -> object:
                return http.get("/v1/events", params=params, headers={"Authorization": f"Bearer {token}"})

            every = (await get(OPS)).json()  # type: ignore[misc]
            assert [e["subject"] for e in every["events"]] == ["j-a", "j-b", "gpu"]
            first = every["events"][0]
            assert first["kind"] == "preemption" and first["cost_gpu_s"] == 60.0 and first["detail"] == {"for_job": "j-x"}
            mine = (await get(ALICE)).json()  # type: ignore[misc]
            assert [e["subject"] for e in mine["events"]] == ["j-a"]
            assert mine["events"][0]["detail"] == {}  # the job it yielded to is another caller's business
            after = (await get(OPS, since=str(first["id"]), limit=1)).json()  # type: ignore[misc]
            assert [e["subject"] for e in after["events"]] == ["j-b"] and after["next"] == every["events"][1]["id"]
            metrics = (await http.get("/metrics", headers={"Authorization": f"Bearer {OPS}"})).text
            assert 'firepool_events_total{kind="preemption"} 2.0' in metrics
            assert 'firepool_event_cost_gpu_seconds_total{kind="preemption"} 90.0' in metrics
            bad = await get(OPS, since="soon")  # type: ignore[misc]
            assert bad.status_code == 422 and bad.json()["error"]["class"] == "InvalidRequest"  # type: ignore[attr-defined]
    finally:
        await h.stop()


async def test_capacity_an_owner_reclaims_is_an_event_per_borrowed_pod() -> None:
    from broker.ports.capacity import StaticCapacitySource

    capacity = StaticCapacitySource({"fake-gpu": 2})
    pool = gpu_pool(max_count=4, step=4, borrow=True)
    h = await Harness([pool], gpus=4, budgets={"fake-gpu": 1}, capacity=capacity).start()
    try:
        jobs = [await h.submit(c, pool="gpu", command=("sleep", "5")) for c in ("a", "b", "c")]
        await h.run_for(3.0)
        assert h.cp.pools_view()[0]["borrowed"] == 2
        capacity.set("fake-gpu", 1)  # the owner reclaims one GPU
        h.cp.controller.borrowing.refresh()  # type: ignore[union-attr]
        h.cp.controller.reconcile_once()
        reclaimed = [e for e in h.store.list_events() if e.kind == "capacity.reclaimed"]
        assert len(reclaimed) == 1 and reclaimed[0].caller in ("b", "c") and reclaimed[0].detail == {"busy": True}
        for job in jobs:
            assert (await h.finish(job, timeout=60.0)).state is JobState.SUCCEEDED  # no job is stopped for it
    finally:
        await h.stop()


class _SlowStore:
    """A blocking store whose writes wait until the test lets them through."""

    blocking = True

    def __init__(self) -> None:
        self.stored: list[Event] = []
        self.go = threading.Event()

    def add_events(self, batch: list[Event]) -> None:
        self.go.wait(5)
        self.stored.extend(batch)


async def test_a_flush_returns_only_once_the_batch_another_flush_took_is_stored() -> None:
    store = _SlowStore()
    log = EventLog(store, VirtualClock())  # type: ignore[arg-type]
    log.emit("hold_broken", "pod-1", "why")
    writer = asyncio.create_task(log.flush())  # the background writer takes the batch ...
    await asyncio.sleep(0.01)
    reader = asyncio.create_task(log.flush())  # ... and a reader flushes before listing
    await asyncio.sleep(0.01)
    assert not reader.done(), "the reader returned while the writer's batch was still on its way"
    store.go.set()
    await asyncio.gather(writer, reader)
    assert [e.subject for e in store.stored] == ["pod-1"]
