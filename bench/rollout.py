"""Paper Table 7 / App. C.3: a template rollout under saturated load, and borrowed capacity, in virtual time.

Both run the real control plane (tracker, dispatcher, scaler, budgets) over the in-memory store and the
fake backend on a virtual clock, with the paper's 22.1 s pod start as the venue model, as the paper's
simulator does. Rollout: an 8-pod pool (floor 4, idle cap 6, ceiling 8, drain budget 1), 12 callers
with no think time, a template edit; the same run without the edit is the baseline for ∆p50.
Borrowing: a pool with no budget of its own borrows published capacity, then the owner reclaims part
of it in cycles; we time borrowing and release and count GPUs released per GPU the owner needed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from bench.common import Row, at_least, at_most, median, report
from broker.clock import VirtualClock
from broker.control import ControlPlane, Tuning
from broker.jobs import Job, JobSpec, JobState
from broker.pods import PodState
from broker.pools import Catalog, PoolSpec
from broker.ports.backend import FakeBackend
from broker.ports.capacity import StaticCapacitySource
from broker.ports.logs import MemoryLogStore
from broker.ports.store import MemoryJobStore

POD_START_S = 22.1
"""The paper's cached cold start on H200 (App. C.5), the venue model here."""
STEP_S = 0.1


class Sim:
    """A control plane on a virtual clock, stepped by hand."""

    def __init__(self, pools: list[PoolSpec], *, gpus: int, budgets: dict[str, float] | None = None,
                 capacity: StaticCapacitySource | None = None) -> None:
        self.clock = VirtualClock()
        self.store = MemoryJobStore()
        self.backend = FakeBackend(self.clock, gpus=gpus, start_delay=POD_START_S)
        self.cp = ControlPlane(clock=self.clock, store=self.store, backend=self.backend, logs=MemoryLogStore(self.clock.now),
                               catalog=Catalog(pools={p.name: p for p in pools}, budgets=budgets or {}),
                               tuning=Tuning(), capacity=capacity)
        self.t0 = self.clock.now()

    @property
    def now(self) -> float:
        return self.clock.now() - self.t0

    async def step(self, seconds: float = STEP_S) -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        self.clock.advance(seconds)
        for _ in range(20):
            await asyncio.sleep(0)

    async def submit(self, caller: str, pool: str, seconds: float) -> Job:
        job, _ = await self.cp.submit(caller, JobSpec(pool=pool, command=("sleep", str(seconds)), lease_tag=caller))
        return job

    def row(self, job: Job) -> Job:
        return self.store.get(job.id) or job


async def rollout(job_s: float, edit_at: float, horizon: float, edit: bool) -> dict[str, Any]:
    spec = PoolSpec(name="h200", gpus=1, accelerator="fake-gpu", min_count=4, max_idle_count=6, max_count=8,
                    idle_timeout=300.0, caller_hold_seconds=60.0, step=8, drain_budget=1)
    sim = Sim([spec], gpus=8)
    await sim.cp.start()
    callers = [f"c{i:02d}" for i in range(12)]
    current: dict[str, Job] = {}
    done: list[Job] = []
    max_pods = max_draining = 0
    old: set[str] = set()
    converged: float | None = None
    while sim.now < horizon:
        for c in callers:
            job = current.get(c)
            row = sim.row(job) if job else None
            if row is None or row.terminal:
                if row is not None:
                    done.append(row)
                current[c] = await sim.submit(c, "h200", job_s)
        if edit and not old and sim.now >= edit_at:
            old = {p.name for p in sim.cp.tracker.snapshot()}
            sim.cp.reload_catalog(Catalog(pools={"h200": dataclasses.replace(spec, template={"image": "v2"})}))
        await sim.step()
        pods = [p for p in sim.cp.tracker.snapshot() if p.state is not PodState.GONE]
        max_pods = max(max_pods, len(pods))
        if old:
            max_draining = max(max_draining, sum(1 for p in pods if p.name in old and
                                                 (p.state is PodState.RETIRING or p.retire)))
            if converged is None and not any(p.name in old for p in pods):
                converged = sim.now - edit_at
    await sim.cp.tasks.stop()
    window = [j for j in done if j.timings["submitted_at"] - sim.t0 >= edit_at]
    waits = [j.timings["claimed_at"] - j.timings["submitted_at"] for j in window]
    waited = [j for j in window if j.acquisition[0].reason is not None]
    overtakes = sum(1 for a in waited for b in waited if a.timings["submitted_at"] < b.timings["submitted_at"]
                    and a.timings["claimed_at"] > b.timings["claimed_at"])
    return {"converged": converged, "failed": sum(1 for j in done if j.state is not JobState.SUCCEEDED),
            "served": len({j.caller for j in window}), "longest_wait": max(waits, default=0.0),
            "p50_wait": median(waits), "overtakes": overtakes, "max_pods": max_pods, "max_draining": max_draining}


