"""Open-loop scenarios: arrivals over a horizon, the held-capacity frontier (App. C.1) and late binding (Fig. 5).

Held capacity is processor-seconds held by the pool's pods divided by what an always-on pool sized to the
workload's peak concurrency holds over the workload's span (the arrival window's start to the last job's end): peak × span.
The peak, and the start latency an always-on pool gives, come from a reference run of the same arrivals
against a pool that is always full (floor = ceiling, no keep-alive expiry). On the frontier a pod counts
"from binding to deletion, busy, idle or owner-held" (§9.2): a pod kept after the last job counts until
its keep-alive retires it, which is the tail a 900 s keep-alive pays for its overshoot (App. C.1).
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.jobs import JobSpec
from broker.pods import PodState
from broker.pools import PoolSpec
from broker.sim.backend import VenueCosts
from broker.sim.engine import EPOCH, JobRecord, RunResult, Simulation
from broker.sim.scenarios import costs_for
from broker.sim.stats import percentile
from broker.sim.venues import Venue
from broker.sim.workloads import (
    AGENT_BODY_S,
    AGENT_CALLS,
    AGENT_GAP_S,
    AGENT_ITERATIONS,
    AGENT_THINK_S,
    RL_BODY_S,
    Pattern,
    arrivals,
    zipf_environments,
)

CALLERS = 4
"""The agents behind the frontier's sessions, as CPU W-Agent's 4 agents (App. B.2: "37 with 4 agents on CPU").
Each session belongs to one of them at random and has its own reuse tag; owner holds partition idle pods by
caller (§10), so a caller's next session finds its pod warm only while the keep-alive still holds it."""
REFERENCE_POOL = 32
"""Pods of the always-full reference pool: above any peak these workloads reach."""
DRAIN_POLL_S = 30.0
"""How often, after the last job, a frontier run checks whether its pods are all gone (virtual seconds)."""
PROBE_S = 5.0
"""How often a frontier run counts its never-used idle pods (virtual seconds): what an idle cap can retain."""


def peak_concurrency(jobs: Sequence[JobRecord]) -> int:
    """The most jobs holding a pod at once (claim -> finish)."""
    edges: list[tuple[float, int]] = []
    for j in jobs:
        if j.claimed is not None and j.finished is not None:
            edges += [(j.claimed, 1), (j.finished, -1)]
    level = peak = 0
    for _, step in sorted(edges):
        level += step
        peak = max(peak, level)
    return peak


@dataclass
class Cell:
    """One configuration's outcome, relative to the always-on pool at peak."""

    label: str
    held_ratio: float
    p50: float
    p90: float
    hit_rate: float
    pods_created: int
    jobs: int
    peak: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def _cell(label: str, result: RunResult, peak: int, span: float, held: float | None = None) -> Cell:
    lat = result.latencies()
    hits = sum(1 for j in result.jobs if j.path in ("warm", "recycled", "standby"))
    held = result.held if held is None else held
    return Cell(
        label,
        held / max(1e-9, peak * span),
        percentile(lat, 50),
        percentile(lat, 90),
        hits / max(1, len(result.jobs)),
        result.pods_created,
        len(result.jobs),
        peak,
    )


# ---------------------------------------------------------------------------------------- frontier (App. C.1)


@dataclass(frozen=True)
class Knobs:
    """A pool policy of the frontier grid: floor, idle cap, keep-alive (None: never expires), single-use."""

    label: str
    floor: int = 0
    idle_cap: int = 0
    keep_alive: float | None = 60.0
    single_use: bool = False


Session = tuple[float, list[tuple[float, float]]]
"""(start, [(pause before the call, body), ...])."""


def session_plan(pattern: Pattern, rate: float, horizon_s: float, seed: int) -> list[Session]:
    """Agent sessions arriving by `pattern`, each one W-Agent agent's run (§9): 3 iterations of 2–4 calls with
    0.5–2 s think pauses between calls and 2–5 s between iterations."""
    rng = random.Random(f"sessions/{pattern}/{seed}")
    plan = []
    for t in arrivals(pattern, rate, horizon_s, seed):
        calls: list[tuple[float, float]] = []
        for _ in range(AGENT_ITERATIONS):
            n = rng.randint(*AGENT_CALLS)
            for k in range(n):
                pause = 0.0 if not calls else rng.uniform(*(AGENT_GAP_S if k == 0 else AGENT_THINK_S))
                calls.append((pause, rng.uniform(*AGENT_BODY_S)))
        plan.append((t, calls))
    return plan


