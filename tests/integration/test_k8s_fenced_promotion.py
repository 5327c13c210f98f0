"""After a broker restart on Kubernetes, a standby is never promoted while its card is fenced: the card sweep
finds a share held outside the pool's group, and promotions resume only once a sweep verifies the card."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker.clock import RealClock
from broker.control import ControlPlane, Tuning
from broker.jobs import JobSpec, JobState
from broker.pools import Catalog, parse_pool
from broker.ports.logs import MemoryLogStore
from broker.ports.store import MemoryJobStore
from k8s_emulator import Emulator
from k8s_emulator.rbac import DEPLOY, shipped_grants
from tests.integration.test_k8s_backend import core, new_backend

pytestmark = pytest.mark.integration

GPU = parse_pool({"name": "h100", "gpus": 1, "standbys_per_active": 1, "max_count": 1, "caller_hold_seconds": 600,
                  "template": {"image": "firepool/sandbox-gpu:0.1.0", "start_timeout_s": 60}})
TUNING = Tuning(dispatch_tick_s=0.2, reconcile_tick_s=0.3)


def broker(emu: Emulator, store: MemoryJobStore) -> ControlPlane:
    return ControlPlane(clock=RealClock(), store=store, backend=new_backend(emu), logs=MemoryLogStore(),
                        catalog=Catalog(pools={"h100": GPU}), tuning=TUNING)


async def until(cond, timeout: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_a_standby_is_not_promoted_while_its_card_is_fenced_after_a_restart(tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", gpus=1, rbac=shipped_grants(DEPLOY / "overlays" / "hami")) as emu:  # the sweep
        store = MemoryJobStore()
        first = broker(emu, store)
        await first.start()
        try:
            job, _ = await first.submit("alice", JobSpec(pool="h100", command=("true",), lease_tag="a"))
            assert (await first.wait("alice", job.id, 60)).state is JobState.SUCCEEDED
            await until(lambda: any(p.standby and p.state.value == "idle" for p in first.tracker.snapshot()))
            card = next(p.gpus for p in first.tracker.snapshot() if p.standby)[0]
        finally:
            await first.stop()  # the pods stay for the next broker
        # A share of that card held outside the pool's group (another workload on the shared card).
        stranger = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stranger", "annotations": {
            "nvidia.com/use-gpuuuid": card}}, "spec": {"containers": [{"name": "c", "image": "other:1",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}}}]}}
        await asyncio.to_thread(core(emu).create_namespaced_pod, "default", stranger)
        await until(lambda: "hami.io/vgpu-devices-allocated" in (emu.pod("stranger")["metadata"].get("annotations")
                                                                  or {}))

        second = broker(emu, store)
        await second.start()
        try:
            assert card in second.tracker.unverified_cards()  # fenced from the start
            bob, _ = await second.submit("bob", JobSpec(pool="h100", command=("true",), lease_tag="b"))
            await asyncio.sleep(3.0)  # sweeps run every reconcile pass; each finds the foreign share
            assert (await second.get("bob", bob.id)).state is JobState.QUEUED
            assert card in second.tracker.unverified_cards()
            assert not any(p.job == bob.id for p in second.tracker.snapshot())  # the standby was not promoted
            await asyncio.to_thread(core(emu).delete_namespaced_pod, "stranger", "default", grace_period_seconds=0)
            done = await second.wait("bob", bob.id, 60)
            assert done.state is JobState.SUCCEEDED, done
            assert [a.path for a in done.acquisition] == ["standby"]  # promoted once a sweep verified the card
            assert card not in second.tracker.unverified_cards()
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await second.stop(delete_idle_pods=True)
