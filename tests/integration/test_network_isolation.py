"""A pod's network, probed from inside its job: `isolated` (the default) has outbound access through
slirp4netns but never the host's loopback, `none` has no route at all, `host` reaches the host's
127.0.0.1 (which proves the probe can fail); the network helper dies with its pod."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time

import pytest

from broker.backends.local import LocalBackend
from broker.pools import PoolSpec
from broker.ports.agent import LaunchRequest
from broker.ports.backend import PodRequest
from firepool_agent import proctree

pytestmark = pytest.mark.integration

ISOLATED = PoolSpec(name="cpu")
NONE = PoolSpec(name="offline", template={"network": "none"})
HOST = PoolSpec(name="shared", template={"network": "host"})

# Interfaces and routes from /proc (no `ip` needed), then a connect to each target; errno names what refused it.
PROBE = r"""
import errno, json, socket, sys
targets = json.loads(sys.argv[1])
routes = [line.split()[:3] for line in open("/proc/net/route").read().splitlines()[1:]]
ifaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
dials = {}
for host, port in targets:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        dials[f"{host}:{port}"] = "connected"
    except OSError as exc:
        dials[f"{host}:{port}"] = errno.errorcode.get(exc.errno, str(exc)) if exc.errno else type(exc).__name__
    finally:
        s.close()