class SpreadCosts(VenueCosts):
    """The venue's costs with each hand-off drawn from its distribution (§9.2's p99), not fixed at its median.

    With a fixed warm start, the median of a mostly-warm run is that constant, so Δp50 against the always-on
    pool is 0 whatever share of jobs pays a pod start; a spread hand-off lets that share move the median, as it
    does in the paper's Δp50 column (App. C.1)."""

    def handoff(self, rng: random.Random) -> float:
        return float(self.venue.accept_s + self.venue.dispatch_s + self.venue.sample_handoff(rng))


def frontier_pool(knobs: Knobs, ceiling: int) -> PoolSpec:
    return PoolSpec(
        name="cpu",
        cpus=1.0,
        min_count=knobs.floor,
        max_idle_count=knobs.idle_cap,
        max_count=ceiling,
        idle_timeout=knobs.keep_alive,
        step=4,
    )


def run_sessions(venue: Venue, knobs: Knobs, plan: list[Session], seed: int, ceiling: int) -> RunResult:
    """One policy on the plan. `extra` carries `held_to_deletion`, its `held_starting` (pods from create to
    ready) and `held_tail` (after the last job) parts, `max_pods` (the most pods alive at once), `unused_idle`
    (never-used idle pods, the mean over the workload's span) and `empty` (the share of probes that found no pod
    but retiring ones: the only time a floor of 1 adds a pod, App. A.5's floorDeficit)."""
    spec = frontier_pool(knobs, ceiling)
    pick = random.Random(f"owners/{seed}")
    owners = [pick.randrange(CALLERS) for _ in plan]
    ended: list[float] = []
    unused: list[int] = []
    empty: list[bool] = []

    async def session(sim: Simulation, n: int, start: float, calls: list[tuple[float, float]]) -> None:
        await sim.sleep(start)
        caller = f"agent{owners[n]}"
        for think, body in calls:
            if think:
                await sim.sleep(think)
            await sim.run_job(
                caller,
                JobSpec(
                    pool=spec.name,
                    command=("sleep", f"{body:.6f}"),
                    lease_tag=f"s{n}",
                    single_use=knobs.single_use,
                ),
            )

    async def probe(sim: Simulation) -> None:
        while True:  # the idle cap retains only never-used, unheld idle pods (§7, App. A.5)
            pods = sim.cp.tracker.snapshot()
            unused.append(sum(1 for p in pods if p.state is PodState.IDLE and not p.used))
            empty.append(all(p.state is PodState.RETIRING for p in pods))
            await sim.sleep(PROBE_S)

    async def driver(sim: Simulation) -> None:
        while sum(1 for p in sim.cp.tracker.snapshot() if p.state.value == "idle") < knobs.floor:
            await sim.sleep(1.0)  # the floor is ready before the first arrival
        sim.mark()
        probing = asyncio.ensure_future(probe(sim))
        await asyncio.gather(*(session(sim, n, start, calls) for n, (start, calls) in enumerate(plan)))
        probing.cancel()
        ended.append(sim.now())
        if knobs.keep_alive is not None:  # the pods left after the last job count until they are deleted
            # Wait for the floor alone: the idle cap keeps only never-used pods, and a used pod retires when its
            # owner hold expires (§5), so its tail counts to its deletion. A pod still standing when the window
            # ends (the floor's, or one the idle cap keeps) counts to the workload's end, as the floor's.
            standing = knobs.floor
            until = sim.now() + knobs.keep_alive + 2 * DRAIN_POLL_S
            while len(sim.cp.tracker.snapshot()) > standing and sim.now() < until:
                await sim.sleep(DRAIN_POLL_S)

    costs = SpreadCosts(venue, termination_s=costs_for(venue).termination_s)
    sim = Simulation(pools=[spec], costs=costs, seed=seed)
    result = sim.run(driver)
    result.extra["held_to_deletion"] = held_to_deletion(sim, ended[0])
    result.extra.update(held_parts(sim, ended[0]))
    result.extra["empty"] = statistics.fmean(empty) if empty else 0.0
    result.extra["max_pods"] = max_pods(sim)
    result.extra["unused_idle"] = statistics.fmean(unused) if unused else 0.0
    return result


