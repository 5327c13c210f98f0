"""Pod and Secret manifests from a pool's template: what the broker writes on every pod it creates.

Labels select (pool, role, template hash, owning broker); annotations carry what a restarted broker
needs (the control plane's owner record verbatim, plus the backend's own: GPU UUID, ready record).
The agent is the image's entrypoint; its bearer secret reaches it through an init container and a memory
emptyDir, and it unlinks it at start.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import Any

from broker.backends.kubernetes import hami
from broker.backends.kubernetes.templates import PodTemplate, TemplateError
from broker.images import pinned
from broker.pools import PoolSpec

AGENT_PORT = 7070
SECRET_DIR = "/run/firepool-secret"
SECRET_IN = "/run/firepool-secret-in"
_COPY_SECRET = (f"import os, shutil; shutil.copyfile('{SECRET_IN}/secret', '{SECRET_DIR}/secret'); "
                f"os.chmod('{SECRET_DIR}/secret', 0o400)")
SECRET_KEY = "secret"
LABEL_POOL = "firepool.io/pool"
LABEL_ROLE = "firepool.io/role"
LABEL_TEMPLATE = "firepool.io/template-hash"
LABEL_BROKER = "firepool.io/broker"
LABEL_GANG = "firepool.io/gang"
HOSTNAME = "kubernetes.io/hostname"
ANN_ORIGIN = "firepool.io/origin"
AGENT_INCARNATION = 1
"""The one incarnation of a pod's agent (the pod never restarts its container)."""
ANN_GPUS = "firepool.io/gpu-uuids"
"""The physical GPU UUID(s) the pod runs on, as the broker learnt them (HAMi's allocation)."""
ANN_CREATED = "firepool.io/created-at"
ANN_READY = "firepool.io/ready"
"""The pod's ready record (JSON: seconds from create to scheduled, pulled, started, agent answered)."""
ANN_NODE_EPOCH = "firepool.io/node-epoch"
"""The boot epoch of the pod's node when the pod started (design R5): a reboot since changes what the node
reports, never this."""
BACKEND_ANNOTATIONS = (ANN_ORIGIN, ANN_GPUS, ANN_CREATED, ANN_READY, ANN_NODE_EPOCH)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def valid_key(key: str) -> bool:
    """A label or annotation key as the API server accepts it: `[prefix/]name`."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _PREFIX.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED.match(name))


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def check_pod_name(name: str) -> None:
    if len(name) > 63 - len("-agent") or not _DNS_LABEL.match(name):
        raise TemplateError(f"pod name {name!r} is not a DNS label (lowercase letters, digits, '-'; "
                            f"at most {63 - len('-agent')} characters): rename the pool")


def secret_name(pod: str) -> str:
    return f"{pod}-agent"


def labels(pool: PoolSpec, broker: str, *, standby: bool, gang: str = "") -> dict[str, str]:
    out = {LABEL_POOL: pool.name, LABEL_ROLE: "standby" if standby else "active",
           LABEL_TEMPLATE: pool.template_hash, LABEL_BROKER: broker}
    if gang:
        out[LABEL_GANG] = gang
    return out


def _resources(pool: PoolSpec, template: PodTemplate, standby: bool) -> dict[str, Any]:
    chosen = template.standby_resources if standby else template.resources
    sharing = template.sharing
    out: dict[str, Any] = {part: {str(k): str(v) for k, v in values.items()}
                           for part, values in chosen.items() if isinstance(values, Mapping)}
    if not out and pool.gpus and not template.resources:
        # A catalog written for the local backend: whole cards, and HAMi's 1 MiB share for standbys.
        out = {part: {"nvidia.com/gpu": str(pool.gpus)} for part in ("requests", "limits")}
        if standby:
            sharing = "hami" if sharing == "none" else sharing
            for part in out.values():
                part["nvidia.com/gpumem"] = "1"
    elif standby and not out:
        raise TemplateError(f"pool {pool.name}: standby pods need template.standby.resources "
                            f"(a fractional share, e.g. nvidia.com/gpu: 1 with nvidia.com/gpumem: 1)")
    problem = hami.resource_problem(out, standby=standby, sharing=sharing)
    if problem:
        raise TemplateError(f"pool {pool.name}: {problem}")
    return out


def _security(template: PodTemplate) -> dict[str, Any]:
    uid = template.run_as_user
    return {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "allowPrivilegeEscalation": False,
            "privileged": False, "readOnlyRootFilesystem": template.read_only_root,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _gang_affinity(pool: PoolSpec, template: PodTemplate, gang: str, size: int, topology: str) -> dict[str, Any]:
    """Keep a gang's pods together: on one node when gpus × pods fits one, else preferably so. A gang confined
    to one node (`topology: node`) is required on one node whatever the template guesses of node sizes: a
    preference would let the scheduler scatter it, and the claim never takes a scattered set."""
    if topology == "node":
        term = {"labelSelector": {"matchLabels": {LABEL_GANG: gang}}, "topologyKey": HOSTNAME}
        return {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    term = {"labelSelector": {"matchLabels": {LABEL_GANG: gang}}, "topologyKey": template.topology_key}
    if pool.gpus * size <= template.gpus_per_node:
        return {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    return {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}


def _without_nodes(node_affinity: Mapping[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """The pool's node affinity with `kubernetes.io/hostname NotIn nodes` added to every required term (terms
    are ORed, expressions within one ANDed: the exclusion must hold in each)."""
    exclude = {"key": HOSTNAME, "operator": "NotIn", "values": sorted(nodes)}
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**term, "matchExpressions": [*(term.get("matchExpressions") or []), exclude]}
                                     for term in terms]
    return {**node_affinity, "requiredDuringSchedulingIgnoredDuringExecution": required}


def _empty_dir(size: int | None, medium: str) -> dict[str, Any]:
    """An emptyDir the kubelet caps at `size` (it evicts a pod past it; a memory one also counts as the
    container's memory); None: uncapped, by the operator's `null`."""
    spec: dict[str, Any] = {"medium": medium} if medium else {}
    if size is not None:
        spec["sizeLimit"] = _quantity(size)
    return spec


def _quantity(size: int) -> str:
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def pod_manifest(name: str, pool: PoolSpec, template: PodTemplate, *, broker: str, kernels: str,
                 annotations: Mapping[str, str], standby: bool = False, pin_uuids: tuple[str, ...] = (),
                 origin: str = "", created_at: float = 0.0, gang: str = "", gang_size: int = 1,
                 image: str = "", avoid_nodes: Sequence[str] = (), gang_topology: str = "") -> dict[str, Any]:
    """The pod to create for `name` (a dict the API accepts as JSON).

    `image`: a job's custom image (broker.images) replaces the template's in the agent container, whose
    entrypoint must still be the agent; a mutable tag is pulled every time (`Always`), a digest only when
    absent. The init container that hands the agent its secret keeps the pool's own (pre-pulled) image.
    `avoid_nodes`: quarantined nodes (broker.health.quarantine), kept out through required node affinity."""
    check_pod_name(name)
    meta_ann = {**annotations, ANN_ORIGIN: origin, ANN_CREATED: repr(created_at)}
    if standby:
        if not pin_uuids:
            raise TemplateError(f"standby pod {name} has no GPU to pin to")
        meta_ann.update(hami.pin_annotations(pin_uuids, template.sharing))
    bad = [k for k in meta_ann if not valid_key(k)]
    if bad:
        raise TemplateError(f"pod {name}: annotation key {bad[0]!r} is not a valid key")
    pod_labels = labels(pool, broker, standby=standby, gang=gang)
    if not all(valid_label_value(v) for v in pod_labels.values()):
        raise TemplateError(f"pod {name}: a label value is not valid ({pod_labels})")
    # The Secret is mounted into an init container only, which copies it into a memory-backed emptyDir of
    # the agent's; the agent reads and unlinks that copy at start, so no job (same uid) ever finds it.
    mounts: list[dict[str, Any]] = [{"name": "agent-secret-copy", "mountPath": SECRET_DIR}]
    volumes: list[dict[str, Any]] = [
        {"name": "agent-secret", "secret": {"secretName": secret_name(name), "defaultMode": 0o440,
                                            "items": [{"key": SECRET_KEY, "path": SECRET_KEY}]}},
        {"name": "agent-secret-copy", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
    copy = {"name": "agent-secret", "image": template.image, "imagePullPolicy": template.pull_policy,
            "command": ["python", "-S", "-c", _COPY_SECRET],
            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "50m", "memory": "32Mi"}},
            "securityContext": _security(template),
            "volumeMounts": [{"name": "agent-secret", "mountPath": SECRET_IN, "readOnly": True},
                             {"name": "agent-secret-copy", "mountPath": SECRET_DIR}]}
    if template.read_only_root:  # the agent and the job still need their own writable places, each capped
        for vol, path, size, medium in (("workspace", "/workspace", template.workspace_size, ""),
                                        ("pkg", "/pkg", template.workspace_size, ""),
                                        ("run", "/run/firepool", template.workspace_size, ""),
                                        ("tmp", "/tmp", template.tmp_size, "Memory")):
            volumes.append({"name": f"fp-{vol}", "emptyDir": _empty_dir(size, medium)})
            mounts.append({"name": f"fp-{vol}", "mountPath": path})
    if template.shm_size is not None:
        volumes.append({"name": "fp-shm", "emptyDir": _empty_dir(template.shm_size, "Memory")})
        mounts.append({"name": "fp-shm", "mountPath": "/dev/shm"})
    volumes += [dict(v) for v in template.volumes]
    mounts += [dict(m) for m in template.volume_mounts]
    # restartPolicy Never: the agent starts once per pod object, so its incarnation is always 1 and the
    # pod UID carries the identity (broker.health.epochs).
    args = ["--kernels", kernels, "--incarnation", str(AGENT_INCARNATION)]
    if pool.gpus:
        args += ["--cuda-visible-devices", "auto"]
    pull = template.pull_policy if not image else "IfNotPresent" if pinned(image) else "Always"
    container: dict[str, Any] = {
        "name": "agent", "image": image or template.image, "imagePullPolicy": pull, "args": args,
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "resources": _resources(pool, template, standby), "securityContext": _security(template),
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
        "terminationGracePeriodSeconds": template.termination_grace_s, "initContainers": [copy], "containers": [container], "volumes": volumes,
        "securityContext": {"runAsNonRoot": True, "runAsUser": template.run_as_user,
                            "runAsGroup": template.run_as_user, "fsGroup": template.run_as_user},
    }
    if template.service_account:
        spec["serviceAccountName"] = template.service_account
    if template.scheduler:
        spec["schedulerName"] = template.scheduler
    if template.node_selector:
        spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        spec["tolerations"] = [dict(t) for t in template.tolerations]
    if template.runtime_class:
        spec["runtimeClassName"] = template.runtime_class
    affinity = {k: v for k, v in template.affinity.items()}
    if gang and gang_size > 1:
        affinity["podAffinity"] = _gang_affinity(pool, template, gang, gang_size, gang_topology)
    if avoid_nodes:
        affinity["nodeAffinity"] = _without_nodes(affinity.get("nodeAffinity") or {}, avoid_nodes)
    if affinity:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": pod_labels, "annotations": meta_ann}, "spec": spec}


def secret_manifest(pod: str, secret: str, pod_labels: Mapping[str, str]) -> dict[str, Any]:
    """The agent's bearer secret, labelled like its pod so a restarted broker finds strays."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret_name(pod), "labels": dict(pod_labels)},
            "data": {SECRET_KEY: base64.b64encode(secret.encode()).decode()}}
