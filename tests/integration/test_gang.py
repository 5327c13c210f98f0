"""Gangs on real sandboxes: torch.distributed ranks in separate bubblewrap pods meet at rank 0 (on the
local backend over the link the broker makes between the job's network namespaces, on the kubernetes
backend at rank 0's pod IP)."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.conftest import BrokerProcess, both_backends, run_job

pytestmark = pytest.mark.integration

ALL_REDUCE = """
import datetime, socket, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {world} on {socket.gethostname()} sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
"""

SHOW_TOPOLOGY = """
import json, os
names = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "FIREPOOL_RANK"]
print(json.dumps({n: os.environ.get(n) for n in names}))
"""


@both_backends
def test_two_ranks_in_two_sandboxes_all_reduce_with_gloo(broker: BrokerProcess) -> None:
    c = broker.client("bob")
    job = run_job(c, {"pool": "cpu", "pods": 2, "lease_tag": "ddp", "timeout_s": 110,
                      "command": ["python3", "-c", ALL_REDUCE]}, wait=120)
    log = c.get(f"/v1/jobs/{job['id']}/logs").text
    assert job["state"] == "SUCCEEDED", (job, log)
    assert len(set(job["bound_pods"])) == 2
    # 1 + 2: each rank contributed rank + 1, and rank 0 (the coordinator) saw the reduced sum.
    assert f"rank 0 of 2 on {job['bound_pods'][0]}" in log and "sum 3" in log, log
    # The job ends before its pods' resets do: wait for both to come back idle, still bob's.
    deadline = time.monotonic() + 30
    while True:
        pods = {p["name"]: p for p in c.get("/v1/pods").json()["pods"]}
        if all(pods[n]["state"] == "idle" for n in job["bound_pods"]) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert all(pods[n]["state"] == "idle" and pods[n]["caller"] == "bob" for n in job["bound_pods"]), pods


def test_a_bare_torchrun_on_each_pod_forms_one_world_from_the_injected_topology(broker: BrokerProcess) -> None:
    """torchrun reads PET_NNODES, PET_NODE_RANK and PET_MASTER_*: 2 pods x 2 local workers = world 4."""
    c = broker.client("bob")
    script = ALL_REDUCE.replace("socket.gethostname()", "socket.gethostname() + ' local ' + __import__('os')"
                                                        ".environ['LOCAL_RANK']")
    command = f"cat > $TMPDIR/step.py <<'EOF'\n{script}\nEOF\ntorchrun --nproc-per-node 2 $TMPDIR/step.py"
    job = run_job(c, {"pool": "cpu", "pods": 2, "timeout_s": 110, "command": ["bash", "-c", command]}, wait=120)
    log = c.get(f"/v1/jobs/{job['id']}/logs").text
    assert job["state"] == "SUCCEEDED", (job, log)
    # Global ranks 0-3 each add rank + 1: 1 + 2 + 3 + 4; rank 0 and 1 run on the coordinator pod.
    assert f"rank 0 of 4 on {job['bound_pods'][0]} local 0 sum 10" in log, log
    assert f"rank 1 of 4 on {job['bound_pods'][0]} local 1 sum 10" in log, log


def test_caller_env_cannot_override_the_topology_in_a_real_sandbox(broker: BrokerProcess) -> None:
    c = broker.client("bob")
    env = {"MASTER_ADDR": "203.0.113.9", "MASTER_PORT": "1", "RANK": "5", "WORLD_SIZE": "9", "LOCAL_RANK": "4",
           "NODE_RANK": "4", "FIREPOOL_RANK": "8"}
    job = run_job(c, {"pool": "cpu", "pods": 2, "env": env, "command": ["python3", "-c", SHOW_TOPOLOGY]})
    assert job["state"] == "SUCCEEDED", job
    assert {d["name"] for d in job["dropped_env"]} == set(env)
    seen = json.loads(c.get(f"/v1/jobs/{job['id']}/logs").text.strip().splitlines()[-1])
    # The default pool's pods have isolated networks: rank 0 is reached over the gang link.
    assert seen["MASTER_ADDR"] == "10.213.0.1" and seen["MASTER_PORT"] != "1"
    assert (seen["RANK"], seen["WORLD_SIZE"], seen["LOCAL_RANK"], seen["NODE_RANK"], seen["FIREPOOL_RANK"]) == \
        ("0", "2", "0", "0", "0")


def test_a_gang_on_a_none_pool_forms_over_its_link_and_one_on_host_over_the_hosts_loopback(broker_factory) -> None:
    for network in ("none", "host"):
        b = broker_factory(name=f"broker-{network}",
                           pools=f"pools:\n  - {{name: cpu, max_count: 2, template: {{network: {network}}}}}\n")
        c = b.client("bob")
        job = run_job(c, {"pool": "cpu", "pods": 2, "timeout_s": 110, "command": ["python3", "-c", ALL_REDUCE]},
                      wait=120)
        log = c.get(f"/v1/jobs/{job['id']}/logs").text
        assert job["state"] == "SUCCEEDED" and "sum 3" in log, (network, job, log)
        alone = run_job(c, {"pool": "cpu", "command": ["python3", "-c", SHOW_TOPOLOGY]})
        assert alone["state"] == "SUCCEEDED", alone
        b.stop()
