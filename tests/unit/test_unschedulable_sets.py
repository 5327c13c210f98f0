"""A gang confined to one node (or one topology domain) larger than any node (domain) of its pool can hold never
waits for ever: it is refused at submit (400 `Unschedulable`) when the backend's nodes are known, else it fails
`Unschedulable` as soon as the broker learns them. A set that fits, or a pool whose nodes say nothing, waits."""

from __future__ import annotations

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from broker.clock import VirtualClock
from broker.errors import Unschedulable
from broker.fleet.nodes import Node
from broker.jobs import ErrorClass, JobState
from broker.ports.backend import FakeBackend, split_nodes
from broker.warmth.placing import largest_names, never_fits, set_ceilings
from tests.unit.harness import Harness, cpu_pool, gpu_pool


def _nodes() -> list[Node]:
    """Two racks: rack-1 holds a 4- and an 8-GPU node, rack-2 one 4-GPU node labelled small."""
    shape = {"n0": (4, "rack-1", {}), "n1": (8, "rack-1", {}), "n2": (4, "rack-2", {"shape": "small"})}
    return [
        Node(n, tuple(f"{n}-g{i}" for i in range(size)), model="h100", domain=d, labels=labels)
        for n, (size, d, labels) in shape.items()
    ]


def test_the_ceiling_of_a_pool_is_its_largest_node_and_domain_in_pods() -> None:
    pools = {
        "one": gpu_pool(name="one", accelerator="h100"),
        "two": gpu_pool(name="two", gpus=2, accelerator="h100"),
        "small": gpu_pool(name="small", accelerator="h100", node_selector={"shape": "small"}),
        "nowhere": gpu_pool(name="nowhere", accelerator="h100", node_selector={"shape": "huge"}),
        "cpu": cpu_pool(),
    }
    assert set_ceilings(_nodes(), pools) == {
        "one": {"node": 8, "domain": 12},
        "two": {"node": 4, "domain": 6},
        "small": {"node": 4, "domain": 4},
    }  # no nodes matched, or a CPU pool: unknown, left out
    assert set_ceilings([], pools) == {}


def test_a_large_node_briefly_out_does_not_lower_the_ceiling() -> None:
    pools = {"gpu": gpu_pool(accelerator="h100")}
    seen = set_ceilings(_nodes(), pools)
    without_n1 = [n for n in _nodes() if n.id != "n1"]  # the 8-GPU node is NotReady or cordoned a while
    assert set_ceilings(without_n1, pools) == {"gpu": {"node": 4, "domain": 4}}
    assert set_ceilings(without_n1, pools, seen) == {"gpu": {"node": 8, "domain": 12}}
    assert set_ceilings([], pools, seen) == seen  # no node listed at all: what was seen stands


def test_the_refusal_names_the_largest_node_and_domain_and_keeps_a_name_briefly_out() -> None:
    pools = {"gpu": gpu_pool(accelerator="h100")}
    ceilings = set_ceilings(_nodes(), pools)
    names = largest_names(_nodes(), pools, ceilings)
    assert names == {"gpu": {"node": "n1", "domain": "rack-1"}}
    why = never_fits(ceilings, gpu_pool(accelerator="h100"), 9, "node", names)
    assert why is not None and why.endswith("holds 8 such pods (node n1)")
    without_n1 = [n for n in _nodes() if n.id != "n1"]
    assert largest_names(without_n1, pools, set_ceilings(without_n1, pools, ceilings), names) == names


def test_only_a_set_larger_than_the_ceiling_never_fits() -> None:
    ceilings = set_ceilings(_nodes(), {"gpu": gpu_pool(accelerator="h100")})
    spec = gpu_pool(accelerator="h100")
    assert never_fits(ceilings, spec, 8, "node") is None
    assert never_fits(ceilings, spec, 12, "domain") is None
    why = never_fits(ceilings, spec, 9, "node")
    assert why is not None and "largest node of pool 'gpu' holds 8" in why
    assert never_fits(ceilings, spec, 13, "domain") is not None
    assert never_fits({}, spec, 100, "node") is None  # the pool's nodes are unknown: it waits


def _fleet(topology: str = "any") -> Harness:
    """Eight GPUs on two nodes of four, in two domains; the pool could hold 16 pods."""
    backend = FakeBackend(VirtualClock(), gpus=8, gpus_per_node=4)
    backend._nodes = split_nodes(backend.devices(), 4, "fake-node", domain_size=1, epoch="boot-0")
    pool = gpu_pool(max_count=16, step=16, topology=topology)
    return Harness([pool], backend=backend, clock=backend.clock)  # type: ignore[arg-type]


async def test_a_confined_gang_no_node_holds_is_refused_at_submit_over_rest() -> None:
    h = await _fleet().start()
    app = create_app(h.cp, TokenAuth({"t": "alice"}))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
            auth = {"Authorization": "Bearer t"}

            async def post(pods: int, topology: str | None) -> httpx.Response:
                body = {"pool": "gpu", "command": ["sleep", "1"], "pods": pods, "topology": topology}
                return await http.post("/v1/jobs", json=body, headers=auth)

            r = await post(5, "node")
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["class"] == "Unschedulable"
            assert "largest node of pool 'gpu' holds 4" in error["message"]
            assert error["message"].endswith("(node fake-node-0)")  # what to grow, named
            assert error["details"] == {"pool": "gpu", "pods": 5, "topology": "node", "largest": 4}
            assert (await post(5, "domain")).status_code == 400  # one node per domain here
            assert h.store.list_jobs() == []
            assert (await post(5, "any")).status_code == 201  # may run split
            assert (await post(4, "node")).status_code == 201
    finally:
        await h.stop()


async def test_the_pools_default_topology_is_judged_at_submit_too() -> None:
    h = await _fleet(topology="node").start()
    try:
        with pytest.raises(Unschedulable):
            await h.submit(pool="gpu", pods=5)
        assert (await h.run_job(pool="gpu", pods=4)).state is JobState.SUCCEEDED
    finally:
        await h.stop()


async def test_a_confined_gang_admitted_before_the_nodes_were_known_fails_once_they_are() -> None:
    h = _fleet()
    nodes, h.backend._nodes = h.backend._nodes, []  # the backend has not listed its nodes yet
    await h.start()
    try:
        gang = await h.submit(pool="gpu", pods=5, topology="node")
        fits = await h.submit(pool="gpu", pods=4, topology="node", command=("sleep", "1000"))
        await h.run_for(3.0)
        assert h.store.get(gang.id).state is JobState.QUEUED  # type: ignore[union-attr]  # unknown: it waits
        h.backend._nodes = nodes  # listed: no node holds 5
        failed = await h.finish(gang, timeout=5.0)
        assert failed.state is JobState.FAILED and failed.error_class == ErrorClass.UNSCHEDULABLE, failed
        assert "largest node of pool 'gpu' holds 4" in (failed.error_message or "")
        assert failed.attempts == ()
        assert gang.id not in h.cp.dispatcher.queued and gang.id not in h.cp.dispatcher.waiting_reason
        await h.until(lambda: h.store.get(fits.id).state is JobState.RUNNING)  # type: ignore[union-attr]
        assert len({p.node for p in h.cp.tracker.pods_of(fits.id)}) == 1
        assert all(p.reserved_for != gang.id for p in h.cp.tracker.snapshot())
    finally:
        await h.stop()