def held_to_deletion(sim: Simulation, workload_end: float) -> float:
    """Processor-seconds of every pod from its binding (or the workload's start) to its deletion (§9.2). A pod
    never deleted (the floor's, or the idle cap's standing pods) counts to the workload's end, as the always-on
    pool's pods do."""
    since, until = sim.began + EPOCH, workload_end + EPOCH
    total = 0.0
    for life in sim.backend.lives.values():
        stop = life.deleted_at if life.deleted_at is not None else until
        total += max(0.0, stop - max(life.created_at, since)) * life.processors
    return total


def held_parts(sim: Simulation, workload_end: float) -> dict[str, float]:
    """Two parts of `held_to_deletion`, processor-seconds: `held_starting`, pods from create to ready (a pod
    start; §9.2 counts from binding, which the scheduler does at the start of it), and `held_tail`, pods kept
    after the workload's last job until their deletion."""
    since, until = sim.began + EPOCH, workload_end + EPOCH
    starting = tail = 0.0
    for life in sim.backend.lives.values():
        stop = life.deleted_at if life.deleted_at is not None else until
        ready = life.ready_at if life.ready_at is not None else stop
        starting += max(0.0, min(ready, stop) - max(life.created_at, since)) * life.processors
        tail += max(0.0, stop - max(until, life.created_at)) * life.processors
    return {"held_starting": starting, "held_tail": tail}


def max_pods(sim: Simulation) -> int:
    """The most pods alive at once (created, not yet deleted): App. C.1's "11–16 against 5–7"."""
    edges: list[tuple[float, int]] = []
    for life in sim.backend.lives.values():
        if not life.standby:
            edges.append((life.created_at, 1))
            if life.deleted_at is not None:
                edges.append((life.deleted_at, -1))
    level = most = 0
    for _, step in sorted(edges):
        level += step
        most = max(most, level)
    return most


def frontier_cells(
    venue: Venue, pattern: Pattern, knobs: Sequence[Knobs], seed: int, *, rate: float, horizon_s: float
) -> tuple[Cell, list[Cell]]:
    """The always-on reference and one cell per policy, for one pattern and seed. The policies' pool has the
    venue's cap as its ceiling (the CPU pool's 16 pods, App. B.1)."""
    plan = session_plan(pattern, rate, horizon_s, seed)
    ref_knobs = Knobs("always-on", floor=REFERENCE_POOL, idle_cap=REFERENCE_POOL, keep_alive=None)
    ref = run_sessions(venue, ref_knobs, plan, seed, REFERENCE_POOL)
    peak = peak_concurrency(ref.jobs)
    reference = _cell("always-on", ref, peak, ref.ended - ref.began)
    reference.held_ratio = 1.0  # by definition: a pool of `peak` pods over the span
    cells = []
    for k in knobs:
        r = run_sessions(venue, k, plan, seed, venue.cap)
        norm = max(1e-9, peak * (r.ended - r.began))
        cell = _cell(k.label, r, peak, r.ended - r.began, r.extra["held_to_deletion"])
        for key in ("max_pods", "unused_idle", "empty"):
            cell.extra[key] = float(r.extra[key])
        cell.extra["new_pod_jobs"] = float(sum(1 for j in r.jobs if j.path == "new"))
        # held ÷ always-on, in parts: pods starting, jobs running (claim -> finish), pods kept after the last job
        cell.extra["starting"] = r.extra["held_starting"] / norm
        busy = sum(j.finished - j.claimed for j in r.jobs if j.claimed is not None and j.finished is not None)
        cell.extra["busy"] = busy / norm
        cell.extra["tail"] = r.extra["held_tail"] / norm
        cells.append(cell)
    return reference, cells


