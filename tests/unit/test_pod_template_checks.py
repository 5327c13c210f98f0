"""The catalog refuses, when it loads, every pod template value a pod could never start with.

Each refusal is one CatalogError naming the pool, the key and the value, so `firepool serve` stops with one
line instead of starting a pool whose every pod create fails (its jobs QUEUED for ever).
"""

from __future__ import annotations

import pytest

from broker.podtemplate import MIN_DISK, Limits, check_template, parse_limits
from broker.pools import CatalogError, load_catalog

ACCEPTED = "{memory: 512Mi, pids: 256, workspace_size: 256Mi, tmp_size: 64Mi, shm_size: 64Mi}"


def catalog(template: str, pool: str = "- name: cpu\n    max_count: 4") -> str:
    return f"pools:\n  {pool}\n    template: {template}\n"


def test_the_acceptance_pool_loads_and_reads_back_its_caps() -> None:
    spec = load_catalog(catalog(ACCEPTED), "pools.yaml").pools["cpu"]
    limits = parse_limits(spec.template, spec.cpus)
    assert limits == Limits(memory=512 << 20, pids=256, cpus=1.0, workspace_size=256 << 20,
                            tmp_size=64 << 20, shm_size=64 << 20)


@pytest.mark.parametrize(("template", "key", "value"), [
    ("{memory: 256Potatoes}", "memory", "256Potatoes"),
    ("{memory: 4Mi}", "memory", "4Mi"),
    ("{memory: true}", "memory", "True"),
    ("{workspace_size: 10Gib}", "workspace_size", "10Gib"),
    ("{workspace_size: 1Mi}", "workspace_size", "1Mi"),
    ("{tmp_size: 0}", "tmp_size", "0"),
    ("{tmp_size: 64}", "tmp_size", "64"),
    ("{shm_size: -1Gi}", "shm_size", "-1Gi"),
    ("{shm_size: 99999999Ti}", "shm_size", "99999999Ti"),
    ("{pids: 2}", "pids", "2"),
    ("{pids: '512'}", "pids", "'512'"),
    ("{cpus: 0}", "cpus", "0"),
    ("{cpus: lots}", "cpus", "lots"),
    ("{network: bridge}", "network", "bridge"),
    ("{binds: [{src: data, dst: /data}]}", "binds", "data"),
    ("{binds: [{src: /data, dst: /workspace}]}", "binds", "/workspace"),
    ("{binds: [{src: /etc, dst: /etc}]}", "binds", "/etc"),
    ("{start_delay_s: -1}", "start_delay_s", "-1"),
    ("{image: ''}", "image", "''"),
])
def test_an_impossible_template_value_names_the_pool_the_key_and_the_value(template: str, key: str,
                                                                            value: str) -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalog(catalog(template), "bad.yaml")
    message = str(caught.value)
    assert message.startswith("bad.yaml: pools[0] (cpu): ") and f"template.{key}" in message, message
    assert value in message and "\n" not in message, message


def test_a_pool_without_cpus_has_none_to_give_its_pods() -> None:
    with pytest.raises(CatalogError, match=r"pools\[0\] \(cpu\): template.cpus"):
        load_catalog(catalog("{}", "- name: cpu\n    cpus: 0"), "bad.yaml")


def test_values_every_backend_reads_its_own_way_are_left_to_that_backend() -> None:
    # The Kubernetes backend's own keys (resources, volumes) are its template parser's to check.
    check_template({"resources": {"limits": {"memory": "4Gi"}}, "volumes": [], "image": "reg.example/a:1"})
    check_template({"memory": None, "workspace_size": MIN_DISK, "tmp_size": "1.5Gi", "cpus": 0.5})


@pytest.mark.parametrize(("pool", "message"), [
    ("- name: cpu\n    wipe_paths: [/tmp]", "/tmp is reserved"),
    ("- name: cpu\n    keep_paths: [/run/firepool/]", "/run/firepool/ is reserved"),
    ("- name: cpu\n    keep_paths: [/cache]\n    shared_paths: [/cache/]", "/cache is listed twice"),
])
def test_a_volume_path_no_pod_can_own_stops_the_catalog(pool: str, message: str) -> None:
    with pytest.raises(CatalogError, match=rf"pools\[0\] \(cpu\): {message}"):
        load_catalog(catalog("{}", pool), "bad.yaml")
