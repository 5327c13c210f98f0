"""The pool catalog is strict; admission filters steering environment variables and says why."""

from __future__ import annotations

import math

import pytest

from broker.claiming.admission import admit, filter_env
from broker.errors import InvalidRequest, UnknownPool, Unschedulable
from broker.jobs import JobSpec, JobState
from broker.pools import CatalogError, default_catalog, load_catalog

CATALOG = """
pools:
  - name: h200
    gpus: 1
    accelerator: nvidia-h200
    min_count: 1
    max_idle_count: 2
    max_count: 8
    idle_timeout: 60
    caller_hold_seconds: 30
    standbys_per_active: 3
    step: 2
    reuse_tag: hint
    keep_paths: [/cache/uv]
    wipe_paths: [/scratch]
    template: {start_delay_s: 2.2}
  - name: cpu
caller_limits:
  default: {max_gpus: 4}
  alice: {max_pods: 2}
"""


def test_a_full_catalog_parses_every_knob() -> None:
    cat = load_catalog(CATALOG)
    h200 = cat.pools["h200"]
    assert (h200.gpus, h200.accelerator, h200.min_count, h200.max_idle_count, h200.max_count) == (1, "nvidia-h200", 1, 2, 8)
    assert (h200.idle_timeout, h200.hold_seconds, h200.standbys_per_active, h200.step, h200.reuse_tag) == (60, 30, 3, 2, "hint")
    assert h200.keep_paths == ("/cache/uv",) and h200.template["start_delay_s"] == 2.2
    assert cat.pools["cpu"].gpus == 0
    assert cat.limits_for("alice").max_pods == 2 and cat.limits_for("bob").max_gpus == 4


def test_hold_inherits_the_idle_timeout_and_none_means_forever() -> None:
    cat = load_catalog("pools: [{name: a, idle_timeout: 45}, {name: b, idle_timeout: null}]")
    assert cat.pools["a"].hold_seconds == 45
    assert math.isinf(cat.pools["b"].keep_alive) and math.isinf(cat.pools["b"].hold_seconds)


@pytest.mark.parametrize("text, needle", [
    ("pools: [{name: a, max_cnt: 3}]", "catalog: pools[0].max_cnt: unknown key"),
    ("pools: [{name: a}]\nbudget: {}", "catalog: budget: unknown key"),
    ("pools: [{name: a}]\nbudgets: {H200: -1}", "must not be negative"),
    ("pools: [{name: a, borrow: 1}]", "borrow must be true or false"),
    ("pools: [{name: a, gpus: one}]", "gpus must be an integer"),
    ("pools: [{name: a, reuse_tag: sticky}]", "reuse_tag"),
    ("pools: [{name: a, min_count: 5, max_count: 2}]", "below min_count"),
    ("pools: [{name: a}, {name: a}]", "defined twice"),
    ("pools: [{name: a, keep_paths: [relative]}]", "absolute paths"),
    ("pools: []", "non-empty list"),
    ("pools: [{name: 'a b'}]", "pool name"),
    ("caller_limits: {x: {max_cpus: 1}}\npools: [{name: a}]", "caller_limits"),
    (": : :", "not valid YAML"),
])
def test_bad_catalogs_fail_with_a_message_naming_the_problem(text: str, needle: str) -> None:
    with pytest.raises(CatalogError) as err:
        load_catalog(text)
    assert needle in str(err.value)


def test_default_catalog_has_cpu_and_a_gpu_pool_per_gpu() -> None:
    assert set(default_catalog(0).pools) == {"cpu"}
    cat = default_catalog(2, "virtual")
    assert cat.pools["gpu"].max_count == 2 and cat.pools["gpu"].gpus == 1 and cat.pools["gpu"].accelerator == "virtual"


def test_env_filter_drops_steering_variables_with_reasons() -> None:
    kept, dropped = filter_env({"A": "1", "LD_PRELOAD": "x", "LD_LIBRARY_PATH": "y", "FIREPOOL_CALLER": "root",
                                "CUDA_VISIBLE_DEVICES": "3", "RANK": "0", "PYTHONPATH": "/w"})
    assert kept == {"A": "1", "PYTHONPATH": "/w"}
    reasons = {d["name"]: d["reason"] for d in dropped}
    assert set(reasons) == {"LD_PRELOAD", "LD_LIBRARY_PATH", "FIREPOOL_CALLER", "CUDA_VISIBLE_DEVICES", "RANK"}
    assert "loader" in reasons["LD_PRELOAD"] and "broker" in reasons["FIREPOOL_CALLER"]


@pytest.mark.parametrize("env", [{"1BAD": "x"}, {"A=B": "x"}, {"A": "nul\x00"}])
def test_env_filter_rejects_malformed_entries(env: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest):
        filter_env(env)


def test_admission_queues_valid_jobs_and_types_the_rest() -> None:
    pools = default_catalog(1).pools
    job = admit(JobSpec(pool="gpu", command=("x",)), "alice", pools, 5.0)
    assert job.state is JobState.QUEUED and job.timings == {"submitted_at": 5.0, "queued_at": 5.0}
    with pytest.raises(UnknownPool):
        admit(JobSpec(pool="tpu", command=("x",)), "alice", pools, 5.0)
    with pytest.raises(Unschedulable):
        admit(JobSpec(pool="gpu", command=("x",), pods=2), "alice", pools, 5.0)
