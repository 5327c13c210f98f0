"""Integration fixtures: a real `firepool serve` process on a free port with its own state dir."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.broker_proc import free_port
from broker.backends import cgroups
from broker.backends.local import LocalBackend
from broker.clock import RealClock

# The longest files, longest first (measured on 2 cores). Under `--dist loadfile` a worker takes one whole file
# at a time in collection order, so a long file collected last leaves the other worker idle while it runs.
LONGEST_FILES = (
    "test_ray.py", "test_broker_e2e.py", "test_mcp_live_python.py", "test_faults.py", "test_mcp.py",
    "test_gang.py", "test_prestart.py", "test_k8s_backend.py", "test_jupyter_server.py", "test_jupyter.py",
    "test_mcp_typescript.py", "test_store.py", "test_cli_messages.py", "test_session_continuity.py",
    "test_standby.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest integration files first; every file's own tests keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


class BrokerProcess:
    """`firepool serve` as a subprocess; callers alice, bob and carol have tokens, and `ops` an admin one
    (an operator's view: every caller's pods, /metrics)."""

    def __init__(self, state_dir: Path, *, pools: str | None = None, extra: tuple[str, ...] = (),
                 callers: tuple[str, ...] = ("alice", "bob", "carol")) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.tokens = {c: secrets.token_hex(16) for c in (*callers, "ops")}
        tokens = state_dir.parent / f"{state_dir.name}-tokens.json"
        tokens.write_text(json.dumps({t: {"caller": c, "admin": True} if c == "ops" else c
                                      for c, t in self.tokens.items()}))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "broker.cli", "serve", "--port", str(self.port), "--state-dir", str(state_dir),
               "--tokens", str(tokens), "--virtual-gpus", "2", *extra]
        if pools is not None:
            pools_file = state_dir.parent / f"{state_dir.name}-pools.yaml"
            pools_file.write_text(pools)
            cmd += ["--pools", str(pools_file)]
        self.cmd = cmd
        self.log_path = state_dir.parent / f"{state_dir.name}-broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._clients: list[httpx.Client] = []
        self.start()

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).json().get("ok"):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"broker never became healthy: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, caller: str = "alice") -> httpx.Client:
        client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[caller]}"},
                              timeout=120)
        self._clients.append(client)
        return client

    def env(self, caller: str = "alice") -> dict[str, str]:
        return {**os.environ, "FIREPOOL_URL": self.url, "FIREPOOL_TOKEN": self.tokens[caller]}

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the broker process only (pods are separate sessions and survive)."""
        assert self.proc is not None
        os.kill(self.proc.pid, sig)
        self.proc.wait(30)

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        delete_pods(self.state_dir)


def delete_pods(state_dir: Path) -> None:
    """Remove every sandbox a broker left behind in its state dir (pods outlive the broker by design)."""
    pods = state_dir / "pods"
    if not pods.is_dir():
        return
    for record in pods.glob("*/pod.json"):
        try:
            pid = json.loads(record.read_text()).get("pid")
            if pid:
                os.killpg(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    # A killed pod keeps its mounted disk and its cgroup until a broker over this state dir cleans up,
    # and no broker comes after a test: release them here.
    host = cgroups.detect()
    for record in pods.glob("*/pod.json"):
        with contextlib.suppress(OSError, ValueError):
            cgroup = cgroups.from_record(host, json.loads(record.read_text()))
            if cgroup is not None:
                cgroups.remove(cgroup)
    unmount_under(state_dir)


def unmount_under(root: Path) -> None:
    """Lazily unmount whatever is still mounted under `root`, deepest first: a pod disk left by a test that
    failed half-way would make pytest's temp dir undeletable (EBUSY) for every later run on the machine."""
    prefix = f"{root.resolve()}/"
    with open("/proc/self/mounts") as f:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[1]) for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    """A bubblewrap local backend with 2 virtual GPUs; every pod it made is deleted afterwards.
    bubblewrap is required: CI installs it, and isolation tests must not pass by skipping."""
    assert shutil.which("bwrap"), "bubblewrap is not installed (apt-get install bubblewrap)"
    backend = LocalBackend(tmp_path / "state", RealClock(), virtual_gpus=2, sandbox="bwrap")
    try:
        yield backend
    finally:
        for pod in await backend.list_pods():
            await backend.delete(pod.name)
        await backend.close()
        unmount_under(backend.state_dir)


def run_job(c: httpx.Client, body: dict, wait: float = 60) -> dict:
    r = c.post("/v1/jobs", json=body)
    assert r.status_code in (200, 201), r.text
    job = r.json()
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": min(30.0, deadline - time.monotonic())}).json()
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
    raise AssertionError(f"job {job['id']} not done in {wait} s: {job}")


def paths(job: dict) -> list[str]:
    return [a["path"] for a in job.get("acquisition", [])]


BACKENDS = ("local", "kubernetes")
both_backends = pytest.mark.parametrize("backend_kind", BACKENDS, indirect=True)
"""Runs a test on the local backend and on the kubernetes backend (through the API emulator)."""


@pytest.fixture
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Where the brokers of a test put their pods: `local` unless the test is marked `both_backends`."""
    return str(getattr(request, "param", "local"))


def write_kubeconfig(path: Path, cluster: Any, namespace: str = "default") -> Path:
    """A kubeconfig for `firepool serve`: the broker's service-account token (the shipped Role applies)."""
    path.write_text(json.dumps(cluster.kubeconfig(namespace)))
    return path


@pytest.fixture
def cluster(backend_kind: str, tmp_path: Path) -> Iterator[Any]:
    """The Kubernetes API emulator with a fake kubelet (2 GPUs, HAMi) when the test runs on kubernetes, else None."""
    if backend_kind != "kubernetes":
        yield None
        return
    from k8s_emulator import Emulator
    from k8s_emulator.rbac import DEPLOY, shipped_grants

    # The emulator's GPUs are HAMi's, so the broker runs with the hami overlay's rights (the base Role and
    # node reads, plus the card sweep's cluster-wide pod list): any call beyond them fails the test.
    with Emulator(tmp_path / "k8s", gpus=2, rbac=shipped_grants(DEPLOY / "overlays" / "hami")) as emu:
        yield emu


@pytest.fixture
def broker_factory(tmp_path: Path, backend_kind: str, cluster: Any) -> Iterator:
    made: list[BrokerProcess] = []

    def make(name: str = "broker", **kw) -> BrokerProcess:
        if cluster is not None:
            config = write_kubeconfig(tmp_path / f"{name}-kubeconfig.json", cluster)
            kw["extra"] = (*kw.get("extra", ()), "--backend", "kubernetes", "--kubeconfig", str(config),
                           "--namespace", "default", "--broker-id", name)
        b = BrokerProcess(tmp_path / name, **kw)
        made.append(b)
        return b

    yield make
    if cluster is not None:
        # A stopping broker deletes its idle pods and waits until they are gone; their agents, PID 1 of their
        # sandboxes, ignore SIGTERM, so each would run the pool's whole termination grace (5 s by default).
        cluster.hurry_deletes()
    for b in made:
        b.stop()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()


def node_client(client_dir: Path, package: str) -> str:
    """`node`, with `client_dir`'s locked npm packages installed (`make test-setup` installs them; a plain `make test`
    in a fresh clone installs them here)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: `make test-setup` installs it")
    if not (client_dir / "node_modules" / package).is_dir():
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=client_dir, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"npm ci in {client_dir} failed: {done.stderr[-2000:]}"
    return node
