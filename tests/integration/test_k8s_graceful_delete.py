"""Graceful pod deletion: the emulator's terminating phase (deletionTimestamp, SIGTERM, SIGKILL at the end of
the grace, then the object goes; a terminating pod keeps its node's GPU), and the backend deleting with the
pool's grace and returning only once the object is gone, so its GPU counts as taken until it is free."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from broker.pools import parse_pool
from broker.ports.backend import PodRequest
from k8s_emulator import Emulator, KubeletConfig
from tests.integration.test_k8s_backend import core, new_backend

pytestmark = pytest.mark.integration

GRACE_S = 2
TOKEN = {"metadata": {"name": "tok"}, "data": {"token": "c2VjcmV0LXNlY3JldC0xMjM0NQ=="}}


def gpu_pod(name: str, grace_s: int = GRACE_S) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"t": "graceful"}},
            "spec": {"terminationGracePeriodSeconds": grace_s,
                     "containers": [{"name": "agent", "image": "firepool/agent:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                     "volumes": [{"name": "s", "secret": {"secretName": "tok"}}]}}


def until(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def record_events(emu: Emulator) -> tuple[list[tuple[float, str, str, dict[str, Any]]], threading.Event]:
    """(time, type, pod, object) of every pod event from now, read on a thread of the test's own."""
    events: list[tuple[float, str, str, dict[str, Any]]] = []
    stop = threading.Event()
    rv = core(emu).list_namespaced_pod("default").metadata.resource_version

    def read() -> None:
        w = kubernetes.watch.Watch()
        # The stream ends with the emulator (a cut connection): nothing after that is the test's business.
        with contextlib.suppress(Exception):
            for event in w.stream(core(emu).list_namespaced_pod, "default", resource_version=rv, timeout_seconds=60):
                obj = event["raw_object"]
                events.append((time.monotonic(), event["type"], obj["metadata"]["name"], obj))
                if stop.is_set():
                    w.stop()

    threading.Thread(target=read, daemon=True).start()
    return events, stop


def started(emu: Emulator, name: str) -> bool:
    return emu.pod(name)["status"].get("phase") == "Running"


def test_a_terminating_pod_gets_sigterm_then_sigkill_at_the_grace_end_and_keeps_its_gpu_until_gone(
        tmp_path: Path) -> None:
    """The agent is its sandbox's PID 1 and has no SIGTERM handler, so only the SIGKILL at the end of the
    grace ends it: the pod stays Terminating for the whole grace, holding the node's one GPU."""
    with Emulator(tmp_path, gpus=1, kubelet=KubeletConfig(sandbox="bwrap")) as emu:
        api = core(emu)
        api.create_namespaced_secret("default", TOKEN)
        api.create_namespaced_pod("default", gpu_pod("first"))
        until(lambda: started(emu, "first"))
        events, stop = record_events(emu)
        t0 = time.monotonic()
        api.delete_namespaced_pod("first", "default")
        terminating = emu.pod("first")["metadata"]
        assert terminating["deletionTimestamp"] and terminating["deletionGracePeriodSeconds"] == GRACE_S
        api.create_namespaced_pod("default", gpu_pod("second"))
        until(lambda: any(t == "DELETED" and n == "first" for _, t, n, _ in events), GRACE_S + 15)
        until(lambda: started(emu, "second"))
        # The watch thread reads the binding of "second" a moment after the store made it.
        until(lambda: any(n == "second" and (o.get("spec") or {}).get("nodeName") for _, _, n, o in events), 10)
        stop.set()
        gone_at = next(at for at, t, n, _ in events if t == "DELETED" and n == "first")
        assert gone_at - t0 >= GRACE_S - 0.1, "SIGKILL came only at the end of the grace"
        first = [(t, o["metadata"].get("deletionTimestamp") is not None) for _, t, n, o in events if n == "first"]
        assert first[0] == ("MODIFIED", True) and first[-1][0] == "DELETED"
        bound = next(at for at, t, n, o in events if n == "second" and (o.get("spec") or {}).get("nodeName"))
        assert bound >= gone_at, "the GPU was handed on only once the terminating pod was gone"


def test_an_agent_that_handles_sigterm_ends_its_pod_before_the_grace(tmp_path: Path) -> None:
    """Unsandboxed, the agent stops on SIGTERM (it kills its jobs and exits): the pod goes at once, not
    after the grace."""
    with Emulator(tmp_path, gpus=1, kubelet=KubeletConfig(sandbox="none")) as emu:
        api = core(emu)
        api.create_namespaced_secret("default", TOKEN)
        api.create_namespaced_pod("default", gpu_pod("quick", grace_s=30))
        until(lambda: started(emu, "quick"))
        t0 = time.monotonic()
        api.delete_namespaced_pod("quick", "default")
        until(lambda: not api.list_namespaced_pod("default").items, 25)
        assert time.monotonic() - t0 < 10


async def test_the_backend_deletes_with_the_pools_grace_and_returns_once_the_pod_is_gone(tmp_path: Path) -> None:
    pool = parse_pool({"name": "cpu", "template": {"image": "firepool/sandbox-cpu:0.1.0",
                                                   "termination_grace_s": GRACE_S}})
    with Emulator(tmp_path / "k8s") as emu:
        backend = new_backend(emu)
        try:
            await backend.create(PodRequest(name="cpu-graceful", pool=pool))
            assert emu.pod("cpu-graceful")["spec"]["terminationGracePeriodSeconds"] == GRACE_S
            events, stop = record_events(emu)
            await backend.delete("cpu-graceful")
            with pytest.raises(Exception, match="not found"):  # gone when delete returns: its GPUs are free
                emu.pod("cpu-graceful")
            # The watch thread reads the DELETED event a moment after the store dropped the object.
            until(lambda: any(t == "DELETED" and n == "cpu-graceful" for _, t, n, _ in events), 10)
            stop.set()
        finally:
            await backend.close()
        mine = [(at, t, o) for at, t, n, o in events if n == "cpu-graceful"]
        marked = [o for _, t, o in mine if t == "MODIFIED" and o["metadata"].get("deletionTimestamp")]
        assert marked and marked[0]["metadata"]["deletionGracePeriodSeconds"] == GRACE_S, "no force delete"
        assert [t for _, t, _ in mine][-1] == "DELETED"
