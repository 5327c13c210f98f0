"""Session continuity (issue 9): the pod a session's first job runs on is that session's pod from then on,
whatever path it came by; `reuse_tag: retire` keeps the paper's retire-after-one-job rule."""

from __future__ import annotations

from broker.claiming.tracker import (
    REASON_NEW_SESSION_RETIRE,
    REASON_TAKEOVER,
    Claim,
    Lease,
    Shortfall,
    Tracker,
)
from broker.jobs import JobState
from broker.pods import Origin, Path, Pod, PodState
from broker.pools import PoolSpec
from tests.unit.harness import Harness, cpu_pool


def _tracker(reuse_tag: str, pods: int = 1) -> Tracker:
    t = Tracker({"p": PoolSpec(name="p", max_count=pods, reuse_tag=reuse_tag)})
    for i in range(pods):
        t.add(Pod(f"p{i}", "p", state=PodState.STARTING, origin=Origin.WARM))
        t.ready(f"p{i}", 0.0)
    return t


def _run(t: Tracker, job: str, caller: str, tag: str, now: float = 1.0, recycle: bool = True) -> Lease | Shortfall:
    got = t.claim(Claim(job, caller, "p", tag=tag, recycle=recycle), now)
    if isinstance(got, Lease):
        assert t.start(job)
        t.release(job, (caller, "default", tag), now, 600.0)
    return got


def test_a_recycled_pod_becomes_the_new_sessions_pod_in_the_tracker() -> None:
    t = _tracker("boundary")
    _run(t, "a1", "alice", "a")
    b1 = _run(t, "b1", "alice", "b")
    # A pool of one pod is at its ceiling: the other session's pod is taken over (a `boundary` pool's only recycle).
    assert isinstance(b1, Lease) and b1.pods[0].path == Path.RECYCLED and b1.pods[0].reason == REASON_TAKEOVER
    pod = t.pods["p0"]
    assert pod.state is PodState.IDLE and not pod.retire and pod.key == ("alice", "default", "b")
    for i in range(2, 5):
        got = _run(t, f"b{i}", "alice", "b")
        assert isinstance(got, Lease) and got.pods[0] is pod and pod.path == Path.WARM


def test_retire_mode_marks_a_recycled_pod_to_retire_after_its_one_job() -> None:
    t = _tracker("retire")
    _run(t, "a1", "alice", "a")
    got = t.claim(Claim("b1", "alice", "p", tag="b"), 1.0)
    assert isinstance(got, Lease) and got.pods[0].retire and got.pods[0].reason == REASON_NEW_SESSION_RETIRE
    assert t.start("b1")
    t.release("b1", ("alice", "default", "b"), 1.0, 600.0)
    assert t.pods["p0"].state is PodState.RETIRING


def test_another_caller_never_recycles_a_pod_whatever_the_mode() -> None:
    for mode in ("boundary", "hint", "retire"):
        t = _tracker(mode)
        _run(t, "a1", "alice", "a")
        for recycle in (True, False):
            got = t.claim(Claim(f"bob-{recycle}", "bob", "p", tag="a", recycle=recycle), 1.0)
            assert isinstance(got, Shortfall), mode


def test_the_least_recently_used_other_session_gives_its_pod_up_first() -> None:
    t = _tracker("boundary", pods=2)
    _run(t, "a1", "alice", "a", now=1.0)
    _run(t, "b1", "alice", "b", now=2.0)
    a_pod = next(p for p in t.pods.values() if p.key == ("alice", "default", "a"))
    got = _run(t, "c1", "alice", "c", now=3.0)
    assert isinstance(got, Lease) and got.pods[0] is a_pod and a_pod.path == Path.RECYCLED


