"""Campaigns: a column's arms back to back on one pool (carry-over), tick-era loops, tenants beside the benchmark."""

from __future__ import annotations

import dataclasses

from broker.jobs import JobSpec
from broker.sim import campaigns, tables
from broker.sim.backend import VenueCosts
from broker.sim.engine import Simulation
from broker.sim.scenarios import costs_for, loop_pool
from broker.sim.venues import cpu, h200
from broker.sim.workloads import workload


def test_a_campaign_is_a_function_of_its_seeds() -> None:
    a = campaigns.run_campaign(
        "w-agent-2", h200, ("reuse-on", "reuse-off"), [1, 2], tick_dispatch=True, tick_reconcile=True
    )
    b = campaigns.run_campaign(
        "w-agent-2", h200, ("reuse-on", "reuse-off"), [1, 2], tick_dispatch=True, tick_reconcile=True
    )
    assert [(r.arm, r.repeat, r.result.jobs) for r in a] == [(r.arm, r.repeat, r.result.jobs) for r in b]


def test_arms_alternate_in_williams_order_and_later_arms_start_warm() -> None:
    runs = campaigns.run_campaign("w-agent-2", h200, ("reuse-on", "reuse-off"), [1, 2, 3])
    assert [(r.repeat, r.arm) for r in runs] == [
        (0, "reuse-on"),
        (0, "reuse-off"),
        (1, "reuse-off"),
        (1, "reuse-on"),
        (2, "reuse-on"),
        (2, "reuse-off"),
    ]
    assert all(len(r.result.jobs) == workload("w-agent-2", [1, 2, 3][r.repeat]).jobs for r in runs)
    first, later = runs[0], runs[1:]
    assert first.paths()["new"] == 2  # the campaign starts from an empty pool: each agent waits for a pod
    # every later arm finds what the one before left: no agent's first job waits for a new pod
    assert all(r.paths()["new"] == 0 for r in later)


def test_reuse_on_tags_start_a_new_session_each_repeat() -> None:
    runs = campaigns.run_campaign("w-agent-2", h200, ("reuse-on",), [1, 2])
    tags = {r.repeat: {j.tag for j in r.result.jobs} for r in runs}
    assert tags[0].isdisjoint(tags[1])
    assert len(tags[0]) == 2  # one stable tag per agent within a repeat


def test_tenant_jobs_share_the_pool_but_stay_out_of_the_arms() -> None:
    load = campaigns.TenantLoad(0.2)
    runs = campaigns.run_campaign(
        "w-agent-4",
        cpu,
        ("reuse-on", "reuse-off"),
        [1],
        tick_dispatch=True,
        tick_reconcile=True,
        tenants=load,
    )
    assert all(j.caller.startswith("agent") for r in runs for j in r.result.jobs)
    alone = campaigns.run_campaign(
        "w-agent-4", cpu, ("reuse-on", "reuse-off"), [1], tick_dispatch=True, tick_reconcile=True
    )
    assert [r.result.jobs for r in runs] != [r.result.jobs for r in alone]  # the tenants took pods and room


def test_tick_era_reconcile_waits_for_the_controller_pass() -> None:
    """With the controller's event wake-ups cut, a queued job's pod is created at the next 30 s pass."""
    spec = loop_pool(cpu, "reuse-on")
    job = JobSpec(pool=spec.name, command=("sleep", "1"), lease_tag="t")

    def first_start(tick: bool) -> float:
        async def driver(sim: Simulation) -> None:
            await sim.sleep(1.0)  # after the start-up pass, so only a later pass can create the pod
            sim.mark()
            await sim.run_job("a", job)

        result = Simulation(pools=[spec], costs=costs_for(cpu), seed=1, tick_reconcile=tick).run(driver)
        latency = result.jobs[0].start_latency
        assert latency is not None
        return latency

    event, tick = first_start(False), first_start(True)
    assert tick > event + 20.0  # waited most of the 30 s pass on top of the pod start


def test_loop_columns_carry_acquisition_paths_and_the_papers_r3_paths() -> None:
    cols = tables.loop_columns(seed=1, repeats=2, venues=("h200",))
    off = next(c for c in cols if c["baseline"] == "reuse-off")
    assert off["paper_paths"]["reuse-off"] == {"warm": 33, "standby": 66, "recycled": 71, "new": 20}
    jobs = sum(workload("w-agent-2", s).jobs for s in (1000, 1001))
    assert sum(off["paths_off"].values()) == jobs and set(off["paths_off"]) >= set(tables.PATHS)
    rows = tables.loop_rows(columns=cols)
    assert any("waited for a new pod" in r["metric"] for r in rows)


def test_the_reuse_off_column_prints_held_gpu_time_beside_app_c2() -> None:
    cols = tables.loop_columns(seed=1, repeats=2, venues=("h200",))
    off = next(c for c in cols if c["baseline"] == "reuse-off")
    # Two cards at most, for at most each arm's makespan: per job no more than 2 x makespan / jobs.
    jobs = sum(workload("w-agent-2", s).jobs for s in (1000, 1001))
    assert 0 < off["held_per_job_off"] <= 2 * sum(off["makespans_off"]) / jobs
    assert 0 < off["creating_share_off"] < 1  # Reuse Off makes pods (App. C.2: 35% of its GPU time)
    row = next(r for r in tables.loop_rows(columns=cols) if "GPU-s held" in r["metric"])
    assert row["ours"] == off["held_per_job_off"] and row["paper"].startswith("10.7")


def test_a_retiring_pod_keeps_its_place_under_the_cap_until_its_termination_ends() -> None:
    """§9.1: under the cap a job "waits for the previous pod's deletion and a new pod"; the third job's wait
    grows by the termination the costs give, since its pod may be created only once the retiring one is gone."""
    spec = dataclasses.replace(
        loop_pool(h200, "reuse-off", standbys=0), max_count=1, max_idle_count=1, step=1
    )

    def third_wait(costs: VenueCosts) -> float:
        async def driver(sim: Simulation) -> None:
            sim.mark()
            for tag in ("a", "b", "c"):  # b runs once on a's pod, which then retires
                await sim.run_job("agent", JobSpec(pool=spec.name, command=("sleep", "1"), lease_tag=tag))

        result = Simulation(pools=[spec], costs=costs, seed=1, gpus=8).run(driver)
        assert [str(j.path) for j in result.jobs] == ["new", "recycled", "new"]
        wait = result.jobs[2].start_latency
        assert wait is not None
        return wait

    with_termination = third_wait(costs_for(h200))  # 30 s (broker.sim.scenarios.H200_TERMINATION_S)
    without = third_wait(VenueCosts(h200, termination_s=0.0))
    assert with_termination - without > 25.0
