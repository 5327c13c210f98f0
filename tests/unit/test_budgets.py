"""Per-accelerator budgets: one ledger for every pool of a GPU model, reserved before any create."""

from __future__ import annotations

import random
import threading

from broker.jobs import JobState
from broker.warmth.budgets import Ledger
from tests.unit.harness import Harness, gpu_pool


def test_a_reservation_that_does_not_fit_records_nothing() -> None:
    ledger = Ledger({"H200": 8})
    assert ledger.reserve("big", "H200", 8)
    assert not ledger.reserve("small", "H200", 1)
    assert ledger.used("H200") == 8 and not ledger.holds("small")
    assert ledger.release("big") is not None and ledger.used("H200") == 0
    assert ledger.reserve("small", "H200", 1)
    assert ledger.reserve("anything", "cpu", 1000)  # no limit named: unbounded


def test_32_threads_reserving_1_and_8_gpu_pods_never_overshoot_the_shared_budget() -> None:
    limit = 20.0
    ledger = Ledger({"H200": limit})
    start = threading.Barrier(32)
    overshoot: list[float] = []
    granted = [0]
    lock = threading.Lock()

    def worker(n: int) -> None:
        rng = random.Random(n)
        start.wait()
        mine: list[str] = []
        for i in range(2000):
            if mine and rng.random() < 0.5:
                ledger.release(mine.pop(rng.randrange(len(mine))))
                continue
            name = f"t{n}-{i}"
            if ledger.reserve(name, "H200", 8.0 if rng.random() < 0.25 else 1.0):
                mine.append(name)
                with lock:
                    granted[0] += 1
                used = ledger.used("H200")
                if used > limit:
                    overshoot.append(used)
        for name in mine:
            ledger.release(name)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overshoot == []
    assert ledger.peak["H200"] <= limit
    assert ledger.peak["H200"] >= limit - 8  # the budget was actually contended
    assert granted[0] > 1000 and ledger.used("H200") == 0


async def test_one_gpu_and_eight_gpu_pools_draw_on_one_ledger() -> None:
    small = gpu_pool(name="h1", gpus=1, accelerator="H200", max_count=8, step=8)
    big = gpu_pool(name="h8", gpus=8, accelerator="H200", max_count=2, step=2)
    h = Harness([small, big], gpus=32, budgets={"H200": 10})
    h.backend._devices = [d.__class__(key=d.key, index=d.index, model="H200") for d in h.backend._devices]
    await h.start()
    try:
        gang = await h.submit("alice", pool="h8", command=("sleep", "5"))
        await h.run_for(0.5)
        singles = [await h.submit(c, pool="h1", command=("sleep", "5")) for c in ("a", "b", "c", "d")]
        await h.run_for(1.0)
        assert h.cp.controller.ledger.used("H200") == 10.0  # 8 + 2 singles; two singles wait
        views = {v["name"]: v for v in h.cp.pools_view()}
        assert views["h1"]["physical"] == 2 and views["h1"]["queued_demand"] == 2
        assert "budget" in views["h1"]["last_plan"]["reason"]
        assert (await h.finish(gang)).state is JobState.SUCCEEDED
        assert h.cp.controller.ledger.peak["H200"] <= 10.0
        for job in singles:
            assert (await h.finish(job, timeout=200.0)).state is JobState.SUCCEEDED
        assert h.cp.controller.ledger.peak["H200"] <= 10.0
    finally:
        await h.stop()


async def test_after_a_restart_recovered_pods_and_their_holds_count_against_the_budget() -> None:
    pool = gpu_pool(max_count=2, caller_hold_seconds=600.0, idle_timeout=600.0)
    h = await Harness([pool], gpus=2, budgets={"fake-gpu": 1}).start()
    job = await h.run_job("alice", pool="gpu")
    await h.run_for(1.0)
    await h.stop()
    again = await Harness([pool], store=h.store, backend=h.backend, clock=h.clock, budgets={"fake-gpu": 1}).start()
    try:
        pod = again.cp.tracker.pods[job.acquisition[0].pod]
        assert pod.held(again.clock.now()) and pod.caller == "alice"  # the hold came back from annotations
        bob = await again.submit("bob", pool="gpu")
        await again.run_for(5.0)
        assert again.cp.controller.ledger.used("fake-gpu") == 1.0  # adopted, not double-booked
        assert len(again.backend.created) == 1 and (again.store.get(bob.id) or bob).state is JobState.QUEUED
        mine = await again.run_job("alice", pool="gpu")
        assert mine.acquisition[0].pod == pod.name and mine.acquisition[0].path == "warm"
    finally:
        await again.stop()


async def test_an_active_standby_group_holds_one_gpu_of_budget_even_after_its_active_pod_goes() -> None:
    h = await Harness([gpu_pool(max_count=2, standbys_per_active=1)], gpus=2, budgets={"fake-gpu": 2}).start()
    try:
        job = await h.run_job("alice", pool="gpu")
        active = h.cp.tracker.pods[job.acquisition[0].pod]
        await h.run_for(1.0)  # the controller stages the standby on the active pod's GPU
        standby = next(p for p in h.cp.tracker.snapshot() if p.standby)
        assert standby.gpus == active.gpus
        assert h.cp.controller.ledger.used("fake-gpu") == 1.0  # the standby adds no GPU
        assert h.cp.pools_view()[0]["physical"] == 1 and h.cp.pools_view()[0]["standby"] == 1
        assert h.cp.controller.retire(active.name)
        await h.run_for(1.0)
        assert h.cp.controller.ledger.holds(standby.name) and h.cp.controller.ledger.used("fake-gpu") == 1.0
        assert h.cp.pools_view()[0]["physical"] == 1 and h.cp.pools_view()[0]["standby"] == 0
    finally:
        await h.stop()
