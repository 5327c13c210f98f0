"""Nothing lost below the ceiling (docs/security.md): in a `boundary` pool a caller's live session (its idle pod
still held: an open MCP conversation, a notebook between cells) is never emptied to serve another session of
the same caller while the pool can make or find another pod; at the ceiling (or the accelerator's budget), with
no pod starting, the least recently used session gives its pod up and its next job's acquisition says so."""

from __future__ import annotations

from broker.claiming.tracker import (
    REASON_NEW_SESSION_RETIRE,
    REASON_TAG_HINT,
    Claim,
    Lease,
    Shortfall,
    Tracker,
)
from broker.claiming.tracking import TAKEN_NOTES
from broker.jobs import JobState
from broker.pods import Origin, Path, Pod, PodState
from broker.pools import PoolSpec
from tests.unit.harness import Harness, cpu_pool


def _tracker(max_count: int, reuse_tag: str = "boundary", ready: int = 1) -> Tracker:
    t = Tracker({"p": PoolSpec(name="p", max_count=max_count, reuse_tag=reuse_tag)})
    for i in range(ready):
        t.add(Pod(f"p{i}", "p", state=PodState.STARTING, origin=Origin.WARM))
        t.ready(f"p{i}", 0.0)
    return t


def _run(t: Tracker, job: str, tag: str, now: float, queue: str = "default") -> Lease | Shortfall:
    got = t.claim(Claim(job, "alice", "p", queue=queue, tag=tag), now)
    if isinstance(got, Lease):
        assert t.start(job)
        t.release(job, ("alice", queue, tag), now, 600.0)
    return got


async def test_below_the_ceiling_another_session_gets_a_new_pod_and_the_live_session_keeps_its_workspace() -> None:
    h = await Harness([cpu_pool(max_count=4)], start_delay=5.0).start()
    try:
        mine = await h.finish(await h.submit(lease_tag="conv-keep", recycle=False), timeout=60.0)
        agent = h.backend.agents[mine.pods[0]]
        # A REST job of another session (recycle defaults to true): it used to take conv-keep's idle pod.
        other = await h.finish(await h.submit(lease_tag="other-work"), timeout=60.0)
        assert other.state is JobState.SUCCEEDED and h.paths(other) == ["new"] and other.pods != mine.pods
        again = await h.run_job(lease_tag="conv-keep", recycle=False)
        assert h.paths(again) == ["warm"] and again.pods == mine.pods and agent.workspace_wiped == 0
    finally:
        await h.stop()


async def test_the_scaler_sees_the_demand_of_a_job_a_live_session_does_not_serve() -> None:
    h = await Harness([cpu_pool(max_count=4)], start_delay=5.0).start()
    try:
        await h.finish(await h.submit(lease_tag="a"), timeout=60.0)
        other = await h.submit(lease_tag="b")
        await h.run_for(1.0)
        # The held pod of session a is no supply for session b below the ceiling: a pod is made for b.
        assert (h.store.get(other.id) or other).state is JobState.QUEUED
        assert len(h.backend.created) == 2 and h.cp.controller.demand == {"cpu": 1}
    finally:
        await h.stop()


def test_at_the_ceiling_the_least_recently_used_session_is_taken_and_its_next_job_is_told() -> None:
    t = _tracker(max_count=2, ready=2)
    _run(t, "a1", "a", 1.0)
    _run(t, "b1", "b", 2.0)
    a_pod = next(p for p in t.pods.values() if p.key == ("alice", "default", "a"))
    c1 = _run(t, "c1", "c", 3.0)
    assert isinstance(c1, Lease) and c1.pods[0] is a_pod and c1.pods[0].path == Path.RECYCLED
    b_pod = next(p for p in t.pods.values() if p.key == ("alice", "default", "b"))
    a2 = _run(t, "a2", "a", 4.0)  # the ceiling again: b is now the least recently used
    assert isinstance(a2, Lease) and a2.pods[0] is b_pod
    assert (a2.pods[0].reason or "").startswith("session a's pod was taken by your session c at the pool ceiling; ")
    a3 = _run(t, "a3", "a", 5.0)  # told once
    assert isinstance(a3, Lease) and a3.pods[0].path == Path.WARM and a3.pods[0].reason is None