print(json.dumps({"routes": routes, "ifaces": ifaces, "dials": dials, "resolv": open("/etc/resolv.conf").read()}))
"""


def host_address() -> str | None:
    """A non-loopback address of this host, if it has one (the address outbound traffic leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source address
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def probe(backend: LocalBackend, pod: str, targets: list[tuple[str, int]]) -> dict:
    agent = backend.agent(pod)
    attempt = f"probe-{time.monotonic_ns()}:0"
    await agent.launch(LaunchRequest(attempt_id=attempt, argv=(sys.executable, "-S", "-c", PROBE, json.dumps(targets)),
                                     env={}, session="s"))
    status = await agent.wait(attempt, 60)
    output = (await agent.read_log(attempt)).data.decode()
    assert status.exit_code == 0, output
    report: dict = json.loads(output.strip().splitlines()[-1])
    return report


@pytest.fixture
def listener():
    """A listener on the host's 127.0.0.1 (what the job store, the broker and MCP look like to a job)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(16)
    yield int(server.getsockname()[1])
    server.close()


async def test_an_isolated_job_has_a_default_route_but_cannot_reach_the_hosts_loopback(backend: LocalBackend,
                                                                                         listener: int) -> None:
    await backend.create(PodRequest(name="iso", pool=ISOLATED))
    report = await probe(backend, "iso", [("127.0.0.1", listener), ("10.0.2.2", listener)])
    assert "tap0" in report["ifaces"] and "lo" in report["ifaces"], report
    assert ["tap0", "00000000", "0202000A"] in report["routes"], report  # default via 10.0.2.2
    assert report["resolv"].strip() == "nameserver 10.0.2.3"
    # Its own loopback has nothing there; slirp's gateway, which would be the host's loopback, refuses.
    assert report["dials"][f"127.0.0.1:{listener}"] == "ECONNREFUSED", report
    assert report["dials"][f"10.0.2.2:{listener}"] in ("ENETUNREACH", "ECONNREFUSED", "EHOSTUNREACH"), report


async def test_an_isolated_job_reaches_a_host_address_that_is_not_loopback(backend: LocalBackend) -> None:
    """Outbound TCP works (there is no internet here: the host's own external address stands in for it)."""
    address = host_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to dial")
    server = socket.create_server((address, 0))
    try:
        await backend.create(PodRequest(name="out", pool=ISOLATED))
        report = await probe(backend, "out", [(address, server.getsockname()[1])])
        assert list(report["dials"].values()) == ["connected"], report
    finally:
        server.close()


async def test_an_isolated_job_resolves_names_through_the_stacks_resolver(backend: LocalBackend) -> None:
    name = "pypi.org"
    try:
        socket.getaddrinfo(name, 443)
    except OSError:
        pytest.skip(f"this host cannot resolve {name} either")
    await backend.create(PodRequest(name="dns", pool=ISOLATED))
    agent = backend.agent("dns")
    resolve = f"import socket; print(sorted({{a[4][0] for a in socket.getaddrinfo({name!r}, 443)}}))"
    await agent.launch(LaunchRequest(attempt_id="dns:0", argv=(sys.executable, "-S", "-c", resolve), env={},
                                     session="s"))
    status = await agent.wait("dns:0", 30)
    output = (await agent.read_log("dns:0")).data.decode()
    assert status.exit_code == 0 and output.startswith("['"), output


async def test_network_none_has_no_route_and_host_reaches_the_listener(backend: LocalBackend, listener: int) -> None:
    await backend.create(PodRequest(name="cut-off", pool=NONE))
    await backend.create(PodRequest(name="shared", pool=HOST))
    cut = await probe(backend, "cut-off", [("127.0.0.1", listener), ("10.0.2.2", listener)])
    assert cut["routes"] == [] and cut["ifaces"] == ["lo"], cut
    assert cut["dials"][f"127.0.0.1:{listener}"] == "ECONNREFUSED"
    assert cut["dials"][f"10.0.2.2:{listener}"] == "ENETUNREACH"
    shared = await probe(backend, "shared", [("127.0.0.1", listener)])
    assert shared["dials"] == {f"127.0.0.1:{listener}": "connected"}  # the same probe can connect


def _gone(pid: int) -> bool:
    proc = proctree.read_proc(pid)
    return proc is None or not proc.alive


async def test_the_network_helper_dies_with_its_pod_deleted_or_killed(backend: LocalBackend) -> None:
    await backend.create(PodRequest(name="net-a", pool=ISOLATED))
    await backend.create(PodRequest(name="net-b", pool=ISOLATED))
    helpers = {}
    for name in ("net-a", "net-b"):
        record = json.loads((backend.pods_dir / name / "pod.json").read_text())
        helpers[name] = record["net_pid"]
        with open(f"/proc/{record['net_pid']}/cmdline") as f:
            assert "slirp4netns" in f.read()
    await backend.delete("net-a")
    assert not os.path.exists(f"/proc/{helpers['net-a']}")  # killed and reaped, not a zombie
    # A pod that dies on its own takes its helper along (its exit-fd is a pidfd of the sandbox).
    record = json.loads((backend.pods_dir / "net-b" / "pod.json").read_text())
    os.kill(record["pid"], 9)
    deadline = time.monotonic() + 5
    while not _gone(helpers["net-b"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert _gone(helpers["net-b"])
    assert await backend.list_pods() == []
    assert not os.path.exists(f"/proc/{helpers['net-b']}")


# Rank 0 answers every connection with a token for a few seconds: a connect alone proves nothing here,
# as this host's network accepts any outbound TCP connection (a stand-in for the internet).
SERVE = """
import socket, sys
s = socket.create_server(("0.0.0.0", int(sys.argv[1])))
s.settimeout(6)
try:
    while True:
        c, _ = s.accept()
        c.sendall(sys.argv[2].encode())
        c.close()
except TimeoutError:
    pass
"""
FETCH = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as c:
        c.settimeout(2)
        print(c.recv(64).decode() or "empty")
except OSError as exc:
    print(type(exc).__name__)
"""


async def fetch(backend: LocalBackend, pod: str, addr: str, port: int) -> str:
    agent = backend.agent(pod)
    attempt = f"fetch-{time.monotonic_ns()}:0"
    await agent.launch(LaunchRequest(attempt_id=attempt, argv=(sys.executable, "-S", "-c", FETCH, addr, str(port)),
                                     env={}, session="s"))
    await agent.wait(attempt, 30)
    return (await agent.read_log(attempt)).data.decode().strip()


async def test_a_gangs_ranks_reach_each_other_over_their_link_and_nothing_else(backend: LocalBackend,
                                                                                listener: int) -> None:
    for name in ("rank0", "rank1", "outsider"):
        await backend.create(PodRequest(name=name, pool=ISOLATED))
    rdzv = backend.rendezvous("rank0", 2, ["rank0", "rank1"])
    assert (rdzv.addr, dict(rdzv.env)["GLOO_SOCKET_IFNAME"]) == ("10.213.0.1", "gang0")
    token = f"rank0-{time.monotonic_ns()}"
    agent = backend.agent("rank0")
    await agent.launch(LaunchRequest(attempt_id="serve:0", argv=(sys.executable, "-S", "-c", SERVE, str(rdzv.port),
                                                                 token), env={}, session="s"))
    await asyncio.sleep(0.5)  # let it listen
    assert await fetch(backend, "rank1", rdzv.addr, rdzv.port) == token
    assert await fetch(backend, "rank1", "127.0.0.1", listener) == "ConnectionRefusedError"
    assert await fetch(backend, "outsider", rdzv.addr, rdzv.port) != token  # not on the gang's segment
    # The next job on either pod starts with the link cut.
    backend.rendezvous("rank1", 1, ["rank1"])
    assert await fetch(backend, "rank1", rdzv.addr, rdzv.port) != token
    assert "gang0" not in (await probe(backend, "rank1", []))["ifaces"]
    assert (await agent.wait("serve:0", 20)).exit_code == 0
    assert "gang0" in (await probe(backend, "rank0", []))["ifaces"]  # rank 0's bridge, now with no port
    backend.rendezvous("rank0", 1, ["rank0"])
    assert "gang0" not in (await probe(backend, "rank0", []))["ifaces"]


DIAL = "import socket, sys\ntry:\n    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3); print('connected')\n" \
       "except OSError as exc:\n    print(type(exc).__name__)\n"


def test_a_job_on_the_default_pool_cannot_reach_the_broker_and_host_is_logged(broker_factory) -> None:
    from tests.integration.conftest import run_job

    broker = broker_factory(pools="pools:\n  - {name: cpu, max_count: 2}\n"
                                  "  - {name: open, max_count: 1, template: {network: host}}\n")
    c = broker.client("alice")
    assert c.get("/healthz").json()["isolation"] == "sandbox"
    outputs = {}
    for pool in ("cpu", "open"):
        job = run_job(c, {"pool": pool, "command": ["python3", "-S", "-c", DIAL, str(broker.port)]})
        assert job["state"] == "SUCCEEDED", job
        outputs[pool] = c.get(f"/v1/jobs/{job['id']}/logs").text.strip().splitlines()[-1]
    assert outputs == {"cpu": "ConnectionRefusedError", "open": "connected"}
    log = broker.log()
    assert "pool open: network: host" in log and "pool cpu: network" not in log
