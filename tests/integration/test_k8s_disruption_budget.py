"""The brokers' PodDisruptionBudget (deploy/base/pdb.yaml) through the emulator's Eviction API, which applies
budgets as the API server does: only the leader is Ready (/readyz), so a drain may evict the standby but
is refused the leader (429) until another broker is Ready."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from k8s_emulator import Emulator
from tests.integration import k8s_rules as rules

pytestmark = pytest.mark.integration
NS = "default"
BROKER = {"app.kubernetes.io/name": "firepool-broker"}


@pytest.fixture
def api_only(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path, kubelet=False) as emu:
        yield emu


def shipped_budget() -> dict[str, Any]:
    (budget,) = [o for o in rules.render(rules.DEPLOY) if o["kind"] == "PodDisruptionBudget"]
    budget["metadata"].pop("namespace")
    return budget


def broker_pod(core: k8s.CoreV1Api, name: str, *, ready: bool) -> None:
    core.create_namespaced_pod(NS, {"metadata": {"name": name, "labels": BROKER},
                                    "spec": {"containers": [{"name": "broker", "image": "firepool/broker:0.1.0"}]}})
    set_ready(core, name, ready)


def set_ready(core: k8s.CoreV1Api, name: str, ready: bool) -> None:
    core.patch_namespaced_pod_status(name, NS, {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}})


def evict(core: k8s.CoreV1Api, name: str) -> None:
    core.create_namespaced_pod_eviction(name, NS, {"metadata": {"name": name, "namespace": NS}})


def test_a_drain_evicts_the_standby_but_not_the_only_ready_broker(api_only: Emulator) -> None:
    core, policy = k8s.CoreV1Api(api_only.client()), k8s.PolicyV1Api(api_only.client())
    policy.create_namespaced_pod_disruption_budget(NS, shipped_budget())
    broker_pod(core, "leader", ready=True)
    broker_pod(core, "standby", ready=False)
    (listed,) = policy.list_namespaced_pod_disruption_budget(NS).items
    assert (listed.status.expected_pods, listed.status.current_healthy, listed.status.desired_healthy,
            listed.status.disruptions_allowed) == (2, 1, 1, 0)

    with pytest.raises(ApiException) as refused:
        evict(core, "leader")
    body = json.loads(refused.value.body)
    assert refused.value.status == 429 and body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget", "message":
                                          "The disruption budget firepool-broker needs 1 healthy pods and has 1 "
                                          "currently"}]
    evict(core, "standby")  # unready, and the budget is met: it may go
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["leader"]

    broker_pod(core, "new-leader", ready=True)  # a second Ready broker: now the old one may go
    evict(core, "leader")
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["new-leader"]


def test_two_budgets_on_one_pod_are_refused_and_a_pod_without_one_is_evicted(api_only: Emulator) -> None:
    core, policy = k8s.CoreV1Api(api_only.client()), k8s.PolicyV1Api(api_only.client())
    broker_pod(core, "leader", ready=True)
    core.create_namespaced_pod(NS, {"metadata": {"name": "other"}, "spec": {"containers": [
        {"name": "c", "image": "firepool/agent:1"}]}})
    for name in ("one", "two"):
        policy.create_namespaced_pod_disruption_budget(NS, {"metadata": {"name": name}, "spec": {
            "maxUnavailable": 1, "selector": {"matchLabels": BROKER}}})
    with pytest.raises(ApiException) as refused:
        evict(core, "leader")
    assert refused.value.status == 500 and "more than one PodDisruptionBudget" in json.loads(refused.value.body)[
        "message"]
    evict(core, "other")
    assert [p.metadata.name for p in core.list_namespaced_pod(NS).items] == ["leader"]
