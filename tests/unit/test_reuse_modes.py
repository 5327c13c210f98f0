"""Reuse-tag modes per pool (paper §5, §9.5): `retire` retires at a new tag (the paper), `boundary` empties the
workspace and keeps the pod for the new session, `hint` only routes."""

from __future__ import annotations

from broker.jobs import JobState
from tests.unit.harness import Harness, cpu_pool


async def fresh_tag_loop(reuse_tag: str, jobs: int = 20, **knobs: object) -> tuple[float, int, Harness]:
    """One caller's sequential jobs, a fresh tag each, 22 s pod starts: (warm share, pods created)."""
    h = await Harness([cpu_pool(reuse_tag=reuse_tag, min_count=1, **knobs)], start_delay=22.0).start()
    await h.run_for(23.0)  # the floor pod is ready before the loop starts
    warm = 0
    for i in range(jobs):
        job = await h.finish(await h.submit(lease_tag=f"step-{i}", command=("sleep", "1")), timeout=120.0)
        assert job.state is JobState.SUCCEEDED
        warm += h.paths(job) == ["warm"]
        await h.run_for(0.5)  # think time
    await h.stop()
    return warm / jobs, len(h.backend.created), h


async def test_a_hint_tag_keeps_the_loop_warm_where_a_retiring_tag_retires_every_other_pod() -> None:
    retire_warm, retire_pods, _ = await fresh_tag_loop("retire")
    hint_warm, hint_pods, _ = await fresh_tag_loop("hint")
    # The paper's consequence: a hard per-tag boundary keeps about half of the jobs warm and creates a
    # pod per boundary; a routing hint keeps them warm on one pod.
    assert retire_warm <= 0.6 and retire_pods >= 10
    assert hint_warm == 1.0 and hint_pods == 1


async def test_a_boundary_tag_loop_keeps_every_session_until_the_ceiling_then_takes_the_least_recent() -> None:
    warm, pods, h = await fresh_tag_loop("boundary", caller_hold_seconds=600.0)
    # Every held session is kept while the pool can make a pod: each fresh tag gets a new one up to the
    # ceiling (4); from there each takes over the least recently used session's pod (workspace emptied).
    assert pods == 4 and warm == 1 / 20
    assert h.cp.stats.acquisitions[("cpu", "new")] == 3
    assert h.cp.stats.acquisitions[("cpu", "recycled")] == 16


async def test_a_hint_tag_keeps_the_workspace_and_a_boundary_tag_empties_it() -> None:
    for mode, wiped in (("hint", 0), ("boundary", 1), ("retire", 1)):
        h = await Harness([cpu_pool(reuse_tag=mode, max_count=1)]).start()  # `boundary`: a takeover
        try:
            first = await h.run_job(lease_tag="a")
            agent = h.backend.agents[first.pods[0]]
            second = await h.run_job(lease_tag="b")
            assert second.pods == first.pods
            assert agent.workspace_wiped == wiped, mode
        finally:
            await h.stop()


async def test_a_hint_tag_still_treats_a_new_queue_as_a_boundary_that_keeps_the_pod() -> None:
    h = await Harness([cpu_pool(reuse_tag="hint")]).start()
    try:
        first = await h.run_job(lease_tag="a")
        agent = h.backend.agents[first.pods[0]]
        other_queue = await h.run_job(lease_tag="a", queue="eval")
        assert other_queue.pods == first.pods and h.paths(other_queue) == ["recycled"]
        assert agent.workspace_wiped == 1
        await h.run_for(1.0)
        assert first.pods[0] not in h.backend.deleted
        again = await h.run_job(lease_tag="a", queue="eval")
        assert again.pods == first.pods and h.paths(again) == ["warm"] and agent.workspace_wiped == 1
    finally:
        await h.stop()
