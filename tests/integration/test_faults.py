"""Fault injection against real processes: agents that hang or die, resets that cannot prove themselves,
a store that fails commits, a database restarted under load, a full disk while unpacking, a slow reader."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.backends.local import LocalBackend
from broker.clock import RealClock
from broker.control import ControlPlane
from broker.errors import StoreError
from broker.jobs import Job, JobSpec, JobState
from broker.pools import default_catalog
from broker.running.logstore import FileLogStore
from broker.store.sql import SqlJobStore
from tests.integration.conftest import BrokerProcess, delete_pods, free_port, run_job

pytestmark = pytest.mark.integration

SH = ["/bin/sh", "-c"]


def agent_pid(broker: BrokerProcess, pod: str) -> int:
    return int(json.loads((broker.state_dir / "pods" / pod / "pod.json").read_text())["pid"])


def pod_names(c: httpx.Client) -> set[str]:
    return {p["name"] for p in c.get("/v1/pods").json()["pods"]}


def wait_for(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_an_agent_unreachable_at_launch_fails_the_attempt_typed_and_the_retry_runs_on_a_new_pod(
        broker: BrokerProcess) -> None:
    c = broker.client()
    first = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "u"})
    pod = first["acquisition"][0]["pod"]
    # Stop the agent once its reset is done: stopped during the reset, the pod is lost before the next job.
    wait_for(lambda: any(p["name"] == pod and p["state"] == "idle" for p in c.get("/v1/pods").json()["pods"]),
             "the pod never came back idle")
    os.kill(agent_pid(broker, pod), signal.SIGSTOP)  # alive, connectable, and answering nothing
    second = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "u", "max_retries": 1}, wait=90)
    assert second["state"] == "SUCCEEDED", second
    assert [a["pods"] for a in second["attempts"]][0] == [pod]  # the launch went to the hung pod first
    assert second["attempts"][0]["error_class"] in ("LaunchError", "PodLost"), second["attempts"][0]
    assert second["acquisition"][0]["pod"] != pod
    wait_for(lambda: pod not in pod_names(c), "the hung pod was not deleted")


def test_an_agent_killed_mid_job_is_pod_lost_and_the_job_retried_once_on_a_new_pod(broker: BrokerProcess) -> None:
    c = broker.client()
    body = {"pool": "cpu", "lease_tag": "k", "max_retries": 1,
            "command": SH + ['case "$FIREPOOL_ATTEMPT_ID" in *:0) sleep 60;; esac; echo second attempt']}
    job = c.post("/v1/jobs", json=body).json()
    wait_for(lambda: c.get(f"/v1/jobs/{job['id']}").json()["attempts"][:1] != []
             and c.get(f"/v1/jobs/{job['id']}").json()["state"] == "RUNNING", "the job never ran")
    time.sleep(0.5)
    pod = c.get(f"/v1/jobs/{job['id']}").json()["bound_pods"][0]
    os.kill(agent_pid(broker, pod), signal.SIGKILL)  # PID 1 of the sandbox: the whole pod dies
    done = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
    assert done["state"] == "SUCCEEDED", done
    assert [a["error_class"] for a in done["attempts"][:1]] == ["PodLost"] and done["retries"] == 1
    assert done["attempts"][1]["pods"] != [pod]
    assert c.get(f"/v1/jobs/{job['id']}/logs").text == "second attempt\n"
    once = c.post("/v1/jobs", json={**body, "max_retries": 0, "lease_tag": "k0"}).json()
    wait_for(lambda: c.get(f"/v1/jobs/{once['id']}").json()["state"] == "RUNNING", "the job never ran")
    time.sleep(0.5)
    os.kill(agent_pid(broker, c.get(f"/v1/jobs/{once['id']}").json()["bound_pods"][0]), signal.SIGKILL)
    failed = c.get(f"/v1/jobs/{once['id']}", params={"wait_s": 60}).json()
    assert (failed["state"], failed["error_class"], len(failed["attempts"])) == ("FAILED", "PodLost", 1), failed


def test_resets_that_cannot_prove_themselves_clean_recycle_each_pod_and_fail_no_job(broker_factory,
                                                                                    tmp_path: Path) -> None:
    residue = tmp_path / "residue"
    residue.mkdir()
    (residue / "cannot-remove.bin").write_bytes(b"x")
    pools = ("pools:\n  - name: cpu\n    max_count: 2\n    wipe_paths: [/scratch]\n"
             f"    template: {{binds: [{{src: '{residue}', dst: /scratch, ro: true}}]}}\n")
    c = broker_factory(pools=pools).client()
    jobs = [run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "t"}) for _ in range(5)]
    assert [j["state"] for j in jobs] == ["SUCCEEDED"] * 5
    used = [j["acquisition"][0]["pod"] for j in jobs]
    assert len(set(used)) == 5, used  # every unclean pod was recycled: each job got a new one
    wait_for(lambda: not pod_names(c) & set(used), "unclean pods were kept")


class FlakyStore:
    """The real SQL store, with commits that fail (or hang, then fail) while they write the job `failing`."""

    def __init__(self, inner: SqlJobStore, hang_s: float) -> None:
        self.inner = inner
        self.blocking = inner.blocking
        self.failing: str | None = None
        self.failures = 0
        self.hang_s = hang_s

    def insert(self, job: Job) -> Job:
        return self.inner.insert(job)

    def get(self, job_id: str) -> Job | None:
        return self.inner.get(job_id)

    def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        return self.inner.get_many(job_ids)

    def list_jobs(self, **kw: Any) -> list[Job]:
        return self.inner.list_jobs(**kw)

    def commit(self, writes: Sequence[tuple[Job, int]], inserts: Sequence[Job] = ()) -> list[bool]:
        if any(job.id == self.failing for job, _ in writes):  # a submit's insert still lands, as insert() does
            self.failures += 1
            time.sleep(self.hang_s)
            raise StoreError("injected: the commit " + ("timed out" if self.hang_s else "failed"))
        return self.inner.commit(writes, inserts)

    def commit_group(self, writes: Sequence[tuple[Job, int]], inserts: Sequence[Job] = ()) -> tuple[list[bool], list[Job]]:
        if any(job.id == self.failing for job, _ in writes):
            return self.commit(writes, inserts), []  # raises
        return self.inner.commit_group(writes, inserts)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("hang_s", [0.0, 0.5], ids=["fails", "times-out"])
async def test_a_failed_commit_returns_the_pods_and_keeps_the_job_queued(tmp_path: Path, hang_s: float) -> None:
    assert shutil.which("bwrap"), "bubblewrap is not installed"
    clock = RealClock()
    store = FlakyStore(SqlJobStore.open(f"sqlite:///{tmp_path / 'jobs.db'}"), hang_s)
    backend = LocalBackend(tmp_path / "state", clock, virtual_gpus=0, sandbox="bwrap")
    cp = ControlPlane(clock=clock, store=store, backend=backend, logs=FileLogStore(tmp_path / "logs"),  # type: ignore[arg-type]
                      catalog=default_catalog(0, cpu_pods=1))
    await cp.start()
    try:
        first, _ = await cp.submit("alice", JobSpec(pool="cpu", command=("true",), lease_tag="s"))
        assert (await cp.wait("alice", first.id, 30)).state is JobState.SUCCEEDED
        pod = (await cp.get("alice", first.id)).acquisition[0].pod
        # The one pod busy for a second (claimed at its submit), so the next job waits in the queue and a
        # dispatcher pass claims it: that claim's commit is the one that fails.
        await cp.submit("alice", JobSpec(pool="cpu", command=("sleep", "1"), lease_tag="s"))
        job, _ = await cp.submit("alice", JobSpec(pool="cpu", command=("true",), lease_tag="s"))
        store.failing = job.id
        for _ in range(200):
            if store.failures >= 2:
                break
            await asyncio.sleep(0.05)
        assert store.failures >= 2  # the claim was tried, its commit failed, and it was tried again
        stored = store.inner.get(job.id)
        assert stored is not None and stored.state is JobState.QUEUED and stored.attempts == ()
        assert pod in {p.name for p in cp.tracker.snapshot()}  # returned to the pool, not recycled
        assert pod in {p.name for p in await backend.list_pods()}
        store.failing = None
        cp.dispatcher.wake()
        done = await cp.wait("alice", job.id, 30)
        assert done.state is JobState.SUCCEEDED and len(done.attempts) == 1
        assert [(a.pod, a.path) for a in done.acquisition] == [(pod, "warm")]
    finally:
        store.failing = None
        await cp.stop(delete_idle_pods=True)
        delete_pods(tmp_path / "state")
        store.close()


class PrivateMariaDB:
    """A MariaDB server of this test's own (data dir, port, socket), so stopping it disturbs nobody else."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.data}", "--user=root", "--skip-test-db",
                        "--auth-root-authentication-method=normal"], check=True, capture_output=True, timeout=120)
        self.url = f"mysql+pymysql://root@127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.root / "mariadbd.log", "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(["mariadbd", "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
                                      f"--socket={self.root / 'sock'}", "--bind-address=127.0.0.1", "--user=root",
                                      "--skip-grant-tables", "--skip-name-resolve", f"--pid-file={self.root / 'pid'}"],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            assert self.proc.poll() is None, (self.root / "mariadbd.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the private MariaDB did not start"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

    def create(self, name: str) -> str:
        subprocess.run(["mariadb", f"--socket={self.root / 'sock'}", "-e", f"CREATE DATABASE {name}"], check=True,
                       timeout=30)
        return f"{self.url}/{name}"


@pytest.fixture
def mariadb(tmp_path: Path) -> Iterator[PrivateMariaDB]:
    server = PrivateMariaDB(tmp_path / "mariadb")
    server.start()
    yield server
    server.stop()


def test_the_broker_rides_through_a_database_restart_under_load(broker_factory, mariadb: PrivateMariaDB) -> None:
    b = broker_factory(extra=("--db", mariadb.create("fp_restart")))
    stop = threading.Event()
    acknowledged: list[str] = []

    def caller(tag: str) -> None:
        with httpx.Client(base_url=b.url, headers={"Authorization": f"Bearer {b.tokens['alice']}"},
                          timeout=30) as c:
            while not stop.is_set():
                body = {"pool": "cpu", "lease_tag": tag, "command": SH + ["sleep 0.2"],
                        "idempotency_key": os.urandom(8).hex()}
                while not stop.is_set():
                    try:
                        r = c.post("/v1/jobs", json=body)
                    except httpx.TransportError:
                        r = None
                    if r is not None and r.status_code in (200, 201):
                        acknowledged.append(r.json()["id"])
                        break
                    assert r is None or r.status_code == 503, r.text  # the store is down: typed, retryable
                    time.sleep(0.2)
                time.sleep(0.1)

    threads = [threading.Thread(target=caller, args=(f"db{i}",), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    mariadb.stop()
    time.sleep(2.0)
    mariadb.start()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join(30)
    c = b.client()
    assert acknowledged
    ends = {j: c.get(f"/v1/jobs/{j}", params={"wait_s": 60}).json()["state"] for j in acknowledged}
    assert set(ends.values()) == {"SUCCEEDED"}, ends
    assert run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "after"})["state"] == "SUCCEEDED"


def zipped(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_a_disk_filling_up_while_unpacking_fails_the_job_typed_and_the_pod_recovers(tmp_path: Path) -> None:
    # The pod's capped disk (template workspace_size, docs/resources.md) holds /pkg: a package that
    # unpacks to more than the disk fills it while unpacking.
    pools = "pools:\n  - name: cpu\n    gpus: 0\n    max_count: 1\n    template: {workspace_size: 16Mi}\n"
    b = BrokerProcess(tmp_path / "b", pools=pools)
    try:
        c = b.client()
        first = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "d"})
        pod = first["acquisition"][0]["pod"]
        data = zipped({"main.py": b"print('ran')\n", "big.bin": b"\0" * (32 << 20)})
        digest = hashlib.sha256(data).hexdigest()
        r = c.put(f"/v1/packages/{digest}", content=data, headers={"content-type": "application/zip"})
        assert r.status_code in (200, 201), r.text
        job = run_job(c, {"pool": "cpu", "command": ["python3", "main.py"], "lease_tag": "d", "package": digest})
        assert job["state"] == "FAILED" and job["error_class"] in ("PackageError", "DiskFull"), job
        assert job["acquisition"][0]["pod"] == pod
        after = run_job(c, {"pool": "cpu", "command": SH + ["head -c 1000000 /dev/zero > f && echo ok"],
                            "lease_tag": "d"})
        assert after["state"] == "SUCCEEDED" and after["acquisition"][0]["pod"] == pod, after
        assert c.get(f"/v1/jobs/{after['id']}/logs").text == "ok\n"
    finally:
        b.stop()


def test_a_client_reading_logs_one_byte_a_second_does_not_stall_the_broker(broker: BrokerProcess) -> None:
    c = broker.client()
    noisy = c.post("/v1/jobs", json={"pool": "cpu", "lease_tag": "n",
                                     "command": SH + ["head -c 16000000 /dev/zero | tr '\\0' x; sleep 30"]}).json()
    wait_for(lambda: c.get(f"/v1/jobs/{noisy['id']}").json()["state"] == "RUNNING", "the noisy job never ran")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", broker.port))
    slow.sendall(f"GET /v1/jobs/{noisy['id']}/logs HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {broker.tokens['alice']}\r\n\r\n".encode())
    got = b""
    latencies = []
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            got += slow.recv(1)
            began = time.monotonic()
            assert c.get("/healthz").status_code == 200
            assert c.get(f"/v1/jobs/{noisy['id']}").status_code == 200
            latencies.append(time.monotonic() - began)
            time.sleep(1.0)
        quick = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "q"}, wait=30)
    finally:
        slow.close()
        c.post(f"/v1/jobs/{noisy['id']}/cancel")
    assert got and got == b"HTTP/1.1 200"[:len(got)], got
    assert quick["state"] == "SUCCEEDED"
    assert max(latencies) < 1.0, latencies