def test_no_session_is_taken_while_a_pod_is_starting() -> None:
    t = _tracker(max_count=2)
    _run(t, "a1", "a", 1.0)
    t.add(Pod("coming", "p", state=PodState.STARTING, origin=Origin.DEMAND))
    assert isinstance(t.claim(Claim("b1", "alice", "p", tag="b", since=2.0), 2.0), Shortfall)  # it waits for it
    t.ready("coming", 3.0)
    got = t.claim(Claim("b1", "alice", "p", tag="b", since=2.0), 3.0)
    assert isinstance(got, Lease) and got.pods[0].name == "coming" and got.pods[0].path == Path.NEW


def test_a_full_accelerator_budget_is_a_ceiling_for_takeovers() -> None:
    t = _tracker(max_count=8)
    _run(t, "a1", "a", 1.0)
    assert isinstance(t.claim(Claim("b1", "alice", "p", tag="b"), 2.0), Shortfall)
    t.budget_full = frozenset({"p"})
    got = t.claim(Claim("b1", "alice", "p", tag="b"), 2.0)
    assert isinstance(got, Lease) and got.pods[0].path == Path.RECYCLED


async def test_the_pool_controller_tells_the_tracker_when_the_budget_is_full() -> None:
    h = await Harness([cpu_pool(max_count=4, cpus=1.0)], budgets={"cpu": 1.0}).start()
    try:
        first = await h.run_job(lease_tag="a")
        other = await h.finish(await h.submit(lease_tag="b"), timeout=60.0)
        # No room in the budget for a second pod: the least recently used session's pod is taken over.
        assert h.cp.tracker.budget_full == frozenset({"cpu"})
        assert h.paths(other) == ["recycled"] and other.pods == first.pods
    finally:
        await h.stop()


def test_retire_and_hint_pools_still_recycle_below_the_ceiling() -> None:
    # These modes are the pool's own choice to cross sessions (unchanged): they pass on the old code as well.
    t = _tracker(max_count=8, reuse_tag="retire")
    _run(t, "a1", "a", 1.0)
    got = t.claim(Claim("b1", "alice", "p", tag="b"), 2.0)
    assert isinstance(got, Lease) and got.pods[0].retire and got.pods[0].reason == REASON_NEW_SESSION_RETIRE
    t = _tracker(max_count=8, reuse_tag="hint")
    _run(t, "a1", "a", 1.0)
    got = _run(t, "b1", "b", 2.0)
    assert isinstance(got, Lease) and got.pods[0].path == Path.WARM and got.pods[0].reason == REASON_TAG_HINT
    got = _run(t, "c1", "c", 3.0, queue="eval")
    assert isinstance(got, Lease) and got.pods[0].path == Path.RECYCLED


def test_takeover_notes_are_bounded() -> None:
    t = _tracker(max_count=1)
    _run(t, "s0", "s0", 1.0)
    for i in range(1, TAKEN_NOTES + 10):
        assert isinstance(_run(t, f"s{i}", f"s{i}", 1.0 + i), Lease)
    assert len(t.state.taken) == TAKEN_NOTES


async def test_an_mcp_call_on_a_taken_session_tells_the_model_its_files_are_gone() -> None:
    from broker.sandbox.calls import CallOutcome, Tail
    from mcp_server.results import run_result

    reason = "session conv-keep's pod was taken by your session other-work at the pool ceiling; no idle pod"
    outcome = CallOutcome(job_id="j1", state="SUCCEEDED", exit_code=0, error_class=None, acquisition="recycled",
                          pod="p1", stdout=Tail("", 0), stderr=Tail("", 0), duration_s=0.1, timed_out=False,
                          reason=reason)
    result = await run_result(None, "conv-keep", outcome)  # type: ignore[arg-type]  # (no artifacts to read)
    assert result.structured_content is not None and result.structured_content["acquisition_reason"] == reason
    text = result.content[0].text  # type: ignore[union-attr]
    assert "session conv-keep's pod was taken by your session other-work at the pool ceiling" in text
