"""Every path a job can write is capped: a real bubblewrap sandbox, filled mount by mount.

The probe runs inside a job and reads the sandbox's own /proc/self/mountinfo, so a writable mount
added later (a new bind, a new tmpfs) is probed without touching this test. Each mount must refuse
the job's 300th MiB or earlier (ENOSPC on a capped disk or sized tmpfs, EROFS or EACCES where the job
may not write), and the host's disk under the broker's state dir must not grow past the pod's caps.
"""

from __future__ import annotations

import json
import os

import pytest

from broker.backends.local import LocalBackend
from broker.pools import PoolSpec
from broker.ports.agent import AttemptStatus, LaunchRequest, ResetRequest
from broker.ports.backend import PodRequest
from tests.integration.conftest import run_job
from tests.integration.test_broker_e2e import _tmp_baseline

pytestmark = pytest.mark.integration

MiB = 1 << 20
SKIPPED = ("proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue")
PROBE = f"""
import errno, json, os
SKIPPED = {SKIPPED!r}
found = {{}}
for line in open("/proc/self/mountinfo"):
    before, after = line.split(" - ", 1)
    fields = before.split()
    point = fields[4].replace("\\\\040", " ")
    if "rw" not in fields[5].split(",") or after.split()[0] in SKIPPED:
        continue
    fstype = after.split()[0]
    if not os.path.isdir(point):
        # A file bound on its own: a device node (/dev/null) stores nothing; any other must be read-only.
        kind = "device" if not os.path.isfile(point) else "file"
        found[point] = {{"fstype": fstype, "written_mib": 0, "error": kind if kind == "device" or
                         not os.access(point, os.W_OK) else "WRITABLE"}}
        continue
    path = os.path.join(point, ".fp-fill")
    written, error = 0, None
    try:
        with open(path, "wb") as f:
            for _ in range(300):
                f.write(b"x" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
                written += 1
    except OSError as exc:
        error = errno.errorcode.get(exc.errno, str(exc.errno))
    try:
        os.unlink(path)
    except OSError:
        pass
    found[point] = {{"fstype": fstype, "written_mib": written, "error": error}}
print(json.dumps(found))
"""
REFUSALS = ("ENOSPC", "EROFS", "EACCES", "EPERM", "EDQUOT", "device", "file")


async def run(backend: LocalBackend, pod: str, attempt_id: str, *argv: str, wait_s: float = 120) -> AttemptStatus:
    agent = backend.agent(pod)
    await agent.launch(LaunchRequest(attempt_id=attempt_id, argv=argv, env={}, session="s"))
    status = await agent.wait(attempt_id, wait_s)
    assert not status.running, f"{attempt_id} still running after {wait_s} s"
    return status


def state_bytes(backend: LocalBackend) -> int:
    """Bytes the broker's state dir takes on the host filesystem that holds it: its files' allocated blocks
    (a pod disk's sparse image among them), never descending into a mount (the image's own filesystem). Not
    the filesystem's free space, which every other process writing to it moves (parallel test workers)."""
    root = backend.state_dir
    device = root.stat().st_dev
    total = 0
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(top, d)).st_dev == device]
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:
                continue
            if st.st_dev == device:
                total += st.st_blocks * 512
    return total


async def test_every_writable_mount_of_a_sandbox_refuses_300_mib_and_the_host_disk_stays(
        backend: LocalBackend) -> None:
    assert backend.limiter.disk_off is None, f"this host should cap pod disks: {backend.limiter.disk_off}"
    pool = PoolSpec(name="cpu", wipe_paths=("/scratch",), keep_paths=("/cache/uv",),
                    template={"memory": "512Mi", "pids": 256, "workspace_size": "256Mi",
                              "tmp_size": "64Mi", "shm_size": "64Mi"})
    await backend.create(PodRequest(name="prober", pool=pool))
    used_before = state_bytes(backend)
    status = await run(backend, "prober", "a-probe", "python3", "-c", PROBE)
    out = (await backend.agent("prober").read_log("a-probe")).data.decode()
    assert status.exit_code == 0, (status, out)
    found = json.loads(out.strip().splitlines()[-1])
    # The places a job is meant to write are among those probed (the probe sees them at all).
    for expected in ("/workspace", "/tmp", "/dev/shm", "/run/firepool", "/scratch", "/cache/uv"):
        assert expected in found, sorted(found)
    uncapped = {point: r for point, r in found.items() if r["error"] not in REFUSALS or r["written_mib"] >= 300}
    assert not uncapped, f"mounts that took 300 MiB or failed oddly: {uncapped}"
    # The pod's disk image is sparse and keeps the blocks once written: at most its 256 MiB, never more.
    grew = state_bytes(backend) - used_before
    assert grew < (256 + 32) * MiB, f"the host's disk grew by {grew >> 20} MiB"


