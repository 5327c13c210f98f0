"""Pods made for a waiting gang carry its placement hint to the backend, and the gang takes them first."""

from __future__ import annotations

from broker.pods import Pod, PodState
from broker.warmth.singleuse import gang_hints
from tests.unit.harness import Harness, cpu_pool


async def test_pods_made_for_a_waiting_gang_carry_its_hint_and_it_runs_on_them() -> None:
    h = await Harness([cpu_pool(max_count=4, step=4)]).start()
    try:
        gang = await h.run_job("alice", pods=2)
        assert len(gang.pods) == 2
        for name in gang.pods:
            request = h.backend.requests[name]
            assert (request.gang, request.gang_size) == (gang.id, 2)
        single = await h.run_job("bob")
        assert single.pods[0] not in gang.pods
        assert h.backend.requests[single.pods[0]].gang == ""  # a one-pod job's pod has no gang
    finally:
        await h.stop()


def test_hints_go_to_waiting_gangs_in_order_minus_the_pods_already_made_for_them() -> None:
    made = Pod("cpu-1", "cpu", state=PodState.STARTING)
    made.gang = "ga"
    assert gang_hints([("ga", 2), ("gb", 3)], [made], 3) == [("ga", 2), ("gb", 3), ("gb", 3)]
    assert gang_hints([("ga", 2)], [made], 4) == [("ga", 2)]  # the rest of the creates get no hint
    assert gang_hints([], [], 2) == []


async def test_a_gangs_pods_made_in_one_pass_form_one_batch_of_the_pods_made_not_of_its_world_size() -> None:
    # A gang scheduler (Volcano's PodGroup minMember) starts a batch all or none: a batch counting the ranks that
    # warm pods serve would wait for ever for pods never made.
    h = await Harness([cpu_pool(max_count=4, step=4, min_count=1, max_idle_count=1)]).start()
    try:
        await h.until(lambda: any(p.state is PodState.IDLE for p in h.cp.tracker.pods.values()))
        warm = {n for n, p in h.cp.tracker.pods.items() if p.state is PodState.IDLE}
        gang = await h.run_job("alice", pods=3)
        made = [n for n in gang.pods if n not in warm]
        assert len(made) == 2 and len(set(gang.pods) & warm) == 1
        batches = {h.backend.requests[n].gang_batch for n in made}
        assert len(batches) == 1 and batches.pop() in {(made[0], 2), (made[1], 2)}
        assert all(h.backend.requests[n].gang_size == 3 for n in made)
        single = await h.run_job("bob")
        assert h.backend.requests[single.pods[0]].gang_batch == ("", 0)
    finally:
        await h.stop()
