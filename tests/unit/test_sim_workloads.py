"""The paper's workloads as seeded plans (§9, App. B.2, C.1, C.5)."""

from __future__ import annotations

import math

import pytest

from broker.sim.workloads import (
    BURST_ON_S,
    BURST_PERIOD_S,
    arrivals,
    reuse_tag,
    standby_loop,
    w_agent,
    w_rl,
    workload,
    zipf_environments,
    zipf_weights,
)


def test_w_rl_is_four_barrier_iterations_of_8_rollouts_2_evals_1_update() -> None:
    plan = w_rl(seed=1)
    assert plan.jobs == 44  # App. B.2: "W-RL submits 44 jobs"
    (trainer,) = plan.callers
    assert [(s.jobs[0].kind, len(s.jobs)) for s in trainer.stages] == [("rollout", 8), ("eval", 2), ("update", 1)] * 4
    assert all(s.pause_s == 0 for s in trainer.stages)
    assert all(1.5 <= j.body_s <= 4.0 for s in trainer.stages for j in s.jobs)


def test_w_agent_runs_three_iterations_of_two_to_four_calls_ending_in_verify() -> None:
    for agents in (2, 4):
        plan = w_agent(agents, seed=3)
        assert len(plan.callers) == agents
        for caller in plan.callers:
            kinds = [s.jobs[0].kind for s in caller.stages]
            assert kinds.count("verify") == 3 and kinds[-1] == "verify"
            assert 6 <= caller.jobs <= 12
            assert caller.stages[0].pause_s == 0.0
            for prev, stage in zip(caller.stages, caller.stages[1:], strict=False):
                lo, hi = (2.0, 5.0) if prev.jobs[0].kind == "verify" else (0.5, 2.0)
                assert lo <= stage.pause_s <= hi
            assert all(0.5 <= s.jobs[0].body_s <= 1.6 and len(s.jobs) == 1 for s in caller.stages)


def test_plans_are_fixed_by_their_seed() -> None:
    assert w_agent(4, seed=7) == w_agent(4, seed=7)
    assert w_agent(4, seed=7) != w_agent(4, seed=8)
    assert w_rl(2) == w_rl(2) != w_rl(3)
    assert workload("w-agent-2", 5) == w_agent(2, 5)


def test_the_standby_benchmark_is_one_callers_30_sequential_jobs() -> None:
    plan = standby_loop(seed=0)
    assert len(plan.callers) == 1 and plan.jobs == 30
    assert all(len(s.jobs) == 1 for s in plan.callers[0].stages)


def test_arm_tags_stable_per_caller_fresh_per_job_or_none() -> None:
    assert reuse_tag("reuse-on", "agent1", 0) == reuse_tag("reuse-on", "agent1", 5) == "agent1"
    assert reuse_tag("reuse-off", "agent1", 0) != reuse_tag("reuse-off", "agent1", 1)
    assert reuse_tag("fresh-pod", "agent1", 0) is None


def test_scaling_a_plan_scales_bodies_and_pauses_only() -> None:
    plan = w_agent(2, seed=1)
    small = plan.scaled(0.1)
    assert small.jobs == plan.jobs
    assert small.callers[0].stages[1].pause_s == pytest.approx(plan.callers[0].stages[1].pause_s * 0.1)
    assert small.callers[1].stages[0].jobs[0].body_s == pytest.approx(plan.callers[1].stages[0].jobs[0].body_s * 0.1)


def test_unknown_workload_is_an_error() -> None:
    with pytest.raises(ValueError):
        workload("w-chess", 1)


def test_arrival_patterns_share_a_mean_rate_but_cluster_differently() -> None:
    horizon, rate = 36_000.0, 0.5
    steady = arrivals("steady", rate, horizon, seed=1)
    bursty = arrivals("bursty", rate, horizon, seed=1)
    diurnal = arrivals("diurnal", rate, horizon, seed=1)
    for times in (steady, bursty, diurnal):
        assert abs(len(times) / (rate * horizon) - 1.0) < 0.05
        assert all(0 <= t < horizon for t in times) and list(times) == sorted(times)
    in_burst = sum(1 for t in bursty if t % BURST_PERIOD_S < BURST_ON_S) / len(bursty)
    assert in_burst == pytest.approx(0.6, abs=0.03)  # a fifth of the time carries 60% of the arrivals
    mid = sum(1 for t in diurnal if horizon / 4 <= t < 3 * horizon / 4) / len(diurnal)
    assert mid == pytest.approx(0.5 + 0.8 / math.pi, abs=0.02)  # the 'day' peaks mid-horizon: 1/2 + 0.8/pi
    assert arrivals("steady", rate, 100.0, seed=2) == arrivals("steady", rate, 100.0, seed=2)


def test_zipf_popularity_with_s_1() -> None:
    assert zipf_weights(1) == (1.0,)
    assert zipf_weights(2) == pytest.approx((2 / 3, 1 / 3))
    envs = zipf_environments(64, 20_000, seed=1)
    assert set(envs) <= set(range(64))
    share0 = envs.count(0) / len(envs)
    assert share0 == pytest.approx(1 / sum(1 / k for k in range(1, 65)), abs=0.02)  # 1/H_64 = 0.21
    assert envs == zipf_environments(64, 20_000, seed=1)
