"""Forwarded kernel ports: only a kernel job gets the pod's mapping, and the launcher reads it strictly."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from broker.backends.podnets import kernel_env
from broker.jobs import Job, JobState
from broker.running.topology import Rendezvous
from firepool_agent.kernel import forwarded_ports
from tests.unit.harness import Harness, cpu_pool

MAPPING = {"47101": 50001, "47102": 50002, "47103": 50003, "47104": 50004, "47105": 50005}


def test_a_pod_record_with_forwarded_ports_becomes_the_kernel_jobs_variable() -> None:
    assert kernel_env({"kernel_ports": MAPPING}) == (
        ("FIREPOOL_KERNEL_PORTS", "47101:50001,47102:50002,47103:50003,47104:50004,47105:50005"),)
    assert kernel_env({"network": "host"}) == ()  # a host-network pod (or one made before forwarding)


def test_the_launcher_takes_five_guest_host_pairs_and_nothing_else() -> None:
    assert forwarded_ports("47101:50001,47102:50002,47103:50003,47104:50004,47105:50005") == [
        (47101, 50001), (47102, 50002), (47103, 50003), (47104, 50004), (47105, 50005)]
    for bad in ("", "47101:50001", "a:b,1:2,3:4,5:6,7:8", "1:2,3:4,5:6,7:8,9:10,11:12"):
        assert forwarded_ports(bad) is None


@pytest.mark.parametrize("kernel", [True, False])
async def test_only_a_kernel_job_gets_its_pods_forwarded_ports(kernel: bool) -> None:
    h = await Harness([cpu_pool()]).start()
    plain = h.backend.rendezvous

    def with_ports(coordinator: str, world: int, members: Sequence[str] = ()) -> Rendezvous:
        return dataclasses.replace(plain(coordinator, world, members), kernel_env=kernel_env({"kernel_ports": MAPPING}))

    h.backend.rendezvous = with_ports  # type: ignore[method-assign]
    try:
        job: Job = await h.run_job("bob", command=("sleep", "1"), extra={"kernel": True} if kernel else {})
        assert job.state is JobState.SUCCEEDED
        [request] = [r for r in h.backend.agents[job.pods[0]].launches if r.attempt_id.startswith(job.id)]
        assert ("FIREPOOL_KERNEL_PORTS" in request.env) is kernel
    finally:
        await h.stop()
