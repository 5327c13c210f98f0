"""Topology as a job field and a guarantee at the claim: a `node` gang takes its whole set from one node, a
`domain` gang from one topology domain, or it waits (and the pool controller makes it a whole set on one
node); `any` keeps today's behaviour. Plus the field on the wire, the SDK and the CLI."""

from __future__ import annotations

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from broker.claiming.setsearch import REASON_NO_SET
from broker.claiming.tracker import Claim, Lease, Shortfall, Tracker
from broker.clock import VirtualClock
from broker.jobs import JobSpec, JobState
from broker.pods import Origin, Pod, PodState
from broker.ports.backend import FakeBackend
from tests.unit.harness import Harness, cpu_pool, gpu_pool

DOMAINS = {"a": "rack-1", "b": "rack-1", "c": "rack-2", "d": "rack-2"}


def _fleet(fresh: dict[str, int], held: dict[str, int] | None = None, topology: str = "any") -> Tracker:
    """A tracker with never-used idle pods per node (`fresh`) and alice's idle pods of session `s` (`held`)."""
    tracker = Tracker({"gpu": gpu_pool(max_count=64, topology=topology)})
    tracker.set_domains(DOMAINS)
    for node, n in fresh.items():
        for i in range(n):
            pod = Pod(f"{node}{i}", "gpu", (f"{node}-gpu{i}",), state=PodState.IDLE)
            pod.node = node
            tracker.add(pod)
    for node, n in (held or {}).items():
        for i in range(n):
            pod = Pod(f"{node}-held{i}", "gpu", (f"{node}-gpu-held{i}",), state=PodState.IDLE)
            pod.node, pod.used, pod.caller, pod.key = node, True, "alice", ("alice", "default", "s")
            pod.hold_until = 1e9
            tracker.add(pod)
    return tracker


CASES = [
    # (id, fresh pods per node, alice's held pods per node, job topology, pool topology, pods,
    #  the nodes the set lands on, or None: it takes nothing)
    ("node: never split, though 4 are idle", {"a": 2, "b": 2}, {}, "node", "any", 4, None),
    ("any: today's behaviour spreads", {"a": 2, "b": 2}, {}, "any", "any", 4, {"a", "b"}),
    ("node: the tightest node that holds them", {"a": 2, "b": 5, "c": 4}, {}, "node", "any", 4, {"c"}),
    ("node: the held pod on another node is not taken", {"b": 4}, {"a": 1}, "node", "any", 4, {"b"}),
    ("any: the held pod is taken first and the set splits", {"b": 4}, {"a": 1}, "any", "any", 4, {"a", "b"}),
    (
        "node: the node with the session's pod comes first",
        {"a": 4, "b": 3},
        {"b": 1},
        "node",
        "any",
        4,
        {"b"},
    ),
    ("domain: two nodes of one rack", {"a": 2, "b": 2, "c": 3}, {}, "domain", "any", 4, {"a", "b"}),
    ("domain: never across racks", {"a": 2, "c": 3}, {}, "domain", "any", 4, None),
    ("node: the pool default applies", {"a": 2, "b": 2}, {}, "", "node", 4, None),
    ("any: the job overrides its pool", {"a": 2, "b": 2}, {}, "any", "node", 4, {"a", "b"}),
    ("node: one pod is never confined", {"a": 1}, {}, "node", "any", 1, {"a"}),
]


