"""Unisolated pods only when the operator asks (`--unisolated`), loud where it shows, and per-pod paths.

Without working bubblewrap `firepool serve` refuses to start and says how to install it; with
`--unisolated` it runs plain-process pods and says so in /healthz, /v1/pods and its log, and each job
gets its pod's own workspace, package, temp and home directories, never the host's /pkg.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import BrokerProcess, free_port, run_job

pytestmark = pytest.mark.integration

DIRS = 'printf "%s\\n" "$FIREPOOL_PACKAGE_DIR" "$FIREPOOL_WORKSPACE" "$TMPDIR" "$HOME" "$PWD"'


def test_without_bubblewrap_serve_refuses_to_start_and_says_how_to_install_it(tmp_path: Path) -> None:
    no_bwrap = tmp_path / "bin"  # a PATH on which bwrap cannot be found
    no_bwrap.mkdir()
    r = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--state-dir", str(tmp_path / "state"),
                        "--port", str(free_port()), "--virtual-gpus", "1"],
                       env={**os.environ, "PATH": str(no_bwrap)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    said = [line for line in r.stderr.splitlines() if line.startswith("firepool:")]
    assert len(said) == 1 and r.stderr.strip().endswith(said[0]) and "Traceback" not in r.stderr, r.stderr
    assert "apt-get install bubblewrap" in said[0] and "--unisolated" in said[0], said
    assert not (tmp_path / "state" / "broker.json").exists()


@pytest.fixture
def unisolated(broker_factory) -> BrokerProcess:
    broker: BrokerProcess = broker_factory(extra=("--unisolated",))
    return broker


def test_unisolated_says_so_in_healthz_pods_and_the_log(unisolated: BrokerProcess) -> None:
    c = unisolated.client("alice")
    health = c.get("/healthz").json()
    assert health["isolated"] is False and health["isolation"] == "none", health
    job = run_job(c, {"pool": "cpu", "command": ["true"]})
    assert job["state"] == "SUCCEEDED", job
    pods = c.get("/v1/pods").json()
    assert pods["isolation"] == "none" and pods["pods"] and all(p["isolated"] is False for p in pods["pods"]), pods
    assert "UNISOLATED (--unisolated)" in unisolated.log()


def test_unisolated_jobs_get_their_pods_own_directories_not_the_hosts_pkg(unisolated: BrokerProcess) -> None:
    had_pkg = os.path.exists("/pkg")
    seen = []
    for caller in ("alice", "bob"):  # two callers: two pods
        c = unisolated.client(caller)
        job = run_job(c, {"pool": "cpu", "command": ["sh", "-c", DIRS + '; touch "$FIREPOOL_PACKAGE_DIR/scratch"']})
        assert job["state"] == "SUCCEEDED", job
        pod_root = unisolated.state_dir.resolve() / "pods" / job["bound_pods"][0]
        lines = c.get(f"/v1/jobs/{job['id']}/logs").text.strip().splitlines()
        pkg, workspace, tmp, home, cwd = lines[-5:]
        disk = pod_root / "disk"  # the pod's capped disk (docs/resources.md)
        assert (pkg, workspace, tmp, home) == (str(disk / "pkg"), str(disk / "workspace"), str(pod_root / "tmp"),
                                               str(disk / "workspace")), lines
        assert cwd == workspace
        seen.append(pkg)
    assert seen[0] != seen[1]
    assert os.path.exists("/pkg") == had_pkg  # nothing wrote the host's /pkg
