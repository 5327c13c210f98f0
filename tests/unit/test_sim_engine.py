"""The simulator's engine: runs are a function of their seed, the real control plane decides, scenarios are sane."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import broker.warmth.pooling as pooling
from broker.jobs import JobSpec
from broker.pods import Pod
from broker.pools import PoolSpec
from broker.sim import openloop, scenarios
from broker.sim.engine import Simulation, SimulationStalled
from broker.sim.venues import cpu, h200
from broker.warmth.scaling import Counts, Plan


def test_the_same_seed_gives_the_same_run_job_for_job() -> None:
    a = scenarios.run_loop("w-agent-2", h200, "reuse-off", seed=3)
    b = scenarios.run_loop("w-agent-2", h200, "reuse-off", seed=3)
    assert a.jobs == b.jobs
    assert (a.held, a.pods_created, a.makespan) == (b.held, b.pods_created, b.makespan)
    c = scenarios.run_loop("w-agent-2", h200, "reuse-off", seed=4)
    assert [j.start_latency for j in c.jobs] != [j.start_latency for j in a.jobs]


def test_every_job_of_a_loop_succeeds_and_a_run_leaves_the_broker_alone() -> None:
    result = scenarios.run_loop("w-rl", h200, "reuse-on", seed=1)
    assert len(result.jobs) == 44  # App. B.2: W-RL submits 44 jobs
    assert {j.state for j in result.jobs} == {"SUCCEEDED"}
    # counted names are put back: the broker's own ids stay random
    from broker.claiming import admission
    assert admission.new_job_id.__module__ == "broker.jobs"


def test_a_broken_scaler_rule_changes_the_simulated_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = scenarios.run_loop("w-agent-4", h200, "reuse-on", seed=2)
    real = pooling.plan

    def one_pod_at_a_time(spec: PoolSpec, pods: list[Pod], counts: Counts, demand: int, now: float,
                          headroom: int | None = None, single_use: int = 0) -> Plan:
        p = real(spec, pods, counts, demand, now, headroom, single_use)
        return dataclasses.replace(p, create=min(p.create, max(0, 1 - counts.starting)))

    monkeypatch.setattr(pooling, "plan", one_pod_at_a_time)
    broken = scenarios.run_loop("w-agent-4", h200, "reuse-on", seed=2)
    assert broken.jobs != healthy.jobs
    assert broken.makespan > healthy.makespan  # the sim's pods come from the scaler it runs, not its own


def test_fresh_pod_per_job_makes_a_pod_for_every_job_and_is_slowest() -> None:
    on = scenarios.run_loop("w-agent-4", h200, "reuse-on", seed=1)
    off = scenarios.run_loop("w-agent-4", h200, "reuse-off", seed=1)
    fresh = scenarios.run_loop("w-agent-4", h200, "fresh-pod", seed=1)
    assert {j.path for j in fresh.jobs} == {"new"}
    assert fresh.pods_created == len(fresh.jobs)
    assert on.makespan < off.makespan < fresh.makespan
    assert min(fresh.latencies()) > h200.cold_start.median_s / 2  # every start waits for a pod


def test_standby_hands_over_faster_than_a_new_pod() -> None:
    on = scenarios.run_standby(h200, True, seed=1)
    off = scenarios.run_standby(h200, False, seed=1)
    assert on.by_standby > 0 and off.by_standby == 0
    assert sorted(on.handover_waits)[len(on.handover_waits) // 2] < 5.0 < min(off.handover_waits)
    assert on.result.makespan < off.result.makespan


def test_a_longer_keep_alive_holds_more_and_a_fresh_pod_pays_the_start() -> None:
    ref, cells = openloop.frontier_cells(
        cpu, "bursty", [openloop.Knobs("15 s", keep_alive=15.0), openloop.Knobs("900 s", keep_alive=900.0),
                        openloop.Knobs("fresh", single_use=True)], seed=1, rate=0.2, horizon_s=240.0)
    short, long_, fresh = cells
    assert short.held_ratio < long_.held_ratio
    assert fresh.p50 - ref.p50 > cpu.cold_start.median_s / 2
    assert ref.peak >= 1 and ref.held_ratio == 1.0


def test_one_late_binding_pool_holds_less_than_a_pool_per_environment() -> None:
    cells = openloop.late_binding_cells(cpu, 16, seed=1, batches=12, gap_s=30.0, modes=("shared", "per-env"))
    assert cells["shared"].held_ratio < cells["per-env"].held_ratio
    assert cells["shared"].hit_rate >= cells["per-env"].hit_rate


def test_a_driver_that_waits_on_nothing_is_reported_not_hung() -> None:
    sim = Simulation(pools=[scenarios.loop_pool(cpu, "reuse-on")], costs=scenarios.costs_for(cpu), seed=1)

    async def stuck(s: Simulation) -> None:
        await s.run_job("a", JobSpec(pool="bench", command=("sleep", "1")))
        await asyncio.Event().wait()

    with pytest.raises(SimulationStalled):
        sim.run(stuck, horizon_s=600.0)
