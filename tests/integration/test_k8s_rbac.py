"""The shipped RBAC (deploy/) against every API call the kubernetes backend makes, through the emulator's
enforcement of it: the broker's token is the service account `firepool-broker`, with exactly the rules
`kubectl kustomize deploy` renders; the test's admin token may do anything."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from broker.errors import BackendError
from broker.pools import parse_pool
from broker.ports.backend import PodRequest
from k8s_emulator import ADMIN_TOKEN, BROKER_TOKEN, Emulator
from k8s_emulator.rbac import DEPLOY, Grants, Rule, grants_of, shipped_grants
from tests.integration import k8s_rules as rules
from tests.integration.test_k8s_backend import new_backend

pytestmark = pytest.mark.integration

CPU = parse_pool({"name": "cpu", "template": {"image": "firepool/sandbox-cpu:0.1.0", "start_timeout_s": 60,
                                              "termination_grace_s": 1}})
SHARED = parse_pool({"name": "h100", "gpus": 1, "standbys_per_active": 1, "template": {
    "image": "firepool/sandbox-gpu:0.1.0", "schedulerName": "hami-scheduler", "termination_grace_s": 1,
    "resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}},
    "standby": {"resources": {"requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1},
                              "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1}}}}})
# The Role as shipped before this check existed: secrets without list and patch.
OLD_ROLE = Grants(namespaced=(
    Rule(frozenset({""}), frozenset({"pods"}), frozenset({"create", "get", "list", "watch", "patch", "delete"})),
    Rule(frozenset({""}), frozenset({"secrets"}), frozenset({"create", "get", "delete"}))),
    cluster=(Rule(frozenset({""}), frozenset({"nodes"}), frozenset({"get", "list"})),))


def core(emu: Emulator, token: str) -> Any:
    return kubernetes.client.CoreV1Api(emu.client(token))


def pod_body(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "firepool/agent:1"}]}}


@pytest.fixture
def api_only(tmp_path: Path) -> Iterator[Emulator]:
    with Emulator(tmp_path, kubelet=False, denials_fail=False) as emu:
        yield emu


def test_the_broker_is_refused_what_its_role_does_not_grant_with_the_api_servers_forbidden_status(
        api_only: Emulator) -> None:
    core(api_only, ADMIN_TOKEN).create_namespaced_pod("default", pod_body("x"))
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core(api_only, BROKER_TOKEN).replace_namespaced_pod("x", "default", pod_body("x"))
    assert refused.value.status == 403
    body = json.loads(refused.value.body)
    assert body["kind"] == "Status" and body["reason"] == "Forbidden" and body["code"] == 403
    assert body["message"] == ('pods "x" is forbidden: User "system:serviceaccount:default:firepool-broker" '
                               'cannot update resource "pods" in API group "" in the namespace "default"')
    assert body["details"] == {"name": "x", "kind": "pods"}
    with pytest.raises(kubernetes.client.ApiException) as elsewhere:  # a Role binds in its namespace only
        core(api_only, BROKER_TOKEN).list_namespaced_pod("kube-system")
    assert elsewhere.value.status == 403
    core(api_only, BROKER_TOKEN).patch_namespaced_pod("x", "default", {"metadata": {"labels": {"a": "b"}}})
    core(api_only, ADMIN_TOKEN).replace_namespaced_pod("x", "default", pod_body("x"))  # the admin may do anything
    assert api_only.audit is not None
    assert api_only.audit.denied[api_only.broker_user] == {("update", "", "pods"): 1, ("list", "", "pods"): 1}


def test_an_unknown_token_is_401_unauthorized(api_only: Emulator) -> None:
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core(api_only, "not-a-token").list_namespaced_pod("default")
    assert refused.value.status == 401


def test_grants_are_per_api_group(tmp_path: Path) -> None:
    """events in the core group are not events.k8s.io events: a rule names its group (as a podgroups rule of
    scheduling.volcano.sh will)."""
    core_events = Grants(namespaced=(Rule(frozenset({""}), frozenset({"events"}), frozenset({"list"})),))
    with Emulator(tmp_path, kubelet=False, rbac=core_events, denials_fail=False) as emu:
        client = emu.client(BROKER_TOKEN)
        assert core(emu, BROKER_TOKEN).list_namespaced_event("default").items == []
        with pytest.raises(kubernetes.client.ApiException) as refused:
            kubernetes.client.EventsV1Api(client).list_namespaced_event("default")
        assert refused.value.status == 403
        assert 'in API group "events.k8s.io"' in json.loads(refused.value.body)["message"]


def test_bindings_decide_where_rules_apply() -> None:
    objs = rules.render(rules.DEPLOY / "overlays" / "hami")
    grants = grants_of(objs)
    assert grants.allows("list", "", "pods", None, "default"), "the card sweep lists pods in every namespace"
    assert not grants.allows("create", "", "pods", "kube-system", "default"), "pods are created at home only"
    assert grants.allows("create", "", "pods", "default", "default")
    assert not grants_of(objs, account="someone-else").accesses()


async def test_with_the_role_as_once_shipped_every_pod_create_fails(tmp_path: Path) -> None:
    """The bug the shipped Role had: no `patch secrets`, so recording the pod's UID on its Secret was
    refused and every create failed."""
    with Emulator(tmp_path / "k8s", rbac=OLD_ROLE, denials_fail=False) as emu:
        backend = new_backend(emu)
        try:
            with pytest.raises(BackendError, match="403"):
                await backend.create(PodRequest(name="cpu-old", pool=CPU))
        finally:
            await backend.close()
        assert emu.audit is not None and ("patch", "", "secrets") in emu.audit.denied[emu.broker_user]


async def test_every_call_of_a_pod_lifecycle_and_a_restart_is_granted_by_the_shipped_role(tmp_path: Path) -> None:
    """Create (active and standby), annotate, a restart's recovery (secrets listed, a stray Secret deleted,
    the card sweep), delete: the emulator's audit of the broker's requests against the rendered Role."""
    hami = shipped_grants(DEPLOY / "overlays" / "hami")  # standbys share cards only there
    with Emulator(tmp_path / "k8s", gpus=1, rbac=hami) as emu:
        first = new_backend(emu)
        try:
            active = await first.create(PodRequest(name="h100-a", pool=SHARED))
            await first.create(PodRequest(name="h100-s", pool=SHARED, gpus=active.gpus))
            await first.create(PodRequest(name="cpu-a", pool=CPU))
        finally:
            await first.close()
        core(emu, ADMIN_TOKEN).create_namespaced_secret("default", {
            "metadata": {"name": "gone-agent", "labels": {"firepool.io/broker": "firepool"}},
            "data": {"secret": "eA=="}})
        second = new_backend(emu)
        try:
            live = await second.list_pods()
            assert {p.name for p in live} == {"h100-a", "h100-s", "cpu-a"}
            for name in ("h100-s", "h100-a", "cpu-a"):
                await second.delete(name)
        finally:
            await second.close()
        assert emu.audit is not None
        used = set(emu.audit.used[emu.broker_user])
        assert not emu.audit.denied, emu.audit.denied
    assert {("create", "", "pods"), ("watch", "", "pods"), ("list", "", "pods"), ("patch", "", "pods"),
            ("delete", "", "pods"), ("create", "", "secrets"), ("patch", "", "secrets"), ("list", "", "secrets"),
            ("delete", "", "secrets"), ("list", "", "nodes"), ("get", "", "nodes")} <= used
    assert used <= hami.accesses()
