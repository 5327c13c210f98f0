"""A session whose next job is queued keeps its idle pod: another session of the same caller does not recycle
it first (found by the simulator's tenant campaign, docs/simulator.md "Findings")."""

from __future__ import annotations

from broker.claiming.tracker import Claim, Lease, Shortfall, Tracker
from broker.jobs import JobState
from broker.pods import Origin, Path, Pod, PodState
from broker.pools import PoolSpec
from tests.unit.harness import Harness, cpu_pool


def _tracker_with_alices_pod_of(tag: str) -> Tracker:
    t = Tracker({"p": PoolSpec(name="p", max_count=1, reuse_tag="retire")})
    t.add(Pod("p0", "p", state=PodState.STARTING, origin=Origin.WARM))
    t.ready("p0", 0.0)
    got = t.claim(Claim("a1", "alice", "p", tag=tag), 1.0)
    assert isinstance(got, Lease) and t.start("a1")
    t.release("a1", ("alice", "default", tag), 2.0, 600.0)
    return t


def test_a_new_session_does_not_recycle_the_pod_of_a_session_with_a_queued_job() -> None:
    t = _tracker_with_alices_pod_of("a")
    t.queued_sessions = frozenset({("alice", "default", "a")})
    for recycle in (True, False):  # neither a recycle nor a takeover at the ceiling
        assert isinstance(
            t.claim(Claim(f"b-{recycle}", "alice", "p", tag="b", recycle=recycle), 3.0), Shortfall
        )
    own = t.claim(Claim("a2", "alice", "p", tag="a"), 3.0)
    assert isinstance(own, Lease) and own.pods[0].name == "p0" and own.pods[0].path == Path.WARM


def test_a_new_session_still_recycles_the_pod_of_a_session_with_nothing_queued() -> None:
    t = _tracker_with_alices_pod_of("a")
    t.queued_sessions = frozenset({("alice", "default", "b")})  # only the new session itself waits
    got = t.claim(Claim("b1", "alice", "p", tag="b"), 3.0)
    assert isinstance(got, Lease) and got.pods[0].path == Path.RECYCLED and got.pods[0].retire


async def test_a_queued_older_session_job_does_not_take_the_pod_a_queued_session_job_runs_on_warm() -> None:
    # Pool of one pod, the tag a retiring boundary. While alice's session `a` runs, a job of her new session `b`
    # and then session `a`'s next job queue. When `a` ends, dispatch (oldest first) used to give its pod to `b`
    # (run once, retire), and `a`'s next job waited for a new pod; now `a`'s job runs warm and `b` follows.
    h = await Harness([cpu_pool(max_count=1, reuse_tag="retire")], start_delay=20.0).start()
    try:
        first = await h.submit(lease_tag="a", command=("sleep", "5"))
        await h.until(lambda: (h.store.get(first.id) or first).state is JobState.RUNNING, timeout=60)
        other = await h.submit(lease_tag="b")
        again = await h.submit(lease_tag="a")
        again = await h.finish(again, timeout=120)
        other = await h.finish(other, timeout=120)
        first = await h.finish(first)
        assert h.paths(again) == ["warm"] and again.pods == first.pods
        assert (
            again.timings["first_instruction_at"] - again.timings["submitted_at"] < 10.0
        )  # no 20 s pod start
        assert h.paths(other) == ["recycled"] and other.pods == first.pods
        assert len(h.backend.created) == 1  # `b`'s one job across the boundary ran on the pod `a` left
    finally:
        await h.stop()
