"""Catalog errors name the file and the key path, and the schema keeps every default the broker relies on."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.pools import CatalogError, PoolSpec, load_catalog, load_catalog_file, parse_pool


def message(text: str) -> str:
    with pytest.raises(CatalogError) as err:
        load_catalog(text, "pools.yaml")
    return str(err.value)


def test_an_unknown_key_names_the_file_and_the_key_path() -> None:
    assert message("pools: [{name: a}, {name: b, max_cout: 3}]") == "pools.yaml: pools[1].max_cout: unknown key"


def test_every_problem_of_a_catalog_is_reported_on_one_line() -> None:
    text = message("pools: [{name: a, max_cout: 3, gpus: '1'}]\nbudget: {}")
    assert "\n" not in text
    assert text.startswith("pools.yaml: ")
    for part in ("pools[0].max_cout: unknown key", "pools[0].gpus must be an integer, got '1'", "budget: unknown key"):
        assert part in text


def test_a_catalog_file_is_named_in_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n  - name: gpu\n    reuse_tag: sticky\n")
    with pytest.raises(CatalogError, match=r"pools\.yaml: pools\[0\]\.reuse_tag must be one of 'boundary', 'hint' or "
                                           r"'retire', got 'sticky'"):
        load_catalog_file(path)


def test_a_missing_catalog_file_is_a_catalog_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="nosuch.yaml: cannot read the catalog: No such file"):
        load_catalog_file(tmp_path / "nosuch.yaml")


@pytest.mark.parametrize("text, expected", [
    ("pools: [{name: a, gpus: true}]", "pools[0].gpus must be an integer, got True"),
    ("pools: [{name: a, gpus: 1.5}]", "pools[0].gpus must be an integer, got 1.5"),
    ("pools: [{name: a, idle_timeout: '30'}]", "pools[0].idle_timeout must be a number, got '30'"),
    ("pools: [{name: a, step: 0}]", "pools[0].step must be at least 1"),
    ("pools: [{gpus: 1}]", "pools[0].name is required"),
    ("pools: [x]", "pools[0] must be a mapping, got 'x'"),
    ("pools: [{name: a, env: {N: 1}}]", "pools[0].env.N must be a string, got 1"),
    ("pools: [{name: a, keep_paths: /x}]", "pools[0].keep_paths must be a list, got '/x'"),
    ("pools: [{name: a}]\ncaller_limits: {bob: {max_gpus: -1}}", "caller_limits.bob.max_gpus must not be negative"),
    ("", "the catalog must be a mapping with a `pools` list"),
])
def test_wrong_types_are_refused_in_the_catalogs_own_words(text: str, expected: str) -> None:
    assert message(text) == f"pools.yaml: {expected}"


def test_retire_is_a_reuse_tag_mode() -> None:
    assert load_catalog("pools: [{name: a, reuse_tag: retire}]").pools["a"].reuse_tag == "retire"


def test_a_pool_that_sets_nothing_gets_the_same_defaults_as_the_dataclass() -> None:
    assert parse_pool({"name": "a"}) == PoolSpec(name="a")
    assert parse_pool({"name": "g", "gpus": 2}).accelerator == "gpu"
    assert parse_pool({"name": "g", "gpus": 2, "accelerator": "H200"}).accelerator == "H200"


def test_numeric_caller_and_accelerator_names_are_read_as_names() -> None:
    cat = load_catalog("pools: [{name: a}]\ncaller_limits: {1001: {max_pods: 1}}\nbudgets: {4090: 2}")
    assert cat.limits_for("1001").max_pods == 1 and cat.budgets == {"4090": 2.0}


def test_parse_pool_names_the_pool_in_its_errors() -> None:
    with pytest.raises(CatalogError, match=r"^pool 'cpu': max: unknown key$"):
        parse_pool({"name": "cpu", "max": 1})


@pytest.mark.parametrize(("venue_delay", "problem"), [
    ("{p90_s: 3}", "venue_delay needs median_s"),
    ("{median_s: 2, p90_s: 1}", "0 <= median_s <= p90_s"),
    ("{median_s: 1, crowd: 8}", "unknown field(s) ['crowd']"),
    ("{median_s: 1, seed: 1.5}", "seed must be an integer"),
    ("fast", "venue_delay must be a mapping"),
])
def test_a_bad_venue_delay_is_refused_with_the_catalogs_key_path_not_at_pod_start(venue_delay: str,
                                                                                   problem: str) -> None:
    text = message(f"pools: [{{name: a}}, {{name: b, template: {{venue_delay: {venue_delay}}}}}]")
    assert text.startswith("pools.yaml: pools[1].template: ") and problem in text


def test_a_good_venue_delay_passes_the_catalog() -> None:
    catalog = load_catalog("pools: [{name: b, template: {venue_delay: {median_s: 1, p90_s: 2, seed: 3}}}]")
    assert catalog.pools["b"].template["venue_delay"]["seed"] == 3


def test_serve_reads_a_bad_venue_delay_from_the_file_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n  - name: gpu\n    template:\n      venue_delay: {median_s: 3, p90_s: 1}\n")
    with pytest.raises(CatalogError, match=r"pools\.yaml: pools\[0\]\.template: venue_delay: a start model needs 0 <= median_s"):
        load_catalog_file(path)  # what `firepool serve --pools` and a SIGHUP reload call


def test_topology_domain_labels_are_label_keys_and_default_to_the_backends() -> None:
    assert load_catalog("pools: [{name: a}]").topology_domain_labels is None
    catalog = load_catalog("pools: [{name: a}]\ntopology_domain_labels: [example.com/rack, topology.kubernetes.io/zone]")
    assert catalog.topology_domain_labels == ("example.com/rack", "topology.kubernetes.io/zone")
    assert "topology_domain_labels[0]: 'not a key!' is not a Kubernetes label key" in message(
        "pools: [{name: a}]\ntopology_domain_labels: ['not a key!']")
    assert "topology_domain_labels must be a non-empty list" in message("pools: [{name: a}]\ntopology_domain_labels: []")
