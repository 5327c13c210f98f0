"""Pod manifests per template variant: snapshot, the API schema (kubernetes-validate --strict), and the
rules the schema misses (extended resources, HAMi standby shares, label and annotation syntax)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from broker.backends.kubernetes import hami
from broker.backends.kubernetes.manifests import (
    LABEL_BROKER,
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_TEMPLATE,
    SECRET_DIR,
    pod_manifest,
    secret_manifest,
    valid_key,
    valid_label_value,
)
from broker.backends.kubernetes.templates import TemplateError, parse_template
from broker.pods import ANNOTATION_PREFIX
from broker.pools import PoolSpec, parse_pool

SNAPSHOTS = Path(__file__).parent / "snapshots"
K8S_VERSION = "1.33.0"
K8S_VERSIONS = ("1.33.0", "1.37.0")
"""The oldest the deploy docs name as validated and the newest the schemas ship."""
UUID = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
OWNER = {ANNOTATION_PREFIX + "caller": "alice", ANNOTATION_PREFIX + "queue": "default",
         ANNOTATION_PREFIX + "lease-tag": "conv-1", ANNOTATION_PREFIX + "hold-until": "1800000300.0"}

CPU = {"name": "cpu", "cpus": 2, "template": {
    "image": "firepool/sandbox-cpu:0.1.0", "serviceAccountName": "firepool-sandbox", "runtimeClassName": "gvisor",
    "readOnlyRootFilesystem": True,
    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    "nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
    "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}]}}
HAMI = {"name": "h100", "gpus": 1, "accelerator": "h100", "standbys_per_active": 2, "template": {
    "image": "firepool/sandbox-gpu:0.1.0", "schedulerName": "hami-scheduler",
    "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 1},
                  "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 1}},
    "standby": {"resources": {"requests": {"cpu": "500m", "nvidia.com/gpu": 1, "nvidia.com/gpumem": 1},
                              "limits": {"cpu": "8", "nvidia.com/gpu": 1, "nvidia.com/gpumem": 1}}},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]}]}}}}}
VOLCANO = {"name": "a100", "gpus": 1, "accelerator": "a100", "standbys_per_active": 1, "template": {
    "image": "firepool/sandbox-gpu:0.1.0", "schedulerName": "volcano",
    "resources": {"requests": {"volcano.sh/vgpu-number": 1}, "limits": {"volcano.sh/vgpu-number": 1}},
    "standby": {"resources": {"requests": {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 1},
                              "limits": {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 1}}}}}


def _pod(raw: dict[str, Any], name: str, *, standby: bool = False, gang: str = "", size: int = 1,
         image: str = "", **extra: Any) -> dict[str, Any]:
    pool = parse_pool(raw)
    return pod_manifest(name, pool, parse_template(pool.name, pool.template), broker="firepool", kernels="cold",
                        annotations=OWNER, standby=standby, pin_uuids=(UUID,) if standby else (), origin="demand",
                        created_at=1_800_000_000.0, gang=gang, gang_size=size, image=image, **extra)


PINNED = "registry.example/team/train@sha256:" + "ab" * 32


VARIANTS = {
    "cpu": lambda: _pod(CPU, "cpu-0a1b2c3d"),
    "gpu_active": lambda: _pod(HAMI, "h100-0a1b2c3d"),
    "hami_standby": lambda: _pod(HAMI, "h100-5e6f7a8b", standby=True),
    "volcano_standby": lambda: _pod(VOLCANO, "a100-5e6f7a8b", standby=True),
    "gpu_gang": lambda: _pod(HAMI, "h100-9c0d1e2f", gang="job-1", size=4),
    "custom_image_pinned": lambda: _pod(CPU, "cpu-3a4b5c6d", image=PINNED),
    "custom_image_tag": lambda: _pod(HAMI, "h100-3a4b5c6d", image="registry.example/team/train:latest"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_manifest_matches_its_snapshot_and_the_api_schema(variant: str) -> None:
    manifest = VARIANTS[variant]()
    path = SNAPSHOTS / f"k8s_pod_{variant}.json"
    if os.environ.get("FIREPOOL_UPDATE_SNAPSHOTS"):
        path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    assert json.loads(path.read_text()) == manifest, f"{path.name} changed: review, then rerun with FIREPOOL_UPDATE_SNAPSHOTS=1"
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_secret_manifest_passes_the_api_schema() -> None:
    secret = secret_manifest("cpu-0a1b2c3d", "s" * 43, {LABEL_BROKER: "firepool"})
    kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
    assert secret["metadata"]["name"] == "cpu-0a1b2c3d-agent"


def test_schema_check_catches_a_misspelt_field() -> None:
    manifest = VARIANTS["cpu"]()
    manifest["spec"]["nodeSelektor"] = {"a": "b"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_extended_resource_requests_what_it_limits(variant: str) -> None:
    resources = VARIANTS[variant]()["spec"]["containers"][0]["resources"]
    for name, value in resources.get("limits", {}).items():
        if "/" in name:
            assert resources["requests"][name] == value


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_labels_and_annotations_have_api_syntax(variant: str) -> None:
    meta = VARIANTS[variant]()["metadata"]
    assert all(valid_key(k) and valid_label_value(v) for k, v in meta["labels"].items())
    assert all(valid_key(k) for k in meta["annotations"])
    assert {LABEL_POOL, LABEL_ROLE, LABEL_TEMPLATE, LABEL_BROKER} <= set(meta["labels"])


def test_standby_requests_a_share_and_is_pinned_to_the_active_card() -> None:
    pod = VARIANTS["hami_standby"]()
    wanted = pod["spec"]["containers"][0]["resources"]["requests"]
    assert wanted["nvidia.com/gpu"] == "1" and wanted["nvidia.com/gpumem"] == "1"
    assert pod["metadata"]["annotations"][hami.USE_UUID] == UUID
    assert pod["metadata"]["labels"][LABEL_ROLE] == "standby"


def test_active_pod_leaves_gpucores_and_gpumem_unset() -> None:
    requests = VARIANTS["gpu_active"]()["spec"]["containers"][0]["resources"]["requests"]
    assert "nvidia.com/gpucores" not in requests and "nvidia.com/gpumem" not in requests
    assert requests["nvidia.com/gpu"] == "1"


def test_standby_asking_gpu_alone_is_refused() -> None:
    raw = json.loads(json.dumps(HAMI))
    raw["template"]["standby"]["resources"] = {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}}
    raw["template"]["sharing"] = "hami"
    with pytest.raises(TemplateError, match="gpumem"):
        _pod(raw, "h100-00000000", standby=True)


def test_extended_request_differing_from_its_limit_is_refused() -> None:
    raw = json.loads(json.dumps(HAMI))
    raw["template"]["resources"]["requests"]["nvidia.com/gpu"] = 2
    with pytest.raises(TemplateError, match="must request what it limits"):
        _pod(raw, "h100-00000000")


def test_active_pod_with_gpucores_is_refused() -> None:
    raw = json.loads(json.dumps(HAMI))
    for part in ("requests", "limits"):
        raw["template"]["resources"][part]["nvidia.com/gpucores"] = 50
    with pytest.raises(TemplateError, match="whole card"):
        _pod(raw, "h100-00000000")


def test_job_runs_non_root_without_privilege_escalation_and_secret_only_in_agent_volume() -> None:
    pod = VARIANTS["cpu"]()
    container = pod["spec"]["containers"][0]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] != 0 and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "env" not in container  # the secret never reaches an environment
    secret_volume = next(v for v in pod["spec"]["volumes"] if "secret" in v)
    # The Secret itself is mounted only into the init container that hands the agent a copy it unlinks.
    assert all(m["name"] != secret_volume["name"] for m in container["volumeMounts"])
    (init,) = pod["spec"]["initContainers"]
    assert any(m["name"] == secret_volume["name"] for m in init["volumeMounts"])
    copy = next(m for m in container["volumeMounts"] if m["mountPath"] == SECRET_DIR)
    assert next(v for v in pod["spec"]["volumes"] if v["name"] == copy["name"])["emptyDir"]["medium"] == "Memory"
    assert init["securityContext"] == sc


def test_gang_is_kept_on_one_node_when_it_fits_else_preferred() -> None:
    fits = VARIANTS["gpu_gang"]()["spec"]["affinity"]["podAffinity"]
    assert fits["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == "kubernetes.io/hostname"
    wide = _pod(HAMI, "h100-9c0d1e2f", gang="job-1", size=16)["spec"]["affinity"]["podAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in wide


def test_a_gang_confined_to_one_node_is_required_on_one_host_whatever_the_template_guesses() -> None:
    # `topology: node` is a rule, not a wish: with gpusPerNode guessing the gang too big for one node, a preferred
    # affinity let the scheduler scatter the set, which the claim then never takes.
    raw = {**HAMI, "template": {**HAMI["template"], "topologyKey": "topology.kubernetes.io/zone"}}
    confined = _pod(raw, "h100-9c0d1e2f", gang="job-1", size=16, gang_topology="node")["spec"]["affinity"]
    (term,) = confined["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": {"firepool.io/gang": "job-1"}},
                    "topologyKey": "kubernetes.io/hostname"}
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in confined["podAffinity"]


@pytest.mark.parametrize(("template", "problem"), [
    ({"imagee": "x"}, "template.imagee: unknown key"),
    ({"image": ""}, "non-empty string"),
    ({"runAsUser": 0}, "root is refused"),
    ({"tolerations": {"key": "x"}}, "list of mappings"),
    ({"sharing": "mig"}, "sharing must be one of"),
    ({"imagePullPolicy": "Sometimes"}, "imagePullPolicy"),
])
def test_bad_template_is_a_typed_error_naming_the_key(template: dict[str, Any], problem: str) -> None:
    with pytest.raises(TemplateError, match=problem):
        parse_template("p", template)


def test_pool_name_that_is_no_dns_label_is_refused() -> None:
    pool = PoolSpec(name="cpu")
    with pytest.raises(TemplateError, match="DNS label"):
        pod_manifest("CPU_pod", pool, parse_template("cpu", {}), broker="b", kernels="cold", annotations={})


def test_a_custom_image_replaces_only_the_agent_containers_image() -> None:
    pinned_pod = VARIANTS["custom_image_pinned"]()
    agent = pinned_pod["spec"]["containers"][0]
    assert (agent["image"], agent["imagePullPolicy"]) == (PINNED, "IfNotPresent")
    assert pinned_pod["spec"]["initContainers"][0]["image"] == CPU["template"]["image"]  # the pre-pulled one
    tagged = VARIANTS["custom_image_tag"]()["spec"]["containers"][0]
    assert (tagged["image"], tagged["imagePullPolicy"]) == ("registry.example/team/train:latest", "Always")


def test_quarantined_nodes_are_kept_out_by_node_affinity_in_every_required_term() -> None:
    pool = parse_pool(HAMI)
    manifest = pod_manifest("h100-0a1b2c3d", pool, parse_template(pool.name, pool.template), broker="firepool",
                            kernels="cold", annotations=OWNER, origin="demand", avoid_nodes=("gpu-b", "gpu-a"))
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]},  # the template's own, kept
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a", "gpu-b"]}]}]
    assert len(pool.template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]) == 1  # the pool's template is not changed
    plain = _pod(CPU, "cpu-0a1b2c3d")
    cpu = parse_pool(CPU)
    excluded = pod_manifest("cpu-0a1b2c3d", cpu, parse_template(cpu.name, cpu.template), broker="firepool",
                            kernels="cold", annotations=OWNER, origin="demand", created_at=1_800_000_000.0,
                            avoid_nodes=("gpu-a",))
    assert "affinity" not in plain["spec"] and excluded["spec"]["affinity"] == {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-a"]}]}]}}}
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)
        kubernetes_validate.validate(excluded, version, strict=True)


def test_every_writable_volume_of_a_pod_has_a_size_limit() -> None:
    """A read-only root gets writable /workspace, /pkg, /run/firepool and /tmp: each an emptyDir the kubelet
    caps (disk ones at workspace_size, /tmp and /dev/shm in memory), never an unbounded one."""
    raw = {**CPU, "template": {**CPU["template"], "workspace_size": "256Mi", "tmp_size": "64Mi", "shm_size": "64Mi"}}
    pod = _pod(raw, "cpu-0a1b2c3d")
    empty = {v["name"]: v["emptyDir"] for v in pod["spec"]["volumes"] if "emptyDir" in v}
    mounted = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    for path in ("/workspace", "/pkg", "/run/firepool", "/tmp", "/dev/shm"):
        assert "sizeLimit" in empty[mounted[path]], (path, empty)
    assert empty[mounted["/workspace"]] == {"sizeLimit": "256Mi"}
    assert empty[mounted["/tmp"]] == empty[mounted["/dev/shm"]] == {"medium": "Memory", "sizeLimit": "64Mi"}
    assert all("sizeLimit" in spec for spec in empty.values()), empty
    with pytest.raises(TemplateError, match="tmp_size"):
        parse_template("cpu", {"tmp_size": "64Potatoes"})
