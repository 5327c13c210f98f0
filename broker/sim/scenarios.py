"""Scenarios: the paper's workloads and arms run through the engine, one `RunResult` per run.

Loops (§9.1, Table 5): W-Agent (2 or 4 agents) and W-RL under three arms on a venue's benchmark pool:
Reuse On (a stable tag per caller), Reuse Off (a fresh tag per job, the pool's `reuse_tag: retire`
making the tag a retiring boundary) and fresh pod per job (single-use pods). Standby (§9.3, Table 6):
one caller's 30 sequential jobs with a fresh tag each, standby on or off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.jobs import JobSpec
from broker.pools import PoolSpec
from broker.sim.backend import VenueCosts
from broker.sim.engine import RunResult, Simulation
from broker.sim.venues import Venue
from broker.sim.workloads import Arm, Caller, Plan, reuse_tag, standby_loop, workload

KEEP_ALIVE_S = 900.0
"""The benchmark pools' keep-alive and owner hold (App. C.1, Fig. 7: "the 900 s keep-alive")."""

H200_TERMINATION_S = 30.0
"""Pod deletion until its GPU is free again on H200. Table 1 gives no figure; Kubernetes' default 30 s grace
period is what a deleted pod keeps its device for. This is the one constant the simulator adds to the paper's."""


def costs_for(venue: Venue) -> VenueCosts:
    termination = H200_TERMINATION_S if venue.name == "h200" and venue.termination_s == 0 else None
    return VenueCosts(venue, termination_s=termination)


def loop_pool(venue: Venue, arm: Arm, *, standbys: int | None = None, min_count: int = 0) -> PoolSpec:
    """The venue's benchmark pool (App. B.1: a two-GPU cap on H200, a 16-pod cap on CPU) for one arm."""
    gpu = venue.name != "cpu"
    per_active = venue.standbys_per_active if standbys is None else standbys
    return PoolSpec(name="bench", gpus=1 if gpu else 0, accelerator="sim-gpu" if gpu else "cpu",
                    cpus=1.0 if gpu else 4.0, min_count=min_count, max_idle_count=venue.cap, max_count=venue.cap,
                    idle_timeout=KEEP_ALIVE_S, caller_hold_seconds=KEEP_ALIVE_S, step=venue.cap,
                    standbys_per_active=per_active if gpu else 0,
                    reuse_tag="retire" if arm == "reuse-off" else "boundary")


async def run_caller(sim: Simulation, caller: Caller, arm: Arm, pool: str, offset: int = 0, *,
                     labels: Mapping[str, str] | None = None, tag_prefix: str = "") -> None:
    """One caller of a plan: each stage after its pause, the stage's jobs together, then the barrier.
    `labels` mark its jobs (a campaign's arm and repeat); `tag_prefix` starts each of its reuse tags."""
    index = offset
    for stage in caller.stages:
        if stage.pause_s > 0:
            await sim.sleep(stage.pause_s)
        jobs = []
        for job in stage.jobs:
            tag = reuse_tag(arm, caller.name, index)
            spec = JobSpec(pool=pool, command=("sleep", f"{job.body_s:.6f}"),
                           lease_tag=f"{tag_prefix}{tag}" if tag else "", single_use=arm == "fresh-pod")
            jobs.append(await sim.submit(caller.name, spec, kind=job.kind, **(labels or {})))
            index += 1
        await asyncio.gather(*(sim.finish(j) for j in jobs))


def run_plan(plan: Plan, venue: Venue, arm: Arm, seed: int, *, pool: PoolSpec | None = None,
             prewarm: bool | None = None, tick_dispatch: bool = False) -> RunResult:
    """One repeat of a plan under one arm, from an empty pool (`prewarm`: from a pool filled to its cap
    with idle, unheld pods and their standbys, as a repeat that follows another arm's may find it)."""
    spec = pool or loop_pool(venue, arm)
    warm = bool(prewarm)

    async def driver(sim: Simulation) -> None:
        if warm:
            await prewarm_pool(sim, spec)
        sim.mark()
        await asyncio.gather(*(run_caller(sim, c, arm, spec.name) for c in plan.callers))

    gpus = 8 if spec.gpus else 0  # App. B.1: one pinned 8×H200 node
    return Simulation(pools=[spec], costs=costs_for(venue), seed=seed, gpus=gpus,
                      tick_dispatch=tick_dispatch).run(driver)


def run_loop(name: str, venue: Venue, arm: Arm, seed: int, *, tick_dispatch: bool = False) -> RunResult:
    return run_plan(workload(name, seed), venue, arm, seed, tick_dispatch=tick_dispatch)


@dataclass(frozen=True)
class StandbyOutcome:
    result: RunResult
    handovers: int
    by_standby: int
    handover_waits: list[float]


def run_standby(venue: Venue, standby: bool, seed: int) -> StandbyOutcome:
    """Table 6: 30 sequential jobs, a fresh reuse tag each, on the venue's pool with standby on or off.

    A handover is a job that found no idle pod of its own session's predecessor (path standby or new);
    its wait is submit -> first instruction (queueing, a standby's promotion, hand-off). The floor pod (and its standbys) are ready before the loop starts."""
    per_active = max(1, venue.standbys_per_active) if standby else 0
    spec = loop_pool(venue, "reuse-off", standbys=per_active, min_count=1)
    plan = standby_loop(seed)

    async def driver(sim: Simulation) -> None:
        while not _warm(sim, per_active):
            await sim.sleep(1.0)
        sim.mark()
        await run_caller(sim, plan.callers[0], "reuse-off", spec.name)

    result = Simulation(pools=[spec], costs=costs_for(venue), seed=seed, gpus=8).run(driver)
    handovers = [j for j in result.jobs if j.path in ("standby", "new")]
    waits = [w for j in handovers if (w := j.start_latency) is not None]
    return StandbyOutcome(result, len(handovers), sum(1 for j in handovers if j.path == "standby"), waits)


async def prewarm_pool(sim: Simulation, spec: PoolSpec) -> None:
    """Fill the pool to its ceiling (floor = ceiling), wait until every pod and standby is idle, then put
    the floor back: the pods stay, idle and unheld, until their keep-alive runs out."""
    full = dataclasses.replace(spec, min_count=spec.max_count)
    sim.cp.reload_catalog(dataclasses.replace(sim.catalog, pools={spec.name: full}))
    while not _warm(sim, spec.standbys_per_active * spec.max_count, spec.max_count):
        await sim.sleep(1.0)
    sim.cp.reload_catalog(dataclasses.replace(sim.catalog, pools={spec.name: spec}))


def _warm(sim: Simulation, standbys: int, actives: int = 1) -> bool:
    pods = sim.cp.tracker.snapshot()
    idle = sum(1 for p in pods if not p.standby and p.state.value == "idle")
    staged = sum(1 for p in pods if p.standby and p.state.value == "idle")
    return idle >= actives and staged >= standbys


def summary(results: Sequence[RunResult]) -> dict[str, Any]:
    from broker.sim.stats import pooled_percentile

    lat = [r.latencies() for r in results]
    return {"p50": pooled_percentile(lat, 50), "p90": pooled_percentile(lat, 90),
            "makespan": statistics.median(r.makespan for r in results),
            "makespans": [r.makespan for r in results], "p50s": [statistics.median(x) for x in lat],
            "jobs": sum(len(r.jobs) for r in results), "pods_created": statistics.median(r.pods_created for r in results)}
