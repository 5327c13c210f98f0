"""Holds broken at the ceiling for a set (a gang confined to one node or domain, a single-use set) are broken only
when the breaks let the whole set be made: the set is made whole or not at all, so room short of it serves nobody
and the broken holds' owners would pay their cold starts for nothing (paper App. A.3/§7: a hold breaks early
only for a job blocked at the pool ceiling)."""

from __future__ import annotations

from broker.claiming.setsearch import REASON_NO_SET
from broker.fleet.nodes import Node
from broker.jobs import JobState
from broker.pods import Pod, PodState
from broker.warmth.holds import BlockedSet, breaks_for_sets, hold_units
from broker.warmth.placing import fleet_of
from tests.unit.harness import Harness, cpu_pool, gpu_pool


async def _carol_holds_two_bob_runs(busy: int, max_count: int = 4) -> Harness:
    """Carol ran two sessions (a pod each, idle and held for her past the hold tenure); bob's long jobs keep
    `busy` pods running."""
    h = await Harness([cpu_pool(max_count=max_count, caller_hold_seconds=600.0, idle_timeout=600.0)]).start()
    for tag in ("a", "b"):
        await h.finish(await h.submit("carol", lease_tag=tag, recycle=False))
    for i in range(busy):
        await h.submit("bob", lease_tag=f"b{i}", command=("sleep", "1000"))
    await h.run_for(61.0)
    idle = [p for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE]
    assert [p.caller for p in idle] == ["carol", "carol"]
    return h


async def test_holds_are_not_broken_for_a_confined_set_the_breaks_cannot_make_fit() -> None:
    """Room 2 once carol's two holds break, but alice's gang needs 3 on one node: nobody gains, carol keeps both."""
    h = await _carol_holds_two_bob_runs(busy=2)
    try:
        gang = await h.submit("alice", pods=3, topology="node", lease_tag="g", command=("sleep", "5"))
        await h.run_for(10.0)
        assert h.cp.dispatcher.waiting_reason[gang.id].startswith(REASON_NO_SET)
        assert h.cp.controller.holds_broken == {}
        assert sorted(p.caller or "" for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE) == ["carol"] * 2
        assert (h.store.get(gang.id) or gang).state is JobState.QUEUED
    finally:
        await h.stop()


async def test_a_confined_set_the_breaks_make_fit_breaks_only_as_many_as_it_needs() -> None:
    """Room 2 (one busy pod under a ceiling of 5): one break, carol's oldest, makes room for the whole set of 3."""
    h = await _carol_holds_two_bob_runs(busy=1, max_count=5)
    try:
        oldest = min((p for p in h.cp.tracker.snapshot() if p.caller == "carol"), key=lambda p: p.created_at)
        gang = await h.finish(await h.submit("alice", pods=3, topology="node", lease_tag="g"), timeout=10.0)
        assert gang.state is JobState.SUCCEEDED and h.paths(gang) == ["new", "new", "new"]
        assert h.cp.controller.holds_broken == {"cpu": 1} and oldest.name in h.backend.deleted
        assert len([p for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE and p.caller == "carol"]) == 1
    finally:
        await h.stop()


async def test_a_plain_job_blocked_at_the_ceiling_still_breaks_a_hold_beside_a_set_that_cannot_fit() -> None:
    h = await _carol_holds_two_bob_runs(busy=2)
    try:
        gang = await h.submit("alice", pods=3, topology="node", lease_tag="g", command=("sleep", "5"))
        dave = await h.submit("dave", command=("sleep", "1"))
        done = await h.finish(dave, timeout=10.0)
        assert done.state is JobState.SUCCEEDED and h.paths(done) == ["new"]
        assert h.cp.controller.holds_broken == {"cpu": 1}  # dave's one pod, not the gang's unreachable three
        assert (h.store.get(gang.id) or gang).state is JobState.QUEUED
    finally:
        await h.stop()


def _pod(name: str, node: str, *, caller: str | None = None, created_at: float = 0.0) -> Pod:
    """A pod of the 1-GPU pool on `node`: idle and held for `caller` (created at `created_at`), else running."""
    pod = Pod(name, "gpu", (f"{name}-gpu",), state=PodState.IDLE if caller else PodState.RUNNING,
              created_at=created_at)
    pod.node = node
    if caller is not None:
        pod.used, pod.caller, pod.key, pod.hold_until = True, caller, (caller, "default", ""), 1000.0
    return pod


def _breaks(pods: list[Pod], blocked: list[BlockedSet]) -> list[str]:
    spec = gpu_pool(max_count=len(pods))
    nodes = [Node(n, tuple(f"{n}-g{i}" for i in range(4)), domain="r1") for n in ("n0", "n1")]
    units = hold_units(pods, {}, now=100.0)
    fleet = lambda: fleet_of(nodes, pods, {"gpu": spec})  # noqa: E731
    return [p.name for p in breaks_for_sets(units, blocked, 0, spec, fleet)]


def test_no_hold_breaks_for_a_node_set_when_no_node_would_have_room_for_it() -> None:
    """Three breaks give the ceiling room for three pods, but two on n0 and one on n1: the set needs one node."""
    pods = [_pod("b0", "n0"), _pod("b1", "n0"), _pod("b2", "n1"), _pod("b3", "n1"), _pod("b4", "n1"),
            _pod("dave", "n1", caller="dave", created_at=1.0),
            _pod("carol0", "n0", caller="carol", created_at=2.0), _pod("carol1", "n0", caller="carol", created_at=3.0)]
    assert _breaks(pods, [BlockedSet(3, "node")]) == []
    assert _breaks(pods, [BlockedSet(2, "node")]) == ["carol0", "carol1"]  # n0's two: dave's on n1 frees no room there
    assert _breaks(pods, [BlockedSet(3, "domain")]) == ["dave", "carol0", "carol1"]  # both nodes are one domain


def test_hold_breaks_for_sets_stop_at_the_fewest_that_fit_each_in_dispatch_order() -> None:
    pods = [_pod("b0", "n0"), _pod("b1", "n1"), _pod("b2", "n1"), _pod("b3", "n1"),
            *(_pod(f"carol{i}", "n0", caller="carol", created_at=float(i)) for i in range(3)),
            _pod("dave", "n1", caller="dave", created_at=9.0)]
    assert _breaks(pods, [BlockedSet(2, "node")]) == ["carol0", "carol1"]
    # The first set fits on n0 with three breaks; the second, 2 more, never fits: no break for it.
    assert _breaks(pods, [BlockedSet(3, "node"), BlockedSet(2, "node")]) == ["carol0", "carol1", "carol2"]
    # Beside a pod already made for it on n1: only dave's pod there frees room; carol's older three on n0 keep theirs.
    assert _breaks(pods, [BlockedSet(1, "node", ("n1",))]) == ["dave"]
