"""Ray mode for gangs on real sandboxes: a 2-pod `mode: ray` job forms an ephemeral Ray cluster (head on
rank 0, a worker node on rank 1), its driver runs a remote task on each node, and the reset tears the
cluster down: the next job on the same warm pods finds no Ray process and no Ray session left."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import BrokerProcess, run_job

# The jobs' own budgets (a 260 s wait, then 120 s) exceed the suite's 120 s: on 2 busy cores (a parallel run) the
# first Ray cluster alone took 116 s to start and run its task.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
ray = pytest.importorskip("ray", reason="Ray mode needs `pip install -e '.[ray]'`")

DRIVER = """
import json, os, socket, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()  # RAY_ADDRESS: the gang's head

@ray.remote(num_cpus=0)
def where(rank_hint):
    return {"host": socket.gethostname(), "at": time.time(), "pid_ns_init": os.getpid() != 1}

nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
out = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(i)
               for i, n in enumerate(nodes)])
print(json.dumps({"nodes": len(nodes), "hosts": sorted(o["host"] for o in out),
                  "first_task_at": min(o["at"] for o in out), "address": os.environ["RAY_ADDRESS"]}))
"""

NO_RAY_LEFT = """
import os, sys
left = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if any(w in cmd for w in ("raylet", "gcs_server", "ray::", "ray/_private", "ray.scripts")):
        left.append(cmd[:80])
sessions = [os.path.join(d, f) for d in ("/tmp", os.environ.get("TMPDIR", "/tmp")) if os.path.isdir(d)
            for f in os.listdir(d) if f.startswith(("ray", "fp-ray"))]
print("ray left:", left, sessions)
sys.exit(1 if left or sessions else 0)
"""


def test_a_two_pod_ray_gang_runs_a_task_on_each_rank_and_the_reset_leaves_no_ray_process(
        broker: BrokerProcess) -> None:
    c = broker.client("bob")
    job = run_job(c, {"pool": "cpu", "pods": 2, "lease_tag": "ray", "mode": "ray", "timeout_s": 240,
                      "command": ["python3", "-c", DRIVER]}, wait=260)
    log = c.get(f"/v1/jobs/{job['id']}/logs").text
    assert job["state"] == "SUCCEEDED", (job, log, broker.log()[-3000:])
    assert job["mode"] == "ray"
    result = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
    assert result["nodes"] == 2 and result["hosts"] == sorted(job["bound_pods"]), (result, job["bound_pods"])
    print(f"ray N=2: submit -> first task {result['first_task_at'] - job['timings']['submitted_at']:.1f} s")

    # The same session gets the same two pods back warm: only a clean (proven) reset returns a pod.
    after = run_job(c, {"pool": "cpu", "pods": 2, "lease_tag": "ray", "command": ["python3", "-c", NO_RAY_LEFT]},
                    wait=120)
    assert after["state"] == "SUCCEEDED", (after, c.get(f"/v1/jobs/{after['id']}/logs").text)
    assert sorted(after["bound_pods"]) == sorted(job["bound_pods"])
    assert [a["path"] for a in after["acquisition"]] == ["warm", "warm"]
    assert "unclean" not in broker.log()


def test_a_ray_gang_killed_mid_run_leaves_no_ray_process_after_the_reset(broker: BrokerProcess) -> None:
    """The wrapper never gets to stop its cluster (the job times out): the reset's kill of every process in
    the pod is what tears the daemons down, and the proof holds."""
    c = broker.client("carol")
    hang = "import ray, time; ray.init(); print('driver up', flush=True); time.sleep(600)"
    job = run_job(c, {"pool": "cpu", "pods": 2, "lease_tag": "ray", "mode": "ray", "timeout_s": 50,
                      "command": ["python3", "-c", hang]}, wait=200)
    assert job["state"] == "FAILED" and job["error_class"] == "Timeout", job
    after = run_job(c, {"pool": "cpu", "pods": 2, "lease_tag": "ray", "command": ["python3", "-c", NO_RAY_LEFT]},
                    wait=120)
    assert after["state"] == "SUCCEEDED", (after, c.get(f"/v1/jobs/{after['id']}/logs").text)
    assert sorted(after["bound_pods"]) == sorted(job["bound_pods"])  # reset clean: the same pods, warm
