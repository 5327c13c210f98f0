"""A gang confined to one node (or domain) that waits for its set counts the idle pods held for its caller that its
claim takes (its session's, or any of its caller's when it may recycle): the set made for it is only the rest,
beside them, and they keep their hold at the ceiling, as an owner's holds do while its queued jobs could take them
(broker.warmth.holds). Held pods it cannot use are no part of its set and spare nothing."""

from __future__ import annotations

from broker.claiming.setsearch import REASON_NO_SET
from broker.fleet.nodes import Fleet, Node
from broker.jobs import JobState
from broker.pods import Pod, PodState
from broker.warmth.placing import held_beside
from tests.unit.harness import Harness, cpu_pool


async def _alice_holds_two(max_count: int, busy: int = 0, tags: tuple[str, str] = ("a", "b")) -> Harness:
    """Alice ran two jobs side by side (a pod each, idle and held for her past the hold tenure), in sessions
    `tags`; `busy` pods run bob's long jobs."""
    h = await Harness([cpu_pool(max_count=max_count, caller_hold_seconds=600.0, idle_timeout=600.0)]).start()
    both = [await h.submit("alice", lease_tag=tag, recycle=False, command=("sleep", "1")) for tag in tags]
    for job in both:
        await h.finish(job)
    for i in range(busy):
        await h.submit("bob", lease_tag=f"b{i}", command=("sleep", "1000"))
    await h.run_for(61.0)
    assert sum(1 for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE and p.caller == "alice") == 2
    return h


async def test_a_confined_gangs_set_is_made_beside_its_callers_held_pods() -> None:
    h = await _alice_holds_two(max_count=4, tags=("g", "g"))  # (a `boundary` pool keeps other sessions' pods)
    try:
        before = set(h.backend.created)
        gang = await h.finish(await h.submit("alice", pods=3, topology="node", lease_tag="g"), timeout=10.0)
        assert gang.state is JobState.SUCCEEDED
        # Two warm pods, and one made for the rest.
        assert sorted(h.paths(gang)) == ["new", "warm", "warm"]
        assert len(set(h.backend.created) - before) == 1 and h.cp.controller.holds_broken == {}
    finally:
        await h.stop()


async def test_held_pods_that_complete_a_waiting_set_keep_their_hold_at_the_ceiling() -> None:
    h = await _alice_holds_two(max_count=3, busy=1, tags=("g", "g"))
    try:
        gang = await h.submit("alice", pods=3, topology="node", lease_tag="g", command=("sleep", "5"))
        await h.run_for(0.5)
        assert h.cp.dispatcher.waiting_reason[gang.id].startswith(REASON_NO_SET)
        carol = await h.submit("carol", command=("sleep", "1"))
        await h.run_for(5.0)
        # Alice's gang will take them: they are not broken for carol.
        assert h.cp.controller.holds_broken == {}
        idle = [p for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE]
        assert [p.caller for p in idle] == ["alice", "alice"]
        assert (h.store.get(carol.id) or carol).state is JobState.QUEUED  # she waits for room like the gang
        assert h.cp.controller.last_plan["cpu"].create == 0
    finally:
        await h.stop()


async def test_held_pods_a_gang_may_not_take_spare_nothing() -> None:
    """recycle=False: alice's pods of other sessions are not the gang's; they give way for its whole set."""
    h = await _alice_holds_two(max_count=4)
    try:
        spec = {"pods": 3, "topology": "node", "lease_tag": "g", "recycle": False}
        gang = await h.finish(await h.submit("alice", **spec), timeout=10.0)
        assert gang.state is JobState.SUCCEEDED and h.paths(gang) == ["new", "new", "new"]
        # Its whole set is blocked at the ceiling: one gives way, which with the room there was fits the set.
        assert h.cp.controller.holds_broken == {"cpu": 1}
    finally:
        await h.stop()


def _held(name: str, node: str, key: tuple[str, str, str], hold_until: float = 100.0) -> Pod:
    pod = Pod(name, "gpu", (f"{name}-gpu",), state=PodState.IDLE)
    pod.node, pod.used, pod.caller, pod.key, pod.hold_until = node, True, key[0], key, hold_until
    return pod


def test_held_beside_takes_the_group_with_most_or_the_one_its_set_was_made_in() -> None:
    fleet = Fleet([Node(n, (f"{n}-g0",), domain=d) for n, d in (("n0", "r1"), ("n1", "r1"), ("n2", "r2"))])
    me, other = ("alice", "q", "s"), ("alice", "q", "t")
    pods = [
        _held("a", "n0", me),
        _held("b", "n1", other),
        _held("c", "n1", other),
        _held("d", "n2", other, 1.0),
        _held("e", "n2", ("bob", "q", "s")),
    ]
    names = lambda held: sorted(p.name for p in held)  # noqa: E731
    assert names(held_beside(fleet, pods, (me, True), "node", [], now=10.0)) == ["b", "c"]
    assert names(held_beside(fleet, pods, (me, True), "domain", [], now=10.0)) == ["a", "b", "c"]
    assert names(held_beside(fleet, pods, (me, False), "node", [], now=10.0)) == ["a"]  # its session's only
    # Beside the pods made for its set; on n2, d's hold expired and e is bob's.
    assert names(held_beside(fleet, pods, (me, True), "node", ["n0"], now=10.0)) == ["a"]
    assert held_beside(fleet, pods, (me, True), "node", ["n2"], now=10.0) == []


async def test_on_gpu_nodes_the_rest_is_made_on_the_held_pods_node_or_the_set_whole_elsewhere() -> None:
    from broker.clock import VirtualClock
    from broker.ports.backend import FakeBackend
    from tests.unit.harness import gpu_pool

    backend = FakeBackend(VirtualClock(), gpus=8, gpus_per_node=4)
    pool = gpu_pool(max_count=8, step=8, caller_hold_seconds=600.0, idle_timeout=600.0)
    h = await Harness([pool], backend=backend, clock=backend.clock).start()  # type: ignore[arg-type]
    try:
        both = [await h.submit("alice", pool="gpu", lease_tag="g", command=("sleep", "1")) for _ in range(2)]
        for job in both:
            await h.finish(job)
        node = {p.name: p.node for p in h.cp.tracker.snapshot()}
        [held_on] = {n for n in node.values()}  # best-fit put both on one node
        gang = await h.finish(
            await h.submit("alice", pool="gpu", pods=4, topology="node", lease_tag="g"), 10.0
        )
        assert sorted(h.paths(gang)) == ["new", "new", "warm", "warm"]
        assert {p.node for p in h.cp.tracker.snapshot() if p.name in gang.pods} == {held_on}
        # Now node `held_on` holds four idle pods of alice; a 3-pod gang of another session that may not recycle
        # takes none of them: its whole set is made on the other node.
        other = await h.finish(
            await h.submit("alice", pool="gpu", pods=3, topology="node", lease_tag="h", recycle=False), 10.0
        )
        assert h.paths(other) == ["new", "new", "new"]
        assert {p.node for p in h.cp.tracker.snapshot() if p.name in other.pods} != {held_on}
    finally:
        await h.stop()
