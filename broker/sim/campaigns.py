"""Campaigns: a column's paired repeats run back to back on one pool, as the paper ran them (App. B.3).

The paper interleaves a column's arms per repeat in a Williams crossover "to balance carry-over (e.g. warm
pods left by the previous arm)": each arm after the first starts from whatever the previous arm left —
owner-held pods, idle pods, staged standbys — not from an empty pool. A campaign is one `Simulation` in
which repeat r runs the arms in `crossover_order(arms, r)`, each arm starting as the previous one ends.
One pool serves every arm, with the tag as a retiring boundary (§5 rule 2, the paper's default): Reuse
On's stable tags never cross it, Reuse Off's fresh tags cross it at every job.

Tenant load (the CPU columns ran "beside steady tenant load", App. B.1): other callers' agent sessions
arrive open-loop into the same pool and share its cap for the whole campaign; their jobs are not the
benchmark's and are left out of every arm's figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from broker.jobs import JobSpec
from broker.pools import PoolSpec
from broker.sim.engine import EPOCH, RunResult, Simulation
from broker.sim.scenarios import costs_for, loop_pool, run_caller
from broker.sim.stats import crossover_order
from broker.sim.venues import Venue
from broker.sim.workloads import AGENT_BODY_S, AGENT_CALLS, AGENT_THINK_S, Arm, Caller, arrivals, workload

TENANT_CALLERS = 4
"""Other tenants' callers, as App. C.1's CPU session mix (broker.sim.openloop.CALLERS)."""
TENANT_WARMUP_S = 300.0
"""Tenant load runs this long before the first repeat, so the benchmark starts beside a load already steady
(ours: about 14 of the CPU venue's pod starts; the paper says only "steady")."""
TENANT_HORIZON_S = 6 * 3600.0
"""Tenant arrivals are drawn this far ahead; the campaign ends long before and the rest are cancelled."""


@dataclass(frozen=True)
class TenantLoad:
    """Steady open-loop agent sessions of other callers in the benchmark's pool (W-Agent's call shapes)."""

    sessions_per_s: float
    """Mean session arrival rate (steady Poisson arrivals, App. C.1's steady pattern)."""

    def label(self) -> str:
        return f"{self.sessions_per_s:g} sessions/s"


@dataclass(frozen=True)
class ArmRun:
    """One arm of one repeat, cut out of the campaign."""

    arm: Arm
    repeat: int
    result: RunResult

    def paths(self) -> Counter[str]:
        return Counter(str(j.path) for j in self.result.jobs)


def run_campaign(
    name: str,
    venue: Venue,
    arms: Sequence[Arm],
    seeds: Sequence[int],
    *,
    tick_dispatch: bool = False,
    tick_reconcile: bool = False,
    tenants: TenantLoad | None = None,
    seed: int | None = None,
) -> list[ArmRun]:
    """Every repeat (one plan per seed) under every arm in Williams order, on one pool in one simulation."""
    spec = loop_pool(venue, "reuse-off")  # the tag a retiring boundary; every arm of the campaign shares it
    marks: list[tuple[Arm, int, float, float, int]] = []
    first_seed = seeds[0] if seed is None else seed

    async def driver(sim: Simulation) -> None:
        tenant = asyncio.ensure_future(_tenants(sim, spec, tenants, first_seed)) if tenants else None
        try:
            if tenants:
                await sim.sleep(TENANT_WARMUP_S)
            sim.mark()
            for r, s in enumerate(seeds):
                plan = workload(name, s)
                for arm in crossover_order(list(arms), r):
                    began, created = sim.now(), sim.backend.pods_created(spec.name)
                    await asyncio.gather(*(_caller(sim, c, arm, spec.name, r) for c in plan.callers))
                    marks.append((arm, r, began, sim.now(), created))
        finally:
            if tenant is not None:
                tenant.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tenant

    sim = Simulation(
        pools=[spec],
        costs=costs_for(venue),
        seed=first_seed,
        gpus=8 if spec.gpus else 0,
        tick_dispatch=tick_dispatch,
        tick_reconcile=tick_reconcile,
    )
    whole = sim.run(driver)
    out = []
    for arm, r, began, ended, created in marks:
        jobs = [j for j in whole.jobs if j.labels.get("arm") == arm and j.labels.get("repeat") == str(r)]
        held = sim.backend.held_processor_seconds(ended + EPOCH, began + EPOCH)
        creating = sim.backend.creating_processor_seconds(ended + EPOCH, began + EPOCH)
        made = sum(
            1
            for life in sim.backend.lives.values()
            if not life.standby and began + EPOCH <= life.created_at < ended + EPOCH
        )
        out.append(
            ArmRun(
                arm,
                r,
                RunResult(
                    jobs=jobs,
                    began=began,
                    ended=ended,
                    held=held,
                    pods_created=made,
                    peak_starting=whole.peak_starting,
                    extra={"pods_before": created, "creating": creating},
                ),
            )
        )
    return out


async def _caller(sim: Simulation, caller: Caller, arm: Arm, pool: str, repeat: int) -> None:
    # Tags carry the repeat so no arm's session continues another's; the caller keeps its name across arms,
    # so its held pods carry over (the paper's carry-over).
    await run_caller(
        sim, caller, arm, pool, labels={"arm": arm, "repeat": str(repeat)}, tag_prefix=f"r{repeat}-{arm}-"
    )


async def _tenants(sim: Simulation, spec: PoolSpec, load: TenantLoad, seed: int) -> None:
    """Tenant sessions: each of 2–4 calls (W-Agent's bodies and think pauses), a fresh tag per session."""
    rng = random.Random(f"tenants/{seed}")
    running: set[asyncio.Future[None]] = set()
    zero = sim.now()
    try:
        for n, t in enumerate(arrivals("steady", load.sessions_per_s, TENANT_HORIZON_S, seed)):
            await sim.sleep(max(0.0, zero + t - sim.now()))
            calls = [
                (0.0 if k == 0 else rng.uniform(*AGENT_THINK_S), rng.uniform(*AGENT_BODY_S))
                for k in range(rng.randint(*AGENT_CALLS))
            ]
            task = asyncio.ensure_future(
                _session(sim, spec, f"tenant{rng.randrange(TENANT_CALLERS)}", f"t{n}", calls)
            )
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for left in list(running):
            left.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def _session(
    sim: Simulation, spec: PoolSpec, caller: str, tag: str, calls: list[tuple[float, float]]
) -> None:
    for think, body in calls:
        if think:
            await sim.sleep(think)
        await sim.run_job(
            caller, JobSpec(pool=spec.name, command=("sleep", f"{body:.6f}"), lease_tag=tag), kind="tenant"
        )