def median_cells(runs: Sequence[Sequence[Cell]]) -> list[Cell]:
    """Per policy, the median over seeds of each figure (App. C.1: "median of 3 seeds")."""
    out = []
    for group in zip(*runs, strict=True):
        first = group[0]
        keys = set().union(*(c.extra for c in group))
        out.append(
            Cell(
                first.label,
                statistics.median(c.held_ratio for c in group),
                statistics.median(c.p50 for c in group),
                statistics.median(c.p90 for c in group),
                statistics.median(c.hit_rate for c in group),
                int(statistics.median(c.pods_created for c in group)),
                sum(c.jobs for c in group),
                int(statistics.median(c.peak for c in group)),
                {k: statistics.median(c.extra.get(k, 0.0) for c in group) for k in sorted(keys)},
            )
        )
    return out


# ---------------------------------------------------------------------------------------- late binding (Fig. 5)

BUDGET = 64
"""App. C.5: a 64-pod budget."""
LB_KEEP_ALIVE_S = 900.0
"""App. C.5: a 900 s keep-alive."""
ROLLOUTS_PER_BATCH = 8
"""W-RL's rollout fan-out (§9)."""


def rollout_plan(
    environments: int, batches: int, gap_s: float, seed: int
) -> list[tuple[float, int, list[float]]]:
    """Rollout batches at steady arrivals: (time, environment, bodies); environments Zipf-popular."""
    rng = random.Random(f"rollouts/{environments}/{seed}")
    envs = zipf_environments(environments, batches, seed)
    times = arrivals("steady", 1.0 / gap_s, batches * gap_s, seed)[:batches]
    return [
        (t, e, [rng.uniform(*RL_BODY_S) for _ in range(ROLLOUTS_PER_BATCH)])
        for t, e in zip(times, envs, strict=False)
    ]


def lb_pools(mode: str, environments: int) -> list[PoolSpec]:
    """`shared`: one late-binding pool; `per-env`: a pool per environment, each up to the budget;
    `split`: a pool per environment with the budget split between them."""

    def pool(name: str, ceiling: int) -> PoolSpec:
        return PoolSpec(
            name=name,
            accelerator="cpu",
            cpus=1.0,
            max_idle_count=ceiling,
            max_count=ceiling,
            idle_timeout=LB_KEEP_ALIVE_S,
            step=ROLLOUTS_PER_BATCH,
        )

    if mode == "shared":
        return [pool("shared", BUDGET)]
    ceiling = BUDGET if mode == "per-env" else max(1, BUDGET // environments)
    return [pool(f"env{k}", ceiling) for k in range(environments)]


def run_rollouts(
    venue: Venue, mode: str, plan: list[tuple[float, int, list[float]]], environments: int, seed: int
) -> RunResult:
    pools = lb_pools(mode, environments)

    async def batch(sim: Simulation, at: float, env: int, bodies: list[float]) -> None:
        await sim.sleep(at)
        name = "shared" if mode == "shared" else f"env{env}"
        jobs = [
            await sim.submit(
                "trainer",
                JobSpec(
                    pool=name,
                    command=("sleep", f"{b:.6f}"),
                    extra={"environment": env} if mode == "shared" else {},
                ),
            )
            for b in bodies
        ]
        await asyncio.gather(*(sim.finish(j) for j in jobs))

    async def driver(sim: Simulation) -> None:
        sim.mark()
        await asyncio.gather(*(batch(sim, t, e, b) for t, e, b in plan))

    budgets = {} if mode == "per-env" else {"cpu": float(BUDGET)}  # per-env: each pool may grow to the budget
    return Simulation(pools=pools, costs=costs_for(venue), seed=seed, budgets=budgets).run(driver)


def late_binding_cells(
    venue: Venue,
    environments: int,
    seed: int,
    *,
    batches: int,
    gap_s: float,
    modes: Sequence[str] = ("shared", "per-env", "split"),
) -> dict[str, Cell]:
    plan = rollout_plan(environments, batches, gap_s, seed)
    # The always-on reference: one pool always holding the budget; its peak concurrency sizes the baseline.
    ref = run_rollouts(venue, "shared", plan, 1, seed)
    out: dict[str, Cell] = {}
    runs = {mode: run_rollouts(venue, mode, plan, environments, seed) for mode in modes}
    peak = peak_concurrency(ref.jobs)
    for mode, r in runs.items():
        out[mode] = _cell(mode, r, peak, r.ended - r.began)
    return out
