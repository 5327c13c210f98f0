"""Quarantine (design §8): hardware-class failures are counted per device and node; past the threshold
the device gets no new pod, its pods drain, the job that hit it goes elsewhere without spending a retry,
and only an operator's release lets it back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from broker.clock import VirtualClock
from broker.errors import NotFound
from broker.health import decisions
from broker.health.gpuhealth import GpuHealth, worse
from broker.health.quarantine import Quarantine, count_fault
from broker.jobs import ErrorClass, JobState
from broker.pods import PodState
from broker.pools import QuarantineSettings, load_catalog
from broker.ports.quarantine import MemoryQuarantineStore
from firepool_agent.hwfaults import classify
from tests.unit.harness import Harness, gpu_pool


@pytest.mark.parametrize(("stderr", "exit_code", "fault"), [
    (b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n", 1, "Xid 79 (hardware)"),
    (b"kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=77, An uncorrectable double bit error\n", 134, "Xid 48 (hardware)"),
    (b"XID 94 contained ECC error\n", 1, "Xid 94 (hardware)"),
    (b"RuntimeError: CUDA error: uncorrectable ECC error encountered\n", 1, "uncorrectable ECC error"),
    (b"cudaErrorECCUncorrectable: uncorrectable ECC error encountered\n", 1, "ECC error reported by CUDA"),
    (b"CUDA_ERROR_ECC_UNCORRECTABLE\n", 139, "ECC error reported by CUDA"),
    (b"Unable to determine the device handle for GPU0000:3B:00.0: GPU has fallen off the bus.\n", 1,
     "GPU fell off the bus"),
    (b"NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception\n", 1, None),   # the job's own fault
    (b"NVRM: Xid (PCI:0000:3b:00): 31, MMU Fault\n", 1, None),
    (b"Traceback: ZeroDivisionError\n", 1, None),
    (b"NVRM: Xid (PCI:0000:3b:00): 79\n", 0, None),   # succeeded: never a hardware fault
    (b"cudaErrorECCUncorrectable\n", None, None),
])
def test_the_agent_tells_hardware_failures_from_the_jobs_own(stderr: bytes, exit_code: int | None,
                                                              fault: str | None) -> None:
    assert classify(stderr, exit_code) == fault


@pytest.mark.parametrize(("before", "after", "fault"), [
    (GpuHealth(ecc_uncorrected=2), GpuHealth(ecc_uncorrected=3), "NVML: 1 new uncorrectable ECC error(s)"),
    (GpuHealth(ecc_uncorrected=2), GpuHealth(ecc_uncorrected=2), None),
    (None, GpuHealth(), None),
    (GpuHealth(), GpuHealth(retired_pages_pending=True), "NVML: pages pending retirement"),
    (GpuHealth(), GpuHealth(remap_failed=True), "NVML: a row remap failed"),
])
def test_an_nvml_reading_worse_than_the_last_is_a_hardware_fault(before: GpuHealth | None, after: GpuHealth,
                                                                  fault: str | None) -> None:
    assert worse(before, after) == fault


def test_the_count_quarantines_at_the_threshold_and_not_before() -> None:
    record = None
    for n in range(1, 4):
        record = count_fault(record, "gpu-0", "device", "n1", f"fault {n}", float(n), threshold=3)
        assert record.failures == n and record.quarantined is (n == 3)
    assert record is not None and record.quarantined_at == 3.0 and record.reason == "fault 3"


async def test_quarantines_survive_a_restart_and_a_node_goes_when_enough_of_its_cards_do() -> None:
    clock, store = VirtualClock(), MemoryQuarantineStore()
    q = Quarantine(QuarantineSettings(threshold=2, node_threshold=2), store, clock)
    await q.load()
    assert await q.fault(["gpu-0"], "n1", "Xid 79") == []
    assert [r.key for r in await q.fault(["gpu-0"], "n1", "Xid 79")] == ["gpu-0"]
    assert q.blocks(["gpu-0"]) and not q.blocks(["gpu-1"], "n1")
    await q.fault(["gpu-1"], "n1", "ECC")
    newly = await q.fault(["gpu-1"], "n1", "ECC")
    assert [r.key for r in newly] == ["gpu-1", "node:n1"]
    assert q.blocks(["gpu-2"], "n1") and not q.blocks(["gpu-2"], "n2")  # every card of the node now

    again = Quarantine(QuarantineSettings(threshold=2, node_threshold=2), store, clock)
    await again.load()
    assert again.blocked_devices() == {"gpu-0", "gpu-1"} and again.blocks([], "n1")
    released = await again.release("gpu-0", "ops")
    assert not released.quarantined and released.failures == 0 and released.released_by == "ops"
    assert not again.blocks(["gpu-0"]) and store.records["gpu-0"].released_by == "ops"
    await again.release("n1", "ops")  # a node by its id
    assert not again.blocks(["gpu-2"], "n1")
    with pytest.raises(NotFound):
        await again.release("gpu-0", "ops")  # no longer quarantined
    kinds = [d.kind for d in decisions.RECENT[-5:]]
    assert kinds[-2:] == [decisions.QUARANTINE_RELEASED, decisions.QUARANTINE_RELEASED]


def test_the_catalog_sets_the_threshold_and_rejects_unknown_keys() -> None:
    catalog = load_catalog("pools: [{name: cpu}]\nquarantine: {threshold: 5, free_requeues: 1}\n")
    assert catalog.quarantine == QuarantineSettings(threshold=5, node_threshold=2, free_requeues=1)
    assert load_catalog("pools: [{name: cpu}]\n").quarantine.threshold == 3
    with pytest.raises(ValueError, match="quarantine.treshold: unknown key"):
        load_catalog("pools: [{name: cpu}]\nquarantine: {treshold: 5}\n")


def _remember_gpus(h: Harness) -> dict[str, tuple[str, ...]]:
    """The fake backend forgets a deleted pod: each pod's devices, recorded when it is created."""
    gpus: dict[str, tuple[str, ...]] = {}
    real = h.backend.create

    async def create(request):  # noqa: ANN001, ANN202 - wraps the fake's method
        info = await real(request)
        gpus[info.name] = info.gpus
        return info

    h.backend.create = create  # type: ignore[method-assign]
    return gpus


