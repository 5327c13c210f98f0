"""Robust API calls of the kubernetes backend against the emulator's faults: a connection held open silently
(a NAT or load balancer that dropped it) ends within the backend's bound, for a plain call and for the pod
watch; a create whose answer was lost is retried and adopts its own pod; a name taken by someone else's
pod stays an error and that pod is left alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import kubernetes
import pytest

from broker.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from broker.backends.kubernetes.kubeapi import ApiTimeouts
from broker.errors import BackendError
from broker.pools import parse_pool
from broker.ports.backend import PodRequest
from k8s_emulator import Emulator
from tests.integration.test_k8s_backend import core, new_backend, until_gone

pytestmark = pytest.mark.integration

CPU = parse_pool({"name": "cpu", "template": {"image": "firepool/sandbox-cpu:0.1.0", "start_timeout_s": 60,
                                              "termination_grace_s": 1}})
# Tight bounds, so a silent connection is noticed in seconds; the emulator's bookmarks (every 0.2 s) keep a
# healthy watch well inside its read timeout.
TIGHT = KubernetesSettings(timeouts=ApiTimeouts(connect_s=2.0, read_s=1.5, watch_s=60, watch_read_s=2.0))
BOUND_S = 20.0
"""Far above the bounds, far below for ever: a test that would hang fails here instead."""


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path / "k8s", bookmark_interval_s=0.2) as emulator:
        yield emulator


@pytest.fixture
async def backend(emu: Emulator) -> AsyncIterator[KubernetesBackend]:
    b = new_backend(emu, settings=TIGHT)
    try:
        yield b
    finally:
        for name in list(b.cache.pods):
            await b.delete(name)
        await b.close()


async def test_a_call_held_open_silently_times_out_and_the_retry_succeeds(
        backend: KubernetesBackend, emu: Emulator) -> None:
    emu.stall_next("create", "secrets")
    t0 = time.monotonic()
    info = await asyncio.wait_for(backend.create(PodRequest(name="cpu-stalled", pool=CPU)), BOUND_S)
    assert emu.faults.stalled == 1 and info.name == "cpu-stalled"
    assert time.monotonic() - t0 >= TIGHT.timeouts.read_s, "the stalled call was waited out, not skipped"
    assert await backend.agent("cpu-stalled").health()


async def test_a_watch_gone_silent_is_dropped_at_its_read_timeout_and_resumed(
        backend: KubernetesBackend, emu: Emulator) -> None:
    await backend.create(PodRequest(name="cpu-watched", pool=CPU))
    resumed = backend.watcher.resumes
    assert emu.silence_watches() == 1
    core(emu).delete_namespaced_pod("cpu-watched", "default")  # happens while the open stream says nothing
    why = await asyncio.wait_for(until_gone(backend, "cpu-watched", BOUND_S), BOUND_S + 1)
    assert "deleted" in why and "not by this broker" in why
    assert backend.watcher.resumes == resumed, "no clean end: the read timeout cut the stream"


async def test_a_create_whose_answer_was_lost_adopts_its_own_pod(backend: KubernetesBackend, emu: Emulator) -> None:
    emu.lose_next("create", "pods")
    emu.lose_next("create", "secrets")
    info = await asyncio.wait_for(backend.create(PodRequest(name="cpu-lost", pool=CPU)), BOUND_S)
    pod = emu.pod("cpu-lost")
    assert info.details["uid"] == pod["metadata"]["uid"], "the retry's 409 adopted the first try's pod"
    assert await backend.agent("cpu-lost").health()


async def test_a_409_for_a_pod_not_ours_is_an_error_and_that_pod_is_left_alone(
        backend: KubernetesBackend, emu: Emulator) -> None:
    theirs = core(emu).create_namespaced_pod("default", {
        "metadata": {"name": "cpu-taken", "labels": {"firepool.io/broker": "another-broker"}},
        "spec": {"containers": [{"name": "c", "image": "firepool/agent:1"}]}})
    with pytest.raises(BackendError, match="did not make"):
        await backend.create(PodRequest(name="cpu-taken", pool=CPU))
    still = emu.pod("cpu-taken")
    assert still["metadata"]["uid"] == theirs.metadata.uid and not still["metadata"].get("deletionTimestamp")
    with pytest.raises(kubernetes.client.ApiException):
        core(emu).read_namespaced_secret("cpu-taken-agent", "default")  # our own Secret is cleaned up
