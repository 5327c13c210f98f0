"""Standbys whose active pod is gone, and single-use jobs at the ceiling (docs/simulator.md, "Findings")."""

from __future__ import annotations

from broker.clock import VirtualClock
from broker.jobs import JobState
from broker.pods import Origin, Pod, PodState
from broker.ports.backend import FakeBackend
from broker.warmth.holds import holds_to_break
from broker.warmth.standby import plan_standbys
from tests.unit.harness import Harness, gpu_pool


def _standby(name: str, card: str, idle_since: float = 0.0) -> Pod:
    pod = Pod(name, "gpu", (card,), state=PodState.IDLE, origin=Origin.STANDBY)
    pod.standby, pod.idle_since = True, idle_since
    return pod


def test_an_orphaned_cards_standbys_give_way_together_beyond_the_warm_demand() -> None:
    orphans = [_standby("s1", "g0"), _standby("s2", "g0")]
    beside = [Pod("a", "gpu", ("g1",), state=PodState.RUNNING), _standby("s3", "g1")]
    pods = orphans + beside
    assert holds_to_break(pods, 1, {}, 100.0, warm_demand=0) == orphans  # the card frees only with both
    assert holds_to_break(pods, 1, {}, 100.0, warm_demand=1) == []  # a warm job may be promoted onto them
    assert holds_to_break(pods, 1, {}, 100.0) == []  # no warm demand given: never-used pods are kept


def test_an_orphaned_card_with_a_standby_still_starting_is_left_to_finish() -> None:
    starting = _standby("s2", "g0")
    starting.state = PodState.STARTING
    assert holds_to_break([_standby("s1", "g0"), starting], 1, {}, 100.0, warm_demand=0) == []


def test_a_card_held_only_by_a_custom_image_pod_gets_no_standby() -> None:
    spec = gpu_pool(standbys_per_active=1)
    image = Pod(
        "a", "gpu", ("g0",), state=PodState.RUNNING, origin=Origin.CUSTOM_IMAGE, image="reg/x@sha256:1"
    )
    assert plan_standbys(spec, [image], 10.0).create == ()


async def test_a_single_use_job_at_the_ceiling_does_not_wait_out_an_orphaned_standbys_keep_alive() -> None:
    # One-GPU ceiling with a standby per card: a warm job leaves its pod and a standby on the card. The hold
    # expires and the pod retires; its standby stays for the keep-alive (300 s) as the card's group. A
    # single-use job cannot take it, so it used to wait the keep-alive out; now the standby gives way.
    h = Harness(
        [gpu_pool(max_count=1, standbys_per_active=1, caller_hold_seconds=60.0, idle_timeout=300.0)],
        backend=FakeBackend(VirtualClock(), gpus=2, memory_mb=143_771),
    )
    h.backend.clock = h.clock
    await h.start()
    try:
        warm = await h.run_job(pool="gpu", lease_tag="a")
        await h.run_for(61.0)
        assert warm.pods[0] not in h.cp.tracker.pods  # its hold expired: retired
        assert [p.state for p in h.cp.tracker.snapshot() if p.standby] == [PodState.IDLE]  # the orphan
        single = await h.submit("bob", pool="gpu", single_use=True)
        done = await h.finish(single, timeout=30.0)
        assert done.state is JobState.SUCCEEDED
        assert not [p for p in h.cp.tracker.snapshot() if p.standby]  # none staged beside a single-use pod
    finally:
        await h.stop()


def test_a_broken_pod_alone_on_its_card_takes_the_cards_idle_standbys_with_it() -> None:
    expired = Pod("a", "gpu", ("g0",), state=PodState.IDLE)
    expired.caller, expired.used, expired.hold_until = "alice", True, 50.0
    standby = _standby("s1", "g0")
    assert holds_to_break([expired, standby], 1, {}, 100.0) == [expired, standby]
    fresh, beside = Pod("b", "gpu", ("g1",), state=PodState.IDLE), _standby("s2", "g1")
    assert holds_to_break([fresh, beside], 1, {}, 100.0, warm_demand=0) == [fresh, beside]
