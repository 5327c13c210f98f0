"""What a job in one bubblewrap pod can and cannot reach: other pods, its agent's secret, the broker.

Two pods run side by side; pod B leaves markers in its workspace, /tmp and /dev/shm and keeps a
process alive, then pod A's job searches for all of it and for its own agent's secret.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys

import pytest

from broker.backends.local import LocalBackend
from broker.pools import PoolSpec
from broker.ports.agent import LaunchRequest
from broker.ports.backend import PodRequest

pytestmark = pytest.mark.integration

CPU = PoolSpec(name="cpu")

# The probe runs in pod A. It gets the secret only XOR-masked (argv holds mask and masked value),
# rebuilds it in its own memory, and looks for it everywhere it can read. A control value, planted
# in pod A's /tmp and the probe's own environment, proves the search finds what is there.
PROBE = r"""
import json, os, sys, ctypes
mask, masked, control_masked, marker, state_dir, created = sys.argv[1:7]
unmask = lambda hexed: bytes(a ^ b for a, b in zip(bytes.fromhex(mask), bytes.fromhex(hexed)))
secret, control = unmask(masked), unmask(control_masked)
created = float(created)
report = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "secret_in": [],
          "control_in": [], "marker_in": [], "denied": {}, "files_read": 0, "files_seen": 0, "uid": os.getuid()}

def search(where, data):
    for needle, key in ((secret, "secret_in"), (control, "control_in")):
        if needle in data:
            report[key].append(where)

search("own environment", b"".join(f"{k}={v}".encode() for k, v in os.environ.items()))
for pid in report["pids"]:
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                search(f"/proc/{pid}/{name}", f.read())
        except OSError as exc:
            report["denied"][f"/proc/{pid}/{name}"] = exc.strerror
for path in ("/proc/1/mem", "/proc/1/maps", "/proc/1/fd", "/etc/shadow", state_dir):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        report["denied"][path] = None
    except OSError as exc:
        report["denied"][path] = exc.strerror
libc = ctypes.CDLL(None, use_errno=True)
report["ptrace_pid1"] = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH: -1 when refused
SKIP = ("/proc", "/sys")
FRESH = ("/workspace", "/tmp", "/pkg", "/run", "/dev/shm", "/opt")
VENV = os.path.dirname(os.path.dirname(sys.executable))  # bin/python3's venv (-S: sys.prefix is the base's)
for top, dirs, files in os.walk("/"):
    if top.startswith(SKIP) or (top.startswith("/dev") and not top.startswith("/dev/shm")):
        dirs[:] = []
        continue
    for name in files + dirs:
        if marker in name:
            report["marker_in"].append(os.path.join(top, name))
    for name in files:
        path = os.path.join(top, name)
        report["files_seen"] += 1
        try:
            st = os.lstat(path)
            if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > (1 << 20):
                continue
            # The secret was made when the pod was; an older file cannot hold it. The pod's own directories are
            # read whatever their times say, but not the host's venv bound in at its path (under /tmp in a checkout
            # there, tens of thousands of files: reading them all outlasts the wait below on a busy machine).
            fresh = top.startswith(FRESH) and not top.startswith(VENV)
            if st.st_mtime < created - 2 and st.st_ctime < created - 2 and not fresh:
                continue
            with open(path, "rb") as f:
                data = f.read()
            report["files_read"] += 1
            search(path, data)
            if marker.encode() in data:
                report["marker_in"].append(path)
        except OSError:
            pass
print(json.dumps(report))
"""


async def run(backend: LocalBackend, pod: str, attempt_id: str, *argv: str, env: dict[str, str] | None = None) -> str:
    agent = backend.agent(pod)
    await agent.launch(LaunchRequest(attempt_id=attempt_id, argv=argv, env=env or {}, session="s"))
    status = await agent.wait(attempt_id, 60)
    output = (await agent.read_log(attempt_id)).data.decode()
    assert status.exit_code == 0, output
    return output


async def test_a_job_sees_nothing_of_other_pods_its_agents_secret_or_the_broker(backend: LocalBackend) -> None:
    a = await backend.create(PodRequest(name="pod-a", pool=CPU))
    await backend.create(PodRequest(name="pod-b", pool=CPU))
    marker = "marker-" + secrets.token_hex(8)
    await run(backend, "pod-b", "b:0", "sh", "-c",
              f"echo {marker} > /workspace/{marker}; echo {marker} > /tmp/{marker}; "
              f"echo {marker} > /dev/shm/{marker}; (exec -a {marker} sleep 300) > /dev/null 2>&1 &")

    secret = json.loads((backend.pods_dir / "pod-a" / "pod.json").read_text())["secret"].encode()
    control = secrets.token_urlsafe(32).encode()[: len(secret)]
    mask = os.urandom(len(secret))
    masked, control_masked = (bytes(x ^ y for x, y in zip(v, mask, strict=True)).hex() for v in (secret, control))
    await run(backend, "pod-a", "plant:0", "sh", "-c", f"echo {control.decode()} > /tmp/control")
    output = await run(backend, "pod-a", "a:0", sys.executable, "-S", "-c", PROBE, mask.hex(), masked,
                       control_masked, marker, str(backend.state_dir), str(a.created_at),
                       env={"CONTROL": control.decode()})
    report = json.loads(output)
    print(f"probe read {report['files_read']} of {report['files_seen']} files; pids {report['pids']}")

    assert report["secret_in"] == []
    assert "/tmp/control" in report["control_in"] and "own environment" in report["control_in"]
    assert report["marker_in"] == []  # not in pod B's workspace, /tmp, /dev/shm, nor its process list
    assert report["files_read"] > 0 and report["files_seen"] > 1000  # the walk really covered the filesystem
    own_pids = set(report["pids"])
    assert 1 in own_pids and len(own_pids) <= 3, own_pids  # the agent, the probe, nothing of pod B
    denied = report["denied"]
    assert denied["/proc/1/environ"] == "Permission denied"  # the agent is not dumpable
    assert "/proc/1/cmdline" not in denied  # readable, and it holds only the secret's fd number
    assert denied["/proc/1/mem"] and denied["/proc/1/maps"] and denied["/proc/1/fd"]
    assert denied[str(backend.state_dir)] == "No such file or directory"
    assert report["ptrace_pid1"] == -1
    assert denied["/etc/shadow"] == "No such file or directory"  # the sandbox's /etc is minimal (sandboxetc.py)
    if os.geteuid() == 0:
        assert report["uid"] == 65534


async def test_network_none_cuts_a_pod_off_the_hosts_loopback(backend: LocalBackend) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    dial = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    try:
        await backend.create(PodRequest(name="shared", pool=PoolSpec(name="shared", template={"network": "host"})))
        await backend.create(PodRequest(name="cut-off", pool=PoolSpec(name="offline", template={"network": "none"})))
        assert await run(backend, "shared", "dial:0", sys.executable, "-S", "-c", dial) == "connected\n"
        agent = backend.agent("cut-off")
        await agent.launch(LaunchRequest(attempt_id="dial:0", argv=(sys.executable, "-S", "-c", dial), env={},
                                         session="s"))
        status = await agent.wait("dial:0", 30)
        assert status.exit_code == 1 and b"ConnectionRefusedError" in (await agent.read_log("dial:0")).data
    finally:
        server.close()
