"""Kernel warmth is learned per pool: after one kernel job every idle pod of the pool is told to keep a
pre-started kernel (never-used and new pods too), the pool forgets after its keep-alive, and a pool that
never served a kernel is never told anything."""

from __future__ import annotations

from broker.errors import AgentError
from broker.ports.agent import FakeAgent
from broker.ports.backend import FakeBackend
from tests.unit.harness import Harness, cpu_pool, gpu_pool

KERNEL = {"kernel": True}


def told(h: Harness) -> dict[str, list[bool]]:
    backend = h.backend
    assert isinstance(backend, FakeBackend)
    return {name: list(agent.kernels_told) for name, agent in backend.agents.items() if agent.kernels_told}


def pods_of(h: Harness, pool: str) -> list[str]:
    return sorted(p.name for p in h.cp.tracker.snapshot() if p.pool == pool)


async def test_one_kernel_job_tells_every_pod_of_its_pool_and_none_of_another() -> None:
    h = await Harness([cpu_pool(name="kern", min_count=3), cpu_pool(name="plain", min_count=2)]).start()
    try:
        await h.run_for(1.0)
        assert len(pods_of(h, "kern")) == 3 and told(h) == {}
        job = await h.run_job("alice", pool="kern", extra=KERNEL)
        await h.run_for(0.5)
        kern = pods_of(h, "kern")
        assert set(told(h)) == set(kern), told(h)  # the kernel's own pod and the two never-used ones
        assert all(words == [True] for words in told(h).values())
        assert job.acquisition[0].pod in kern
        await h.run_job("alice", pool="plain")
        await h.run_for(6.0)
        assert not set(told(h)) & set(pods_of(h, "plain"))  # a pool that never served a kernel pays nothing
    finally:
        await h.stop()


async def test_a_pod_created_while_the_pool_serves_kernels_is_told_when_it_is_ready() -> None:
    h = await Harness([cpu_pool(name="kern", max_count=4)], start_delay=2.0).start()
    try:
        await h.run_job("alice", pool="kern", extra=KERNEL)
        first = pods_of(h, "kern")
        await h.submit("bob", pool="kern", command=("sleep", "5"))  # bob cannot take alice's held pod
        await h.run_for(2.5)
        new = [p for p in pods_of(h, "kern") if p not in first]
        assert new and told(h).get(new[0]) == [True], told(h)
    finally:
        await h.stop()


async def test_the_pool_forgets_after_its_keep_alive_without_kernel_jobs() -> None:
    h = await Harness([cpu_pool(name="kern", min_count=2, idle_timeout=60.0, caller_hold_seconds=30.0)]).start()
    try:
        await h.run_job("alice", pool="kern", extra=KERNEL)
        await h.run_for(1.0)
        assert all(words == [True] for words in told(h).values()) and told(h)
        await h.run_for(55.0)
        assert all(words == [True] for words in told(h).values())
        await h.run_for(10.0)
        remaining = [p for p in pods_of(h, "kern") if p in told(h)]
        assert remaining and all(told(h)[p] == [True, False] for p in remaining), told(h)
    finally:
        await h.stop()


async def test_a_running_kernel_keeps_the_pool_learned_past_its_keep_alive() -> None:
    h = await Harness([cpu_pool(name="kern", min_count=2, idle_timeout=60.0)]).start()
    try:
        job = await h.submit("alice", pool="kern", command=("sleep", "200"), extra=KERNEL)
        await h.run_for(150.0)
        assert all(words == [True] for words in told(h).values()) and len(told(h)) == 2
        await h.finish(job, timeout=100.0)
        await h.run_for(30.0)
        assert all(words == [True] for words in told(h).values())
    finally:
        await h.stop()


async def test_pools_that_prestart_or_stay_cold_and_standby_pods_are_not_told() -> None:
    pools = [cpu_pool(name="always", min_count=1, kernels="prestart"), cpu_pool(name="never", min_count=1,
             kernels="cold"), gpu_pool(name="gpu", min_count=1, standbys_per_active=1, max_count=3)]
    h = await Harness(pools, gpus=1).start()
    try:
        for pool in ("always", "never", "gpu"):
            await h.run_job("alice", pool=pool, extra=KERNEL)
        await h.run_for(6.0)
        standby = {p.name for p in h.cp.tracker.snapshot() if p.standby}
        assert not set(told(h)) & set(pods_of(h, "always") + pods_of(h, "never")), told(h)
        assert not set(told(h)) & standby
        assert set(told(h)) == set(pods_of(h, "gpu")) - standby
    finally:
        await h.stop()


async def test_an_agent_that_did_not_answer_is_told_again_on_the_next_pass() -> None:
    h = await Harness([cpu_pool(name="kern", min_count=2)]).start()
    try:
        await h.run_for(0.5)
        backend = h.backend
        assert isinstance(backend, FakeBackend)
        down = backend.agents[pods_of(h, "kern")[0]]
        assert isinstance(down, FakeAgent)
        answer = down.keep_kernels
        failing = [True]

        async def flaky(keep: bool) -> None:  # only this call fails: the pod may still run the job
            if failing[0]:
                raise AgentError(f"agent of {down.pod} unreachable")
            await answer(keep)

        down.keep_kernels = flaky  # type: ignore[method-assign]
        await h.run_job("alice", pool="kern", extra=KERNEL)
        await h.run_for(0.5)
        assert down.pod not in told(h)
        failing[0] = False
        await h.run_for(5.5)
        assert told(h)[down.pod] == [True]
    finally:
        await h.stop()


async def test_an_agent_without_the_endpoint_is_not_asked_again() -> None:
    h = await Harness([cpu_pool(name="kern", min_count=1)]).start()
    try:
        await h.run_for(0.5)
        backend = h.backend
        assert isinstance(backend, FakeBackend)
        old = backend.agents[pods_of(h, "kern")[0]]
        calls: list[bool] = []

        async def refuse(keep: bool) -> None:
            calls.append(keep)
            raise AgentError("agent of pod refused POST /v1/kernels: 404 no such endpoint", {"status": 404})

        old.keep_kernels = refuse  # type: ignore[method-assign]
        await h.run_job("alice", pool="kern", extra=KERNEL)
        await h.run_for(12.0)
        assert calls == [True]
    finally:
        await h.stop()
