"""Owner annotations on the kubernetes backend: identity changes are written at once, ageing ones (hold
deadline, idle-since, job) coalesced off the claim path, flushed on a clean stop, never written for a
pod being deleted, and one pod's writes land in order."""

from __future__ import annotations

import asyncio

from broker.backends.kubernetes.annotating import Annotator
from broker.clock import VirtualClock
from broker.pods import ANNOTATION_PREFIX, Origin, Pod, owner_annotations
from tests.unit.test_k8s_backend import Harness, settle, start

P = ANNOTATION_PREFIX


def _owner(hold: float, job: str = "", caller: str = "alice", used: bool = True) -> dict[str, str]:
    pod = Pod("cpu-1", "cpu", origin=Origin.DEMAND)
    if caller:
        pod.caller, pod.key = caller, (caller, "default", "t")
    pod.hold_until, pod.idle_since, pod.used, pod.job = hold, hold - 60, used, job or None
    return owner_annotations(pod)


async def test_a_warm_loop_writes_its_ageing_record_once_per_window_and_identity_at_once() -> None:
    h = Harness()
    try:
        await start(h, "cpu-1")
        api_pod = lambda: h.api.pod("cpu-1")["metadata"]["annotations"]  # noqa: E731
        await h.backend.annotate("cpu-1", _owner(100.0, caller="", used=True, job="j1"))  # first launch: used
        assert api_pod()[P + "used"] == "1"  # identity: on the pod when annotate returns
        writes = h.backend.annotator.writes
        for i in range(5):  # five warm jobs of one session: launch (job) and reset (hold, idle-since)
            await h.backend.annotate("cpu-1", _owner(200.0 + i, caller="", job=f"j{i + 2}"))
            await h.backend.annotate("cpu-1", _owner(200.0 + i, caller=""))
        assert h.backend.annotator.writes == writes  # nothing written yet
        assert api_pod()[P + "hold-until"] == "100.0"
        h.clock.advance(1.0)
        await settle()
        assert h.backend.annotator.writes == writes + 1  # one coalesced write, the latest values
        assert api_pod()[P + "hold-until"] == "204.0" and api_pod()[P + "job"] == ""
        await h.backend.annotate("cpu-1", _owner(300.0, caller="bob"))  # a new owner: at once
        assert api_pod()[P + "caller"] == "bob" and api_pod()[P + "hold-until"] == "300.0"
        await h.backend.annotate("cpu-1", _owner(300.0, caller="bob"))
        assert h.backend.annotator.writes == writes + 2  # nothing changed: nothing written
    finally:
        await h.backend.close()


async def test_a_clean_stop_flushes_pending_ageing_writes() -> None:
    h = Harness()
    await start(h, "cpu-1")
    await h.backend.annotate("cpu-1", _owner(100.0))
    await h.backend.annotate("cpu-1", _owner(150.0))
    assert h.api.pod("cpu-1")["metadata"]["annotations"][P + "hold-until"] == "100.0"
    await h.backend.close()
    assert h.api.pod("cpu-1")["metadata"]["annotations"][P + "hold-until"] == "150.0"


async def test_nothing_is_written_for_a_pod_being_deleted() -> None:
    h = Harness()
    try:
        await start(h, "cpu-1")
        await h.backend.annotate("cpu-1", _owner(100.0))
        await h.backend.annotate("cpu-1", _owner(150.0))
        writes = h.backend.annotator.writes
        await h.backend.delete("cpu-1")
        h.clock.advance(2.0)
        await settle()
        assert h.backend.annotator.writes == writes
    finally:
        await h.backend.close()


async def test_writes_to_one_pod_land_in_the_order_they_were_asked() -> None:
    clock = VirtualClock()
    landed: list[str] = []
    gate = asyncio.Event()

    async def write(name: str, body: dict[str, str]) -> None:
        if not landed and not gate.is_set():
            await gate.wait()  # the first PATCH is slow
        landed.append(body[P + "caller"])

    annotator = Annotator(clock, write)
    first = asyncio.create_task(annotator.annotate("p", {}, {P + "caller": "alice"}))
    await asyncio.sleep(0)
    second = asyncio.create_task(annotator.annotate("p", {}, {P + "caller": "bob"}))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, second)
    assert landed[-1] == "bob"  # the newer record is the one the pod keeps