async def borrowing(cycles: int, job_s: float) -> dict[str, Any]:
    capacity = StaticCapacitySource({})
    spec = PoolSpec(name="burst", gpus=1, accelerator="fake-gpu", max_count=8, max_idle_count=8,
                    idle_timeout=600.0, caller_hold_seconds=600.0, step=8, borrow=True)
    sim = Sim([spec], gpus=8, budgets={"fake-gpu": 0}, capacity=capacity)
    await sim.cp.start()
    borrow = sim.cp.controller.borrowing
    assert borrow is not None
    jobs = [await sim.submit(f"b{i}", "burst", job_s) for i in range(8)]
    published = sim.now
    capacity.set("fake-gpu", 8)
    while sim.cp.pools_view()[0]["borrowed"] < 8 or any(p.state is PodState.STARTING
                                                       for p in sim.cp.tracker.snapshot()):
        await sim.step()
    borrow_s = sim.now - published
    release_s: list[float] = []
    ratios: list[float] = []
    over = 0
    for i in range(cycles):
        need = 1 + i % 3
        before = borrow.released.get("fake-gpu", 0.0)
        start = sim.now
        capacity.set("fake-gpu", 8 - need)  # the owner reclaims `need` GPUs
        while borrow.ledger.used("fake-gpu") > 8 - need:
            for j, job in enumerate(jobs):  # keep the borrowers busy: release waits for running jobs
                if sim.row(job).terminal:
                    jobs[j] = await sim.submit(f"b{j}", "burst", job_s)
            await sim.step()
        release_s.append(sim.now - start)
        ratios.append((borrow.released.get("fake-gpu", 0.0) - before) / need)
        capacity.set("fake-gpu", 8)  # the owner's burst ends: borrowable again
        while borrow.ledger.used("fake-gpu") < 8:
            for j, job in enumerate(jobs):
                if sim.row(job).terminal:
                    jobs[j] = await sim.submit(f"b{j}", "burst", job_s)
            await sim.step()
            over = max(over, int(borrow.ledger.used("fake-gpu") > (borrow.ledger.limit("fake-gpu") or 0)))
    await sim.cp.tasks.stop()
    return {"borrow_s": borrow_s, "release_s": median(release_s), "ratio": median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "over": over}


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench rollout", description=__doc__)
    parser.add_argument("--job-s", type=float, default=10.0, help="job body length (s)")
    parser.add_argument("--horizon", type=float, default=1500.0, help="virtual seconds per rollout run")
    parser.add_argument("--cycles", type=int, default=10, help="owner reclaim cycles")
    args = parser.parse_args(argv)
    edit_at = 300.0
    rolled = asyncio.run(rollout(args.job_s, edit_at, args.horizon, edit=True))
    base = asyncio.run(rollout(args.job_s, edit_at, args.horizon, edit=False))
    borrowed = asyncio.run(borrowing(args.cycles, 20.0))
    dp50 = rolled["p50_wait"] - base["p50_wait"]
    rows = [
        Row("T7", "rollout, saturated 8-pod pool: converged after (virtual)", rolled["converged"], "s",
            "324 s [286, 359]"),
        Row("T7", "rollout: failed jobs", rolled["failed"], "jobs", "0", "0", rolled["failed"] == 0),
        Row("T7", "rollout: callers served after the edit (of 12)", rolled["served"], "callers", "12/12", "12",
            at_least(rolled["served"], 12)),
        Row("T7", "rollout: overtakes of the longest waiter", rolled["overtakes"], "pairs", "0", "0",
            rolled["overtakes"] == 0),
        Row("T7", "rollout: most pods at once (ceiling 8)", rolled["max_pods"], "pods", "<= 8", "<= 8",
            at_most(rolled["max_pods"], 8)),
        Row("T7", "rollout: most stale pods draining at once (budget 1)", rolled["max_draining"], "pods", "1",
            "<= 1", at_most(rolled["max_draining"], 1)),
        Row("T7", "rollout: longest wait", rolled["longest_wait"], "s", "181-242 s"),
        Row("T7", "rollout: Δp50 wait vs the same run without rollout", dp50, "s", "+0.03 s"),
        Row("T7", "borrowing: publish -> 8 borrowed pods ready (poll + 22.1 s start)", borrowed["borrow_s"],
            "s", "11.8 s (kwok)"),
        Row("T7", f"borrowing: owner reclaim -> GPUs released (median of {args.cycles}, 20 s jobs)",
            borrowed["release_s"], "s", "30.0 s"),
        Row("T7", "borrowing: borrowed GPUs released per owner GPU (median)", borrowed["ratio"], "GPU/GPU",
            "1.0", "1.0", borrowed["ratio_min"] == borrowed["ratio_max"] == 1.0),
        Row("T7", "borrowing: passes over the published ceiling", borrowed["over"], "passes", "0", "0",
            borrowed["over"] == 0),
    ]
    return report("rollout", rows, json_out=json_out, extra={"rollout": rolled, "baseline": base,
                                                            "borrowing": borrowed})