async def test_a_device_failing_three_times_gets_no_further_pod_until_released() -> None:
    h = Harness([gpu_pool(max_count=2, step=1)], gpus=2)
    gpus = _remember_gpus(h)
    await h.start()
    try:
        job = await h.run_job(pool="gpu", command=("fault", "Xid 79 (hardware)"), max_retries=0)
        # Three free re-queues on fake-gpu-0 quarantined it; the fourth attempt went elsewhere, and with the
        # free re-queues spent and no retries allowed the job failed there, on hardware, retries untouched.
        assert [gpus[a.pods[0]][0] for a in job.attempts] == ["fake-gpu-0"] * 3 + ["fake-gpu-1"]
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.HARDWARE_FAULT and job.retries == 0
        assert all(a.error_class == ErrorClass.HARDWARE_FAULT for a in job.attempts)
        assert h.cp.health.quarantine.blocked_devices() == {"fake-gpu-0"}
        assert h.quarantine.records["fake-gpu-1"].failures == 1 and not h.quarantine.records["fake-gpu-1"].quarantined
        assert not any(p.gpus == ("fake-gpu-0",) for p in h.cp.tracker.snapshot())  # its pods retired

        busy = await h.submit("bob", pool="gpu", command=("sleep", "100"))
        await h.until(lambda: h.store.get(busy.id).state is JobState.RUNNING)  # type: ignore[union-attr]
        waiting = await h.submit("carol", pool="gpu", command=("exit", "0"))
        await h.run_for(10.0)
        assert h.store.get(waiting.id).state is JobState.QUEUED  # type: ignore[union-attr]
        assert all(g != ("fake-gpu-0",) for name, g in gpus.items()
                   if name not in {a.pods[0] for a in job.attempts})  # no further pod on it

        await h.cp.health.quarantine.release("fake-gpu-0", "ops")
        done = await h.finish(waiting)
        assert done.state is JobState.SUCCEEDED and gpus[done.pods[0]] == ("fake-gpu-0",)
        kinds = [(e.kind, e.subject) for e in h.store.list_events() if e.kind.startswith("quarantine")]
        assert kinds == [("quarantined", "device/fake-gpu-0"), ("quarantine_released", "device/fake-gpu-0")]
    finally:
        await h.stop()


