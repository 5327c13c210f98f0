"""The broker end to end: `firepool serve` on the local backend (bubblewrap sandboxes), over REST."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BrokerProcess, both_backends, paths, run_job

pytestmark = pytest.mark.integration

PY = ["python3", "-c"]


def _tmp_baseline() -> str:
    """What a fresh sandbox's /tmp holds: the parents of binds that live under /tmp on the host
    (a checkout in /tmp puts the venv and the agent there)."""
    names = set()
    for path in (sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[2])):
        if path.startswith("/tmp/"):
            names.add(path.split("/")[2])
    return "".join(f"{n}\n" for n in sorted(names))


@both_backends
def test_same_session_is_warm_and_reports_every_timing(broker: BrokerProcess) -> None:
    c = broker.client()
    first = run_job(c, {"pool": "cpu", "command": PY + ["print('hi')"], "lease_tag": "conv-1"})
    second = run_job(c, {"pool": "cpu", "command": PY + ["print('hi')"], "lease_tag": "conv-1"})
    assert first["state"] == second["state"] == "SUCCEEDED"
    assert first["exit_code"] == second["exit_code"] == 0
    assert paths(first) == ["new"] and paths(second) == ["warm"]
    assert second["acquisition"][0]["pod"] == first["acquisition"][0]["pod"]
    t = second["timings"]
    order = ["submitted_at", "claimed_at", "committed_at", "handed_off_at", "first_instruction_at", "finished_at"]
    assert [t[k] for k in order] == sorted(t[k] for k in order)
    assert c.get(f"/v1/jobs/{second['id']}/logs").text == "hi\n"


@both_backends
def test_three_concurrent_callers_never_share_a_sandbox(broker: BrokerProcess) -> None:
    def loop(caller: str) -> list[dict]:
        c = broker.client(caller)
        return [run_job(c, {"pool": "cpu", "command": PY + ["import time; time.sleep(0.2)"], "lease_tag": "t"})
                for _ in range(3)]

    with ThreadPoolExecutor(3) as ex:
        results = dict(zip(("alice", "bob", "carol"), ex.map(loop, ("alice", "bob", "carol")), strict=True))
    owners: dict[str, set[str]] = {}
    for caller, jobs in results.items():
        for job in jobs:
            assert job["state"] == "SUCCEEDED"
            owners.setdefault(job["acquisition"][0]["pod"], set()).add(caller)
        assert paths(jobs[1]) == paths(jobs[2]) == ["warm"]
    assert all(len(callers) == 1 for callers in owners.values()), owners


@both_backends
def test_at_the_ceiling_a_new_tag_starts_on_the_old_pod_with_an_empty_workspace_and_keeps_it(broker_factory) -> None:
    # Below the ceiling a live session is never emptied for another (test_doors_keep_sessions.py); at a
    # one-pod ceiling the new session takes the old one's pod, across a verified boundary.
    c = broker_factory(pools="pools:\n  - {name: cpu, max_count: 1}\n").client()
    first = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "echo secret > notes.txt; ls"], "lease_tag": "a"})
    same = run_job(c, {"pool": "cpu", "command": ["cat", "notes.txt"], "lease_tag": "a"})
    assert c.get(f"/v1/jobs/{same['id']}/logs").text == "secret\n"
    other = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "ls -A; ls -A /tmp; echo mine > b.txt"],
                        "lease_tag": "b"})
    assert paths(other) == ["recycled"]
    assert other["acquisition"][0]["pod"] == first["acquisition"][0]["pod"]
    # the new session saw an empty workspace and /tmp (but for the sandbox's own binds)
    assert c.get(f"/v1/jobs/{other['id']}/logs").text == _tmp_baseline()
    # ... and the pod is the new session's from now on: its files stay
    later = run_job(c, {"pool": "cpu", "command": ["cat", "b.txt"], "lease_tag": "b"})
    assert paths(later) == ["warm"] and later["acquisition"][0]["pod"] == first["acquisition"][0]["pod"]
    assert c.get(f"/v1/jobs/{later['id']}/logs").text == "mine\n"


def test_hold_expiry_retires_the_pod(broker_factory) -> None:
    b = broker_factory(pools="pools:\n  - {name: cpu, max_count: 4, caller_hold_seconds: 1.5, idle_timeout: 60}\n")
    c = b.client()
    job = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "t"})
    pod = job["acquisition"][0]["pod"]
    # The result is committed while the pod resets in parallel: the hold starts when the reset ends.
    deadline = time.monotonic() + 1.0
    while not (held := [p for p in c.get("/v1/pods").json()["pods"] if p["name"] == pod and p["held"]]):
        assert time.monotonic() < deadline, "the pod was never held for its owner"
        time.sleep(0.02)
    assert held[0]["caller"] == "alice"
    deadline = time.monotonic() + 6.0
    while any(p["name"] == pod for p in c.get("/v1/pods").json()["pods"]):
        assert time.monotonic() < deadline, "the expired hold did not retire the pod"
        time.sleep(0.05)
    again = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "t"})
    assert paths(again) == ["new"] and again["acquisition"][0]["pod"] != pod


def test_an_unclean_reset_deletes_the_pod_and_the_next_job_gets_a_new_one(broker_factory, tmp_path: Path) -> None:
    residue = tmp_path / "residue"
    residue.mkdir()
    (residue / "cannot-remove.bin").write_bytes(b"x")
    residue.chmod(0o755)
    pools = ("pools:\n  - name: cpu\n    max_count: 4\n    wipe_paths: [/scratch]\n"
             f"    template: {{binds: [{{src: '{residue}', dst: /scratch, ro: true}}]}}\n")
    b = broker_factory(pools=pools)
    c = b.client()
    first = run_job(c, {"pool": "cpu", "command": ["ls", "/scratch"], "lease_tag": "t"})
    assert c.get(f"/v1/jobs/{first['id']}/logs").text == "cannot-remove.bin\n"
    pod = first["acquisition"][0]["pod"]
    deadline = time.monotonic() + 10
    while any(p["name"] == pod for p in c.get("/v1/pods").json()["pods"]):
        assert time.monotonic() < deadline, "the unclean pod was not deleted"
        time.sleep(0.05)
    second = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "t"})
    assert second["state"] == "SUCCEEDED" and second["acquisition"][0]["pod"] != pod
    assert paths(second) == ["new"]
    metrics = b.client("ops").get("/metrics").text  # every pod of this pool carries the residue
    assert 'firepool_resets_total{clean="false",pool="cpu"}' in metrics, metrics
    assert 'firepool_resets_total{clean="true",pool="cpu"}' not in metrics, metrics


def test_timeout_kills_the_whole_tree_including_a_daemonised_child(broker: BrokerProcess) -> None:
    c = broker.client()
    marker = "61.4242"
    script = f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '{marker}'])\ntime.sleep(60)\n"
    started = time.monotonic()
    job = run_job(c, {"pool": "cpu", "command": PY + [script], "timeout_s": 1, "lease_tag": "t"})
    assert job["state"] == "FAILED" and job["error_class"] == "Timeout"
    assert time.monotonic() - started < 8
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes survived the timeout: {left.stdout}"
    after = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "ls /proc | grep -c '^[0-9]'"], "lease_tag": "t"})
    assert paths(after) == ["warm"]


def test_jobs_cannot_see_each_others_processes_or_files(broker: BrokerProcess) -> None:
    a, b = broker.client("alice"), broker.client("bob")
    r = a.post("/v1/jobs", json={"pool": "cpu", "lease_tag": "t",
                                 "command": ["sh", "-c", "echo alice-secret > /workspace/mine; "
                                             "echo shm > /dev/shm/alice; echo t > /tmp/alice; sleep 3"]})
    alice_job = r.json()["id"]
    time.sleep(1.0)
    # Every writable place is searched; the read-only system and the pods' python bound in at its host paths (the
    # venv and the interpreter's prefix, ~50,000 files here) are not: on a loaded CI machine reading them all
    # outlasted the wait.
    skip = " ".join(f"--exclude-dir={Path(p).name}" for p in ("/proc", "/sys", "/usr", sys.prefix, sys.base_prefix))
    probe = run_job(b, {"pool": "cpu", "lease_tag": "t", "command": [
        "sh", "-c", f"ls /proc | grep -c '^[0-9]'; ls -A /dev/shm /tmp; grep -rl alice-secret / {skip} 2>/dev/null; true"]})
    out = b.get(f"/v1/jobs/{probe['id']}/logs").text
    assert "alice" not in out, out
    assert int(out.splitlines()[0]) <= 4, out  # the agent, the shell and its children only
    assert a.get(f"/v1/jobs/{alice_job}", params={"wait_s": 10}).json()["state"] == "SUCCEEDED"


def test_the_verified_caller_is_injected_and_steering_env_dropped(broker: BrokerProcess) -> None:
    c = broker.client("bob")
    job = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "echo $FIREPOOL_CALLER ${LD_PRELOAD:-none} $A"],
                      "env": {"FIREPOOL_CALLER": "alice", "LD_PRELOAD": "/x.so", "A": "ok"}})
    assert c.get(f"/v1/jobs/{job['id']}/logs").text == "bob none ok\n"
    assert {d["name"] for d in job["dropped_env"]} == {"FIREPOOL_CALLER", "LD_PRELOAD"}


def test_gpu_pods_get_distinct_devices(broker: BrokerProcess) -> None:
    def run(caller: str) -> str:
        c = broker.client(caller)
        job = run_job(c, {"pool": "gpu", "command": ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES; sleep 1"]})
        return c.get(f"/v1/jobs/{job['id']}/logs").text.strip()

    with ThreadPoolExecutor(2) as ex:
        seen = sorted(ex.map(run, ("alice", "bob")))
    assert seen == ["0", "1"]
    cpu = run_job(broker.client(), {"pool": "cpu", "command": ["sh", "-c", "echo [$CUDA_VISIBLE_DEVICES]"]})
    assert broker.client().get(f"/v1/jobs/{cpu['id']}/logs").text == "[]\n"


def test_bad_input_is_typed_and_stores_nothing(broker: BrokerProcess) -> None:
    c = broker.client()
    r = c.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "bogus_field": 1})
    assert r.status_code == 422 and r.json()["error"]["class"] == "UnknownField"
    r = c.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "env": {"A": "1"}, "extra": {"nested": 1}})
    assert r.status_code == 422 and r.json()["error"]["class"] == "UnknownField"
    r = c.post("/v1/jobs", json={"pool": "cpu", "command": "true"})
    assert r.status_code == 422 and r.json()["error"]["class"] == "InvalidRequest"
    r = c.post("/v1/jobs", json={"pool": "nope", "command": ["true"]})
    assert r.status_code == 400 and r.json()["error"]["class"] == "UnknownPool"
    assert httpx.post(broker.url + "/v1/jobs", json={"pool": "cpu", "command": ["true"]}).status_code == 401
    assert c.get("/v1/jobs").json()["jobs"] == []
    mine = run_job(c, {"pool": "cpu", "command": ["true"]})
    r = broker.client("bob").get(f"/v1/jobs/{mine['id']}")
    assert r.status_code == 404 and r.json()["error"]["class"] == "NotFound"


def test_the_cli_submits_waits_and_returns_the_exit_code(broker: BrokerProcess) -> None:
    env = broker.env()
    ok = subprocess.run([sys.executable, "-m", "broker.cli", "submit", "--wait", "--tag", "cli", "--",
                         "python3", "-c", "print('from the sandbox')"], env=env, capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "from the sandbox\n" and "SUCCEEDED" in ok.stderr
    bad = subprocess.run([sys.executable, "-m", "broker.cli", "submit", "--wait", "--tag", "cli", "--",
                          "sh", "-c", "exit 7"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 7
    listing = subprocess.run([sys.executable, "-m", "broker.cli", "jobs", "--json"], env=env, capture_output=True,
                             text=True, timeout=30)
    assert {j["state"] for j in json.loads(listing.stdout)} == {"SUCCEEDED", "FAILED"}
    pods = subprocess.run([sys.executable, "-m", "broker.cli", "pods"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert "alice" in pods.stdout


def test_logs_stream_while_the_job_runs(broker: BrokerProcess) -> None:
    c = broker.client()
    r = c.post("/v1/jobs", json={"pool": "cpu", "command": PY + [
        "import time\nfor i in range(3):\n    print('tick', i, flush=True); time.sleep(0.5)"]})
    job_id = r.json()["id"]
    got, stamps = [], []
    with c.stream("GET", f"/v1/jobs/{job_id}/logs") as response:
        for line in response.iter_lines():
            got.append(line)
            stamps.append(time.monotonic())
    assert got == ["tick 0", "tick 1", "tick 2"]
    assert stamps[-1] - stamps[0] > 0.6  # lines arrived while it ran, not all at the end


@both_backends
def test_a_killed_broker_loses_no_job_and_runs_none_twice(broker: BrokerProcess) -> None:
    c = broker.client()
    running = c.post("/v1/jobs", json={"pool": "cpu", "lease_tag": "r",
                                       "command": PY + ["import time; time.sleep(2); print('done once')"]}).json()
    deadline = time.monotonic() + 10
    while c.get(f"/v1/jobs/{running['id']}").json()["state"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    broker.kill()
    broker.start()
    c = broker.client()
    done = c.get(f"/v1/jobs/{running['id']}", params={"wait_s": 20}).json()
    assert done["state"] == "SUCCEEDED" and len(done["attempts"]) == 1
    assert c.get(f"/v1/jobs/{running['id']}/logs").text == "done once\n"
    after = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "r"})
    assert paths(after) == ["warm"]  # the owner's hold survived the restart


@pytest.mark.parametrize("backend", ["mariadb", "postgresql"])
def test_the_broker_runs_on_each_production_database(broker_factory, tmp_path: Path, backend: str) -> None:
    from tests.integration.store_databases import Databases

    dbs = Databases(backend, tmp_path)
    try:
        b = broker_factory(f"on-{backend}", extra=("--db", dbs.create()))
        c = b.client()
        first = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "db"})
        second = run_job(c, {"pool": "cpu", "command": ["true"], "lease_tag": "db"})
        assert paths(first) == ["new"] and paths(second) == ["warm"]
        assert [j["id"] for j in c.get("/v1/jobs").json()["jobs"]] == [second["id"], first["id"]]
        b.stop()
    finally:
        dbs.drop_all()


def test_a_bind_under_tmp_survives_the_wipes_of_a_new_session(broker_factory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "model.bin").write_text("weights")
    data.chmod(0o755)
    pools = (f"pools:\n  - name: cpu\n    max_count: 1\n"  # at the ceiling: session b takes a's pod
             f"    template: {{binds: [{{src: '{data}', dst: /tmp/models/base, ro: true}}]}}\n")
    b = broker_factory(pools=pools)
    c = b.client()
    first = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "touch /tmp/mine; cat /tmp/models/base/model.bin"],
                        "lease_tag": "a"})
    crossing = run_job(c, {"pool": "cpu", "command": ["sh", "-c", "ls /tmp; cat /tmp/models/base/model.bin"],
                           "lease_tag": "b"})
    assert paths(crossing) == ["recycled"]
    text = c.get(f"/v1/jobs/{crossing['id']}/logs").text  # /tmp/mine is gone, the bind is not
    assert text == "".join(sorted([_tmp_baseline(), "models\n"])) + "weights"
    assert first["state"] == crossing["state"] == "SUCCEEDED"
    assert 'clean="false"' not in b.client("ops").get("/metrics").text
