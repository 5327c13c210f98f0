"""Quarantine and placement together on the local backend (2 virtual nodes × 4 GPUs, real sandboxes): a
virtual GPU quarantined after three hardware faults counts as taken in `largest_placeable`, and a 4-pod
gang then lands on one node without ever getting the quarantined card."""

from __future__ import annotations

import pytest

from tests.integration.conftest import BrokerProcess, run_job
from tests.integration.test_fleet import NODES, nodes_of
from tests.integration.test_health import FAULT_ON_0

pytestmark = pytest.mark.integration

POOLS = ("pools:\n"
         "  - {name: gpu, gpus: 1, accelerator: virtual, max_count: 8, max_idle_count: 8, step: 1,"
         " idle_timeout: 300, caller_hold_seconds: 300}\n"
         "quarantine: {threshold: 3}\n")


def test_a_quarantined_gpu_leaves_largest_placeable_and_a_gang_never_gets_it(tmp_path) -> None:
    b = BrokerProcess(tmp_path / "broker", pools=POOLS, extra=NODES)
    try:
        ops = b.client("ops")
        for caller in ("alice", "bob", "carol"):  # each new pod lands on the first free card: index 0
            job = run_job(b.client(caller), {"pool": "gpu", "command": ["sh", "-c", FAULT_ON_0]}, wait=120)
            assert job["state"] == "SUCCEEDED", job
        listed = ops.get("/v1/admin/quarantine").json()["quarantine"]
        assert [(r["key"], r["quarantined"]) for r in listed] == [("virtual-gpu-0", True)]
        assert any(e["kind"] == "quarantined" for e in ops.get("/v1/events").json()["events"])

        gpu = next(p for p in ops.get("/v1/pools").json()["pools"] if p["name"] == "gpu")
        held = sum(len(p["gpus"]) for p in ops.get("/v1/pods").json()["pods"])
        assert gpu["largest_placeable"]["1"] == 8 - 1 - held, (gpu["largest_placeable"], held)

        # ops holds no pod: all four are placed anew, on one node, none on the quarantined card
        gang = run_job(ops, {"pool": "gpu", "pods": 4, "lease_tag": "gang", "command": ["true"]}, wait=120)
        assert gang["state"] == "SUCCEEDED", gang
        assert len(nodes_of(b, gang["bound_pods"])) == 1
        cards = {g for p in ops.get("/v1/pods").json()["pods"] if p["name"] in gang["bound_pods"] for g in p["gpus"]}
        assert len(cards) == 4 and "virtual-gpu-0" not in cards, cards
    finally:
        b.stop()