async def test_a_busy_pod_on_a_device_quarantined_meanwhile_retires_when_its_job_ends() -> None:
    h = await Harness([gpu_pool(max_count=2, step=1)], gpus=2).start()
    try:
        long = await h.submit("bob", pool="gpu", command=("sleep", "5"))
        await h.until(lambda: h.store.get(long.id).state is JobState.RUNNING)  # type: ignore[union-attr]
        pod = h.store.get(long.id).pods[0]  # type: ignore[union-attr]
        key = h.cp.tracker.pods[pod].gpus[0]
        for _ in range(3):
            await h.cp.health.quarantine.fault([key], "", "Xid 79 (hardware)")
        assert h.cp.tracker.pods[pod].retire  # drained: retires at release, never handed another job
        done = await h.finish(long)
        assert done.state is JobState.SUCCEEDED  # the running job was not killed
        await h.run_for(1.0)
        assert pod not in h.cp.tracker.pods or h.cp.tracker.pods[pod].state in (PodState.RETIRING, PodState.GONE)
    finally:
        await h.stop()


async def test_a_failure_nvml_explains_is_a_hardware_fault_of_that_card_only() -> None:
    h = Harness([gpu_pool(max_count=1, step=1)], gpus=2, quarantine_settings=QuarantineSettings(threshold=1))
    readings: dict[str, GpuHealth] = {"fake-gpu-0": GpuHealth(ecc_uncorrected=4), "fake-gpu-1": GpuHealth()}

    async def reader(keys: Sequence[str]) -> Mapping[str, GpuHealth]:
        return {k: readings[k] for k in keys if k in readings}

    h.cp.health.reader = reader  # an injected NVML reading: this machine has no GPU
    await h.start()
    try:
        readings["fake-gpu-0"] = GpuHealth(ecc_uncorrected=5)  # the card logged one more while the job ran
        job = await h.run_job(pool="gpu", command=("exit", "1"), max_retries=0)
        first = job.attempts[0]
        assert first.error_class == ErrorClass.HARDWARE_FAULT and "uncorrectable ECC" in (first.message or "")
        assert h.cp.health.quarantine.blocked_devices() == {"fake-gpu-0"}
        # Re-queued for free onto the other card, where the plain exit 1 is the job's own failure.
        assert job.state is JobState.FAILED and job.error_class == ErrorClass.NON_ZERO_EXIT and job.retries == 0
        assert len(job.attempts) == 2
    finally:
        await h.stop()


async def test_operators_list_and_release_quarantines_over_rest_and_others_get_403() -> None:
    h = await Harness([gpu_pool()], gpus=2).start()
    app = create_app(h.cp, TokenAuth({"a": "alice", "o": {"caller": "ops", "admin": True}}))
    try:
        for _ in range(3):
            await h.cp.health.quarantine.fault(["fake-gpu-1"], "", "Xid 79 (hardware)")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
            ops, alice = {"Authorization": "Bearer o"}, {"Authorization": "Bearer a"}
            assert (await http.get("/v1/admin/quarantine", headers=alice)).status_code == 403
            assert (await http.post("/v1/admin/quarantine/fake-gpu-1/release", headers=alice)).status_code == 403
            listed = (await http.get("/v1/admin/quarantine", headers=ops)).json()
            assert listed["threshold"] == 3
            assert [(r["key"], r["quarantined"], r["failures"]) for r in listed["quarantine"]] == [("fake-gpu-1", True, 3)]
            r = await http.post("/v1/admin/quarantine/fake-gpu-1/release", headers=ops)
            assert r.status_code == 200 and r.json()["released_by"] == "ops" and not r.json()["quarantined"]
            assert (await http.post("/v1/admin/quarantine/fake-gpu-1/release", headers=ops)).status_code == 404
            assert (await http.get("/v1/admin/quarantine", headers=ops)).json()["quarantine"] == []
        assert not h.cp.health.quarantine.blocked_devices()
    finally:
        await h.stop()


async def test_a_quarantined_node_reaches_every_new_pods_avoid_by_its_own_key() -> None:
    # Its cards alone were passed before: a node with none the backend lists (CPU pods' node) was not kept out.
    from broker.ports.quarantine import QuarantineRecord
    from tests.unit.harness import cpu_pool

    store = MemoryQuarantineStore()
    store.records["node:cpu-7"] = QuarantineRecord(key="node:cpu-7", kind="node", node="cpu-7", failures=2,
                                                   reason="kernel panics", updated_at=0.0, quarantined_at=0.0)
    h = await Harness([cpu_pool(min_count=1)], quarantine=store).start()
    try:
        await h.until(lambda: bool(h.backend.requests))
        assert all("node:cpu-7" in r.avoid for r in h.backend.requests.values())
    finally:
        await h.stop()
