"""Node identity on Kubernetes (design R5, §8), through the API emulator with real agents: a node replaced
under its name with a new bootID voids the pods on it — a held pod is deleted, a running attempt is
re-queued without spending a retry, and a restarted broker does the same for a reboot during its outage —
and a quarantined node gets no new pod (required node affinity, NotIn, honoured by the scheduler)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker.clock import RealClock
from broker.control import ControlPlane, Tuning
from broker.jobs import AttemptState, ErrorClass, JobSpec, JobState
from broker.pools import Catalog, parse_pool
from broker.ports.logs import MemoryLogStore
from broker.ports.quarantine import MemoryQuarantineStore
from broker.ports.store import MemoryJobStore
from k8s_emulator import Emulator
from tests.integration.test_k8s_backend import new_backend

pytestmark = pytest.mark.integration

GPU = parse_pool(
    {
        "name": "h100",
        "gpus": 1,
        "max_count": 2,
        "caller_hold_seconds": 600,
        "template": {"image": "firepool/sandbox-gpu:0.1.0", "start_timeout_s": 60},
    }
)
CPU = parse_pool(
    {
        "name": "cpu",
        "max_count": 2,
        "template": {"image": "firepool/sandbox-cpu:0.1.0", "start_timeout_s": 60},
    }
)
TUNING = Tuning(dispatch_tick_s=0.2, reconcile_tick_s=0.3, node_check_s=0.3)


def broker(
    emu: Emulator, store: MemoryJobStore, quarantine: MemoryQuarantineStore | None = None
) -> ControlPlane:
    return ControlPlane(
        clock=RealClock(),
        store=store,
        backend=new_backend(emu),
        logs=MemoryLogStore(),
        catalog=Catalog(pools={"h100": GPU, "cpu": CPU}),
        tuning=TUNING,
        quarantine=quarantine,
    )


async def until(cond, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def pod_names(emu: Emulator) -> set[str]:
    return {p["metadata"]["name"] for p in emu.store.list("pods", "default")[0]}


def boot_id(emu: Emulator, node: str) -> str:
    return str(emu.store.get("nodes", "", node)["status"]["nodeInfo"]["bootID"])


async def test_a_node_replaced_under_its_name_voids_its_pods_while_the_broker_runs(tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", gpus=1, nodes=2) as emu:
        # The voided pods' deletes are what frees each node's one card for the next job; their grace (5 s
        # each, agents ignore SIGTERM) is not what this test is about.
        emu.hurry_deletes()
        cp = broker(emu, MemoryJobStore())
        await cp.start()
        try:
            held, _ = await cp.submit("alice", JobSpec(pool="h100", command=("true",), lease_tag="a"))
            held = await cp.wait("alice", held.id, 60)
            assert held.state is JobState.SUCCEEDED
            held_pod = cp.tracker.pods[held.pods[0]]
            assert held_pod.epoch.endswith(
                "@" + boot_id(emu, held_pod.node)
            )  # the pod carries its node's epoch

            job, _ = await cp.submit("bob", JobSpec(pool="h100", command=("sleep", "2"), max_retries=0))
            await until(lambda: cp.book.live[job.id].state is JobState.RUNNING)
            first = cp.book.live[job.id].pods[0]
            node = cp.tracker.pods[first].node
            assert node != held_pod.node
            emu.reboot_node(
                node
            )  # the pod object, its UID and its agent stay: only the node's bootID changed

            done = await cp.wait("bob", job.id, 90)
            assert done.state is JobState.SUCCEEDED and done.retries == 0, done
            assert (
                done.attempts[0].state is AttemptState.LOST
                and done.attempts[0].error_class == ErrorClass.POD_LOST
            )
            assert done.pods != (first,)
            await until(lambda: first not in pod_names(emu))  # never reused: deleted
            assert cp.tracker.pods[held_pod.name].held(cp.clock.now())  # the other node's hold stands

            emu.reboot_node(held_pod.node)
            await until(lambda: held_pod.name not in cp.tracker.pods)  # its hold went with it
            again = await cp.wait(
                "alice",
                (await cp.submit("alice", JobSpec(pool="h100", command=("true",), lease_tag="a")))[0].id,
                60,
            )
            assert again.state is JobState.SUCCEEDED and again.pods != (held_pod.name,)
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await cp.stop(delete_idle_pods=True)


async def test_a_reboot_during_a_broker_outage_voids_the_held_pod_at_recovery(tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", gpus=1, nodes=1) as emu:
        store = MemoryJobStore()
        first = broker(emu, store)
        await first.start()
        try:
            job, _ = await first.submit("alice", JobSpec(pool="h100", command=("true",), lease_tag="a"))
            pod = (await first.wait("alice", job.id, 60)).pods[0]
        finally:
            await first.stop()  # the pods stay for the next broker
        emu.reboot_node("node-0")
        second = broker(emu, store)
        await second.start()
        try:
            report = second.recovery
            assert report is not None and report.untrusted == {pod: "changed"} and report.holds_restored == 0
            assert pod not in second.tracker.pods
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await second.stop(delete_idle_pods=True)


async def test_a_quarantined_node_gets_no_new_pod(tmp_path: Path) -> None:
    with Emulator(tmp_path / "k8s", gpus=1, nodes=2) as emu:
        cp = broker(emu, MemoryJobStore(), MemoryQuarantineStore())
        await cp.start()
        try:
            for _ in range(
                cp.catalog.quarantine.threshold
            ):  # faults of pods that hold no card count on the node
                await cp.health.quarantine.fault([], "node-0", "the node's pods keep failing")
            assert cp.health.quarantine.blocked_nodes() == {"node-0"}
            for caller in ("alice", "bob"):  # CPU pods: the cluster's scheduler alone would take node-0 first
                job, _ = await cp.submit(caller, JobSpec(pool="cpu", command=("true",)))
                assert (await cp.wait(caller, job.id, 60)).state is JobState.SUCCEEDED
            gpu, _ = await cp.submit("carol", JobSpec(pool="h100", command=("true",)))
            assert (await cp.wait("carol", gpu.id, 60)).state is JobState.SUCCEEDED
            pods = emu.store.list("pods", "default")[0]
            assert pods and {p["spec"]["nodeName"] for p in pods} == {"node-1"}
            terms = pods[0]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            assert terms["nodeSelectorTerms"][0]["matchExpressions"][-1] == {
                "key": "kubernetes.io/hostname",
                "operator": "NotIn",
                "values": ["node-0"],
            }
        finally:
            emu.hurry_deletes()  # the teardown tests nothing of the grace
            await cp.stop(delete_idle_pods=True)
