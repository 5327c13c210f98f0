"""The simulated backend's held capacity: a card is held once while any pod of its group lives on it (paper §6)."""

from __future__ import annotations

import random

from broker.clock import VirtualClock
from broker.sim.backend import PodLife, SimBackend, VenueCosts
from broker.sim.venues import h200


def backend(*lives: PodLife) -> SimBackend:
    sim = SimBackend(VirtualClock(0.0), VenueCosts(h200), random.Random(0), gpus=2)
    sim.lives = {life.name: life for life in lives}
    return sim


def test_a_promoted_standby_holds_its_card_after_the_pod_it_replaced_is_deleted() -> None:
    active = PodLife("a", "bench", 1.0, created_at=0.0, ready_at=20.0, deleted_at=100.0, devices=("gpu-0",))
    standby = PodLife(
        "s", "bench", 0.0, created_at=30.0, ready_at=50.0, deleted_at=160.0, standby=True, devices=("gpu-0",)
    )
    sim = backend(active, standby)
    assert sim.held_processor_seconds(until=200.0) == 160.0  # the card from 0 s to 160 s, counted once
    assert sim.held_processor_seconds(until=200.0, since=100.0) == 60.0


def test_creating_counts_a_card_only_while_none_of_its_pods_has_started() -> None:
    active = PodLife("a", "bench", 1.0, created_at=0.0, ready_at=20.0, deleted_at=100.0, devices=("gpu-0",))
    standby = PodLife(
        "s", "bench", 0.0, created_at=30.0, ready_at=50.0, deleted_at=160.0, standby=True, devices=("gpu-0",)
    )  # starts beside a ready pod: no card is waiting for it
    other = PodLife("b", "bench", 1.0, created_at=40.0, ready_at=70.0, deleted_at=90.0, devices=("gpu-1",))
    sim = backend(active, standby, other)
    assert sim.creating_processor_seconds(until=200.0) == 20.0 + 30.0
    assert sim.held_processor_seconds(until=200.0) == 160.0 + 50.0


def test_cpu_pods_and_a_gpu_pod_deleted_while_starting_count_their_processors() -> None:
    cpu_pod = PodLife("c", "cpu", 4.0, created_at=0.0, ready_at=22.0, deleted_at=50.0)
    never = PodLife("g", "bench", 1.0, created_at=10.0, deleted_at=15.0)  # its card was never reported
    sim = backend(cpu_pod, never)
    assert sim.held_processor_seconds(until=100.0) == 4.0 * 50.0 + 5.0
    assert sim.creating_processor_seconds(until=100.0) == 4.0 * 22.0 + 5.0