async def test_a_job_that_fills_its_workspace_ends_disk_full_and_the_host_disk_stays(backend: LocalBackend) -> None:
    assert backend.limiter.disk_off is None, f"this host should cap pod disks: {backend.limiter.disk_off}"
    pool = PoolSpec(name="cpu", template={"workspace_size": "64Mi"})
    await backend.create(PodRequest(name="filler", pool=pool))
    used_before = state_bytes(backend)
    # A job that swallows the error and exits 1 itself: the broker tells from the full disk, not stderr.
    fill = ("import sys\ntry:\n    f = open('/workspace/big', 'wb')\n    while True:\n"
            "        f.write(bytes(1 << 20)); f.flush()\nexcept OSError:\n    sys.exit(1)\n")
    status = await run(backend, "filler", "a-fill", "python3", "-c", fill)
    assert status.error_class == "DiskFull", status
    assert state_bytes(backend) - used_before < 96 * MiB


ETC_PROBE = r"""
set -e
for secret in /etc/shadow /etc/gshadow /etc/ssh /etc/ssl/private /etc/sudoers /etc/machine-id; do
    if [ -e "$secret" ]; then echo "LEAKED $secret"; exit 3; fi
done
python3 -c "import ssl; n = ssl.create_default_context().cert_store_stats()['x509_ca']; assert n > 0, n; print('roots', n)"
getent hosts localhost
getent passwd "$(id -u)"
python3 -m pip --version
touch /etc/planted 2>/dev/null && { echo "WROTE /etc"; exit 4; }
echo etc-ok
"""


async def test_the_sandbox_etc_holds_names_tls_users_and_python_but_no_host_secrets(backend: LocalBackend) -> None:
    host_has = [p for p in ("/etc/shadow", "/etc/ssh") if os.path.exists(p)]
    assert host_has, "the host should have the files this test proves absent"
    await backend.create(PodRequest(name="etc", pool=PoolSpec(name="cpu")))
    status = await run(backend, "etc", "a-etc", "sh", "-c", ETC_PROBE)
    out = (await backend.agent("etc").read_log("a-etc")).data.decode()
    assert status.exit_code == 0 and "etc-ok" in out, out
    assert "127.0.0.1" in out or "::1" in out, out
    assert ":/workspace:" in out and "pip " in out, out


async def test_tmp_lives_as_long_as_the_session_and_is_empty_for_the_next(backend: LocalBackend) -> None:
    """/tmp is per session, like the workspace: a session's next job finds its files; a new session starts
    with an empty /tmp (docs/security.md)."""
    await backend.create(PodRequest(name="tmpy", pool=PoolSpec(name="cpu")))
    agent = backend.agent("tmpy")
    assert (await run(backend, "tmpy", "a-1", "sh", "-c", "echo mine > /tmp/note && echo x > /dev/shm/n")).exit_code == 0
    await agent.reset(ResetRequest(wipe_workspace=False))
    kept = await run(backend, "tmpy", "a-2", "sh", "-c", "cat /tmp/note; ls -A /dev/shm")
    assert (await agent.read_log("a-2")).data.decode().split() == ["mine"], kept
    await agent.reset(ResetRequest(wipe_workspace=True))  # the session boundary
    await run(backend, "tmpy", "a-3", "sh", "-c", "ls -A /tmp /workspace /dev/shm")
    binds = _tmp_baseline().split()  # a checkout under /tmp puts the venv's and the agent's bind points there
    listed = sorted((await agent.read_log("a-3")).data.decode().split())
    assert listed == sorted(["/dev/shm:", "/tmp:", "/workspace:", *binds])


ACCEPTANCE_POOLS = ("pools:\n  - name: cpu\n    max_count: 4\n"
                    "    template: {memory: 512Mi, pids: 256, workspace_size: 256Mi, tmp_size: 64Mi, shm_size: 64Mi}\n")
LINE_PROBE = """
import os
for line in open("/proc/self/mountinfo"):
    before, after = line.split(" - ", 1)
    fields = before.split()
    point = fields[4]
    if "rw" not in fields[5].split(",") or after.split()[0] in ("proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue"):
        continue
    path = os.path.join(point, ".fp-fill")
    try:
        with open(path, "wb") as f:
            for _ in range(300):
                f.write(b"x" * (1 << 20))
                f.flush()
                os.fsync(f.fileno())
        print("UNCAPPED", point)
    except OSError as exc:
        print("capped", point, exc.errno)
    try:
        os.unlink(path)
    except OSError:
        pass
"""


def test_a_brokers_job_finds_no_mount_that_takes_300_mib(broker_factory) -> None:
    broker = broker_factory(pools=ACCEPTANCE_POOLS)
    job = run_job(broker.client(), {"pool": "cpu", "command": ["python3", "-c", LINE_PROBE]}, wait=180)
    out = broker.client().get(f"/v1/jobs/{job['id']}/logs").text
    assert job["state"] == "SUCCEEDED", (job, out)
    assert "capped /run/firepool" in out and "capped /workspace" in out, out
    assert "UNCAPPED" not in out, out