async def test_a_session_that_starts_on_a_recycled_pod_keeps_it_and_its_workspace_across_jobs() -> None:
    h = await Harness([cpu_pool(max_count=1)]).start()
    try:
        old = await h.run_job(lease_tag="session-a")
        agent = h.backend.agents[old.pods[0]]
        jobs = [await h.run_job(lease_tag="session-b") for _ in range(4)]
        assert all(j.state is JobState.SUCCEEDED for j in jobs)
        assert h.paths(jobs[0]) == ["recycled"] and "this session's pod" in (jobs[0].acquisition[0].reason or "")
        assert [h.paths(j) for j in jobs[1:]] == [["warm"]] * 3
        assert {j.pods for j in jobs} == {old.pods}
        assert agent.workspace_wiped == 1  # emptied once, at the boundary; kept for the rest of the session
        assert old.pods[0] not in h.backend.deleted
    finally:
        await h.stop()


async def test_the_old_session_no_longer_finds_its_pod_warm_and_is_told_who_took_it() -> None:
    h = await Harness([cpu_pool(max_count=1)]).start()
    try:
        a1 = await h.run_job(lease_tag="session-a")
        agent = h.backend.agents[a1.pods[0]]
        b1 = await h.run_job(lease_tag="session-b")
        assert b1.pods == a1.pods and h.paths(b1) == ["recycled"]
        a2 = await h.run_job(lease_tag="session-a")
        assert h.paths(a2) == ["recycled"] and agent.workspace_wiped == 2
        assert (a2.acquisition[0].reason or "").startswith(
            "session session-a's pod was taken by your session session-b at the pool ceiling")
        a3 = await h.run_job(lease_tag="session-a")  # its pod again, warm, and nothing more to tell
        assert h.paths(a3) == ["warm"] and a3.pods == a1.pods and a3.acquisition[0].reason is None
    finally:
        await h.stop()


async def test_reuse_tag_retire_runs_once_on_the_old_pod_then_retires() -> None:
    h = await Harness([cpu_pool(reuse_tag="retire")]).start()
    try:
        first = await h.run_job(lease_tag="session-a")
        agent = h.backend.agents[first.pods[0]]
        second = await h.run_job(lease_tag="session-b")
        assert h.paths(second) == ["recycled"] and second.pods == first.pods
        assert "retire" in (second.acquisition[0].reason or "")
        assert agent.workspace_wiped == 1  # the second session started on an emptied workspace
        await h.run_for(1.0)
        assert first.pods[0] in h.backend.deleted
        third = await h.run_job(lease_tag="session-b")
        assert third.pods != first.pods
    finally:
        await h.stop()


async def test_retire_mode_replaces_a_recycled_pod_while_it_runs_so_the_session_stays_warm() -> None:
    h = await Harness([cpu_pool(reuse_tag="retire")], start_delay=1.0).start()
    try:
        old = await h.run_job(lease_tag="a")
        crossing = await h.run_job(lease_tag="b", command=("sleep", "2"))
        assert h.paths(crossing) == ["recycled"]
        assert len(h.backend.created) == 2  # the replacement started while the recycled pod ran
        after = await h.run_job(lease_tag="b")
        assert h.paths(after) == ["warm"] and after.pods != old.pods
        assert after.timings["first_instruction_at"] - after.timings["submitted_at"] < 0.1
    finally:
        await h.stop()


async def test_a_takeover_at_the_ceiling_retires_in_retire_mode() -> None:
    h = await Harness([cpu_pool(max_count=1, reuse_tag="retire")]).start()
    try:
        a = await h.run_job(lease_tag="conv-A", recycle=False)
        b = await h.run_job(lease_tag="conv-B", recycle=False)
        assert h.paths(b) == ["recycled"] and b.pods == a.pods
        await h.run_for(1.0)
        assert a.pods[0] in h.backend.deleted
    finally:
        await h.stop()


async def test_no_pod_ever_serves_two_callers_across_session_changes() -> None:
    h = await Harness([cpu_pool(max_count=2)]).start()
    try:
        jobs = []
        for i in range(4):
            for caller in ("alice", "bob"):
                jobs.append(await h.run_job(caller, lease_tag=f"s{i % 2}"))
        callers_by_pod: dict[str, set[str]] = {}
        for job in jobs:
            assert job.state is JobState.SUCCEEDED
            callers_by_pod.setdefault(job.pods[0], set()).add(job.caller)
        assert all(len(c) == 1 for c in callers_by_pod.values()), callers_by_pod
    finally:
        await h.stop()
