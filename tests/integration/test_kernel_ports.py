"""The host ports an isolated pod's kernels are reached on: forwarded by slirp4netns from the host's
127.0.0.1 to fixed ports in the pod's namespace, reachable from the host, never from another isolated
pod (the host's loopback stays out of its reach), and closed when the pod is deleted."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Iterator

import pytest

from broker.backends import networking
from broker.backends.local import LocalBackend
from broker.clock import RealClock
from broker.pools import PoolSpec
from broker.ports.agent import LaunchRequest
from broker.ports.backend import PodRequest
from broker.sandbox import kernels
from tests.integration.conftest import BrokerProcess
from tests.integration.test_mcp_live_python import LIVE, USE, call, in_process
from tests.integration.test_network_isolation import (  # a token served on one port for a few seconds
    SERVE,
    probe,
)

pytestmark = pytest.mark.integration

ISOLATED = PoolSpec(name="cpu")
COLD = PoolSpec(name="cold", kernels="cold")



def kernel_ports(backend: LocalBackend, pod: str) -> dict[int, int]:
    record = json.loads((backend.pods_dir / pod / "pod.json").read_text())
    return {int(g): int(h) for g, h in record["kernel_ports"].items()}


def dial(port: int) -> str:
    """What the host's 127.0.0.1:port answers within a few seconds (slirp accepts, then relays or closes)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as c:
            c.settimeout(3)
            return c.recv(64).decode() or "empty"
    except OSError as exc:
        return type(exc).__name__


async def serve(backend: LocalBackend, pod: str, guest: int, token: str) -> None:
    await backend.agent(pod).launch(LaunchRequest(attempt_id=f"serve-{time.monotonic_ns()}:0",
                                                  argv=(sys.executable, "-S", "-c", SERVE, str(guest), token),
                                                  env={}, session="s"))


async def reached(port: int, token: str) -> str:
    """Dial until the server in the pod answers (it starts a moment after its launch)."""
    deadline = time.monotonic() + 10
    while True:
        got = await asyncio.to_thread(dial, port)
        if got == token or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


async def test_a_pods_kernel_ports_reach_its_namespace_from_the_host_and_close_with_the_pod(
        backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="kp-a", pool=COLD))  # cold: no pre-started kernel, kernel jobs still run
    ports = kernel_ports(backend, "kp-a")
    assert sorted(ports) == list(networking.KERNEL_GUEST_PORTS)
    assert len(set(ports.values())) == len(ports)
    guest = networking.KERNEL_GUEST_PORTS[0]
    await serve(backend, "kp-a", guest, "from-kp-a")
    assert await reached(ports[guest], "from-kp-a") == "from-kp-a"
    await backend.delete("kp-a")
    for host in ports.values():  # nothing listens on them any more: the ports are free for others
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a relayed connection may sit in TIME_WAIT
            s.bind(("127.0.0.1", host))
            s.listen()
    assert await asyncio.to_thread(dial, ports[guest]) == "ConnectionRefusedError"


async def test_another_isolated_pod_cannot_reach_a_pods_forwarded_kernel_ports(backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="kp-b", pool=ISOLATED))
    await backend.create(PodRequest(name="kp-c", pool=ISOLATED))
    ports = kernel_ports(backend, "kp-b")
    guest = networking.KERNEL_GUEST_PORTS[1]
    host = ports[guest]
    await serve(backend, "kp-b", guest, "from-kp-b")
    assert await reached(host, "from-kp-b") == "from-kp-b"  # the host reaches it: the probe below could succeed
    report = await probe(backend, "kp-c", [("127.0.0.1", host), ("10.0.2.2", host)])
    assert report["dials"][f"127.0.0.1:{host}"] == "ECONNREFUSED", report  # kp-c's own loopback
    assert report["dials"][f"10.0.2.2:{host}"] in ("ENETUNREACH", "ECONNREFUSED", "EHOSTUNREACH"), report
    assert set(kernel_ports(backend, "kp-c").values()).isdisjoint(ports.values())


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("kports") / "broker")  # the default catalog: isolated pods
    yield broker
    broker.stop()


async def test_python_exec_on_a_kernel_that_does_not_answer_in_time_fails_with_kernel_unreachable_not_a_hang(
        fp: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    # The MCP server reaches kernels only through the broker's gateway websocket (it dials no pod port); a
    # kernel that does not answer kernel_info there within REACH_TIMEOUT_S is reported, and shut down.
    monkeypatch.setattr(kernels, "REACH_TIMEOUT_S", 0.001)
    async with in_process(fp) as (c, _):
        began = time.monotonic()
        res = await c.call_tool("python_exec", {"code": "1", "session": "unreachable"})
        took = time.monotonic() - began
    assert res.is_error, res.content
    assert "KernelUnreachable" in str(res.content) and "broker's websocket" in str(res.content)
    assert took < 30, took
    assert fp.client().get("/api/kernels").json() == []  # nothing left running


async def test_python_exec_on_the_default_catalog_keeps_a_live_object(fp: BrokerProcess) -> None:
    async with in_process(fp) as (c, _):
        await call(c, "python_exec", code=LIVE, session="live-default")
        second = await call(c, "python_exec", code=USE, session="live-default")
    assert second["stdout_tail"] == "LOCKED True\n" and second["result"] == "42"


async def test_a_restarted_broker_gives_kernel_jobs_the_mapping_from_the_pod_record(backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="kp-d", pool=ISOLATED))
    ports = kernel_ports(backend, "kp-d")
    later = LocalBackend(backend.state_dir, RealClock(), virtual_gpus=2, sandbox="bwrap")  # the pods keep running
    try:
        assert [p.name for p in await later.list_pods()] == ["kp-d"]
        env = dict(later.rendezvous("kp-d", 1).kernel_env)
        assert env == {networking.KERNEL_PORTS_ENV: networking.encode_ports(ports)}
        guest = networking.KERNEL_GUEST_PORTS[2]
        await serve(later, "kp-d", guest, "still-forwarded")
        assert await reached(ports[guest], "still-forwarded") == "still-forwarded"
    finally:
        await later.close()
