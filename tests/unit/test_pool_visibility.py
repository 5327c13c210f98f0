"""What operators see: GET /v1/pools and the matching Prometheus gauges; catalog budgets; capacity sources."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from broker.errors import Unavailable
from broker.pools import load_catalog
from broker.ports.capacity import FileCapacitySource, StaticCapacitySource
from tests.unit.harness import Harness, cpu_pool, gpu_pool

FIELDS = ("min_count", "max_idle_count", "max_count", "idle_timeout", "physical", "eligible", "idle", "held",
          "held_by", "starting", "busy", "standby", "stale", "borrowed", "queued_demand", "last_plan")


async def test_pools_view_and_gauges_show_knobs_counts_demand_and_the_last_plan() -> None:
    capacity = StaticCapacitySource({"fake-gpu": 1})
    h = await Harness([cpu_pool(), gpu_pool(max_count=3, borrow=True, caller_hold_seconds=600.0)], gpus=3,
                      budgets={"fake-gpu": 1}, capacity=capacity).start()
    app = create_app(h.cp, TokenAuth({"t": {"caller": "ops", "admin": True}}), metrics_caller_labels=True)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
            for caller in ("alice", "bob", "carol"):
                await h.submit(caller, pool="gpu", command=("sleep", "1"))
            await h.run_for(3.0)
            pools = {p["name"]: p for p in (await http.get("/v1/pools", headers={"Authorization": "Bearer t"}))
                     .json()["pools"]}
            gpu = pools["gpu"]
            for key in FIELDS:
                assert key in gpu, key
            assert gpu["physical"] == 2 and gpu["borrowed"] == 1 and gpu["held"] == 2
            assert gpu["queued_demand"] == 1 and sorted(gpu["held_by"]) == ["alice", "bob"]
            assert gpu["budget"] == {"accelerator": "fake-gpu", "units_per_pod": 1.0, "limit": 1.0, "used": 1.0}
            assert "budget" in gpu["last_plan"]["reason"]
            metrics = (await http.get("/metrics", headers={"Authorization": "Bearer t"})).text
            assert 'firepool_pool_physical{pool="gpu"} 2.0' in metrics
            assert 'firepool_pool_borrowed{pool="gpu"} 1.0' in metrics
            assert 'firepool_pool_queued_demand{pool="gpu"} 1.0' in metrics
            assert 'firepool_pool_max_count{pool="gpu"} 3.0' in metrics
            assert 'firepool_pool_held_by{caller="alice",pool="gpu"} 1.0' in metrics
            assert 'firepool_budget_limit{accelerator="fake-gpu"} 1.0' in metrics
            assert 'firepool_budget_limit{accelerator="cpu"} +Inf' in metrics
            assert "firepool_pool_last_plan_create{" in metrics
    finally:
        await h.stop()


def test_catalog_budgets_are_per_accelerator_numbers() -> None:
    cat = load_catalog("budgets: {H200: 16, cpu: 64.5}\npools: [{name: a, gpus: 1, accelerator: H200, borrow: true}]")
    assert cat.budgets == {"H200": 16.0, "cpu": 64.5} and cat.pools["a"].borrow


def test_file_capacity_source_reads_numbers_or_unused_and_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / "capacity.json"
    source = FileCapacitySource(path)
    assert source.read() == {}  # nothing published yet
    path.write_text(json.dumps({"H200": 4, "A100": {"unused": 2}}))
    assert source.read() == {"H200": 4.0, "A100": 2.0}
    for bad in ("not json", json.dumps({"H200": -1}), json.dumps(["H200"]), json.dumps({"H200": True})):
        path.write_text(bad)
        with pytest.raises(Unavailable):
            source.read()


async def test_a_failed_capacity_read_keeps_the_last_figures() -> None:
    capacity = StaticCapacitySource({"fake-gpu": 2})
    h = await Harness([gpu_pool(borrow=True)], gpus=2, budgets={"fake-gpu": 0}, capacity=capacity).start()
    try:
        borrowing = h.cp.controller.borrowing
        assert borrowing is not None and borrowing.fits("fake-gpu", 1.0) == 2
        capacity.fail = True
        assert not borrowing.refresh()
        assert borrowing.fits("fake-gpu", 1.0) == 2
    finally:
        await h.stop()