@pytest.mark.parametrize(
    ("fresh", "held", "topology", "pool_topology", "pods", "expect"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_confined_gang_takes_one_group_or_nothing(
    fresh: dict[str, int],
    held: dict[str, int],
    topology: str,
    pool_topology: str,
    pods: int,
    expect: set[str] | None,
) -> None:
    tracker = _fleet(fresh, held, pool_topology)
    got = tracker.claim(Claim("job-1", "alice", "gpu", "default", "s", pods=pods, topology=topology), now=0.0)
    if expect is None:
        assert isinstance(got, Shortfall) and got.reason.startswith(REASON_NO_SET)
        assert all(p.state is PodState.IDLE for p in tracker.snapshot())  # a shortfall takes nothing
    else:
        assert isinstance(got, Lease) and len(got.pods) == pods
        assert {p.node for p in got.pods} == expect


def test_pods_without_a_node_are_one_group() -> None:
    """A backend that reports no nodes (a CPU pool): nothing says the pods are apart, so the gang runs."""
    tracker = Tracker({"cpu": cpu_pool(topology="node")})
    for i in range(3):
        tracker.add(Pod(f"p{i}", "cpu", state=PodState.IDLE))
    got = tracker.claim(Claim("job-1", "alice", "cpu", pods=3), now=0.0)
    assert isinstance(got, Lease) and len(got.pods) == 3


def test_a_set_made_for_a_gang_is_taken_whole_and_its_spare_pods_join_the_pool() -> None:
    tracker = _fleet({"a": 4})
    for i in range(5):  # the controller made five for it on b (one more than it needs: a retried create)
        pod = Pod(
            f"made{i}",
            "gpu",
            (f"b-gpu{i}",),
            state=PodState.STARTING,
            origin=Origin.DEMAND,
            reserved_for="gang",
        )
        tracker.add(pod)
        assert tracker.ready(pod.name, 1.0, pod.gpus, "b")
    lease = tracker.claim(Claim("gang", "bob", "gpu", pods=4, topology="node", since=0.5), now=2.0)
    assert isinstance(lease, Lease)
    assert {p.node for p in lease.pods} == {"b"} and all(p.name.startswith("made") for p in lease.pods)
    assert all(p.reserved_for is None for p in lease.pods)
    assert {p.path for p in lease.pods} == {"new"}
    spare = tracker.claim(Claim("other", "carol", "gpu", pods=5, topology="node"), now=2.0)
    assert isinstance(spare, Shortfall)  # a has 4, b has 1 spare: no node holds 5
    single = [tracker.claim(Claim(f"one{i}", "carol", "gpu"), now=2.0) for i in range(5)]
    assert all(isinstance(s, Lease) for s in single)  # the spare made pod is a plain pool pod now


def test_pods_made_for_a_gang_that_left_join_the_pool_starting_or_idle() -> None:
    tracker = _fleet({})
    idle = Pod(
        "made-idle", "gpu", ("b-gpu0",), state=PodState.STARTING, origin=Origin.DEMAND, reserved_for="gone"
    )
    starting = Pod(
        "made-starting",
        "gpu",
        ("b-gpu1",),
        state=PodState.STARTING,
        origin=Origin.DEMAND,
        reserved_for="gone",
    )
    for pod in (idle, starting):
        tracker.add(pod)
    tracker.ready("made-idle", 1.0, ("b-gpu0",), "b")
    assert isinstance(
        tracker.claim(Claim("x", "carol", "gpu"), now=1.0), Shortfall
    )  # reserved: not the pool's
    tracker.unreserve([idle, starting])
    assert idle.reserved_for is None and starting.reserved_for is None
    tracker.ready("made-starting", 2.0, ("b-gpu1",), "b")
    lease = tracker.claim(Claim("y", "carol", "gpu", pods=2, topology="node"), now=2.0)
    assert isinstance(lease, Lease) and {p.name for p in lease.pods} == {"made-idle", "made-starting"}


def _pinned_fleet() -> Harness:
    """2 fake nodes × 4 GPUs; pools `pin0`/`pin1` hold one node each, `gpu` may use both."""
    backend = FakeBackend(VirtualClock(), gpus=8, gpus_per_node=4)
    pools = [
        gpu_pool(name=f"pin{i}", max_count=1, step=1, node_selector={"firepool.dev/node": f"fake-node-{i}"})
        for i in (0, 1)
    ]
    pools.append(gpu_pool(max_count=8, step=8, topology="any"))
    return Harness(pools, backend=backend, clock=backend.clock)  # type: ignore[arg-type]


@pytest.mark.parametrize("single_use", [False, True], ids=["pool gang", "single-use gang"])
async def test_a_node_gang_waits_rather_than_split_and_its_set_is_made_on_one_node(single_use: bool) -> None:
    h = await _pinned_fleet().start()
    try:
        # One GPU busy on each node: 6 free, but no node has 4.
        short = await h.submit("carol", pool="pin0", command=("sleep", "5"), single_use=True)
        long = await h.submit("carol", pool="pin1", command=("sleep", "1000"), single_use=True)
        await h.until(lambda: all((h.store.get(j.id) or j).state is JobState.RUNNING for j in (short, long)))
        gang = await h.submit(
            "bob", pool="gpu", pods=4, topology="node", command=("sleep", "1"), single_use=single_use
        )
        await h.run_for(2.0)
        assert (h.store.get(gang.id) or gang).state is JobState.QUEUED
        reason = h.cp.dispatcher.waiting_reason[gang.id]
        assert reason.startswith("single-use pod starting" if single_use else REASON_NO_SET)
        assert [p for p in h.cp.tracker.snapshot() if p.pool == "gpu"] == []  # no part of a set is made
        gang = await h.finish(gang)  # carol's short job ends; its single-use pod frees node 0
        assert gang.state is JobState.SUCCEEDED
        assert {h.backend.requests[p].node for p in gang.pods} == {"fake-node-0"}
        # ...and the backend is told the set must share a node (a cluster scheduler then requires it).
        assert {h.backend.requests[p].gang_topology for p in gang.pods} == {"" if single_use else "node"}
        assert {a.path for a in gang.acquisition} == {"new"}
        assert all(
            p.reserved_for is None for p in h.cp.tracker.snapshot() if p.pool == "gpu" and not single_use
        )
    finally:
        await h.stop()


async def test_an_any_gang_on_the_same_fleet_runs_split_at_once() -> None:
    h = await _pinned_fleet().start()
    try:
        for pool in ("pin0", "pin1"):
            await h.submit("carol", pool=pool, command=("sleep", "1000"), single_use=True)
        await h.run_for(1.0)
        gang = await h.finish(await h.submit("bob", pool="gpu", pods=4, command=("sleep", "1")), timeout=10.0)
        assert gang.state is JobState.SUCCEEDED
        node = {p.name: p.node for p in h.cp.tracker.snapshot()}
        assert {node[p] for p in gang.pods} == {"fake-node-0", "fake-node-1"}
    finally:
        await h.stop()


async def test_topology_rides_the_wire_and_an_unknown_one_is_422() -> None:
    h = await Harness([cpu_pool()]).start()
    app = create_app(h.cp, TokenAuth({"t": "alice"}))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
            auth = {"Authorization": "Bearer t"}
            r = await http.post(
                "/v1/jobs",
                json={"pool": "cpu", "command": ["true"], "pods": 2, "topology": "rack"},
                headers=auth,
            )
            assert r.status_code == 422 and r.json()["error"]["class"] == "InvalidRequest"
            assert h.store.list_jobs() == []
            r = await http.post(
                "/v1/jobs",
                json={"pool": "cpu", "command": ["true"], "pods": 2, "topology": "node"},
                headers=auth,
            )
            assert r.status_code in (200, 201, 202) and r.json()["topology"] == "node"
            [job] = h.store.list_jobs()
            assert job.spec.topology == "node"
            assert JobSpec.from_json(job.spec.to_json()).topology == "node"
            plain = {k: v for k, v in job.spec.to_json().items() if k != "topology"}
            assert JobSpec.from_json(plain).topology == ""  # a row stored before the field: the pool's
    finally:
        await h.stop()


def test_the_sdk_and_the_cli_send_topology() -> None:
    from broker.cli import build_parser
    from broker.client import Client

    sent: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        sent.append(json.loads(request.content))
        return httpx.Response(201, json={"id": "j1", "state": "QUEUED", "caller": "a", "pool": "gpu"})

    fp = Client("http://fp", "t", transport=httpx.MockTransport(handler))
    fp.submit(["true"], pool="gpu", pods=2, topology="domain")
    fp.submit(["true"], pool="gpu", pods=2)
    assert sent[0]["topology"] == "domain" and "topology" not in sent[1]
    args = build_parser().parse_args(["submit", "--pods", "2", "--topology", "node", "--", "true"])
    assert args.topology == "node"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["submit", "--topology", "rack", "--", "true"])


def _nodes() -> list[object]:
    from broker.fleet.nodes import Node

    racks = {"n0": "rack-1", "n1": "rack-1", "n2": "rack-2"}
    return [Node(n, tuple(f"{n}-g{i}" for i in range(4)), domain=d) for n, d in racks.items()]


SET_CASES = [
    # (id, GPUs used per node, topology, pods, nodes of pods already made, expected nodes or [] to wait)
    ("node: the tightest node that holds the set", {"n0": 1, "n1": 2}, "node", 2, [], ["n1", "n1"]),
    ("node: waits rather than split 2 + 2", {"n0": 2, "n1": 2, "n2": 2}, "node", 4, [], []),
    ("domain: two nodes of one rack", {"n0": 2, "n1": 2, "n2": 2}, "domain", 3, [], ["n0", "n0", "n1"]),
    (
        "domain: a node's multiple takes a whole node or waits (§6)",
        {"n0": 2, "n1": 2, "n2": 2},
        "domain",
        4,
        [],
        [],
    ),
    ("node: the rest joins the pods made", {"n0": 1}, "node", 2, ["n1"], ["n1", "n1"]),
    ("node: no room beside the pods made: wait", {"n1": 3}, "node", 2, ["n1"], []),
    ("domain: the rest stays in their rack", {"n0": 4, "n1": 2}, "domain", 2, ["n1"], ["n1", "n1"]),
]


@pytest.mark.parametrize(
    ("used", "topology", "pods", "near", "expect"), [c[1:] for c in SET_CASES], ids=[c[0] for c in SET_CASES]
)
def test_a_set_made_for_a_confined_gang_is_placed_strictly(
    used: dict[str, int], topology: str, pods: int, near: list[str], expect: list[str]
) -> None:
    from broker.fleet.nodes import Fleet
    from broker.warmth.placing import where_set

    fleet = Fleet.of(_nodes(), used.items())  # type: ignore[arg-type]
    assert sorted(where_set(fleet, gpu_pool(accelerator="any"), pods, topology, near)) == expect


def test_a_set_of_a_pool_without_nodes_lets_the_backend_choose() -> None:
    from broker.fleet.nodes import Fleet
    from broker.warmth.placing import where_set

    assert where_set(Fleet(()), gpu_pool(), 3, "node") == ["", "", ""]
    assert where_set(Fleet(()), cpu_pool(), 2, "domain") == ["", ""]


async def test_a_node_gangs_set_placed_apart_joins_the_pool_and_is_made_again_on_one_node() -> None:
    # A cluster scheduler may place a set apart (no node list, or not honouring the hint): the pods made for the
    # gang counted as its set, so nothing more was made and the gang waited until their keep-alive.
    import dataclasses

    backend = FakeBackend(VirtualClock(), gpus=12, gpus_per_node=4)
    h = Harness([gpu_pool(max_count=12, step=12, idle_timeout=3600.0)], backend=backend,
                clock=backend.clock)  # type: ignore[arg-type]
    real_create = backend.create
    scattered: list[str] = []

    async def scattering(request):  # type: ignore[no-untyped-def]
        if request.gang and len(scattered) < 4:  # the first set: two pods on each of two nodes
            request = dataclasses.replace(request, node=f"fake-node-{len(scattered) % 2}")
            scattered.append(request.name)
        return await real_create(request)

    backend.create = scattering  # type: ignore[method-assign]
    await h.start()
    try:
        gang = await h.finish(await h.submit("bob", pool="gpu", pods=4, topology="node", command=("true",)),
                              timeout=30.0)
        assert gang.state is JobState.SUCCEEDED
        node = {p.name: p.node for p in h.cp.tracker.snapshot()}
        (gang_node,) = {node[p] for p in gang.pods}  # beside the part it kept, made whole
        apart = [p for p in scattered if node[p] != gang_node]
        assert len(apart) == 2 and not set(apart) & set(gang.pods)
        assert all(h.cp.tracker.pods[p].reserved_for is None for p in apart)  # plain pool pods now
    finally:
        await h.stop()
