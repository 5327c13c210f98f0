"""A pool's Kubernetes `template`, checked once: every key known, every value of the right shape.

The catalog keeps `template` as a free mapping (each backend reads its own keys); this module is the
Kubernetes backend's reading of it. Unknown keys are an error at start, as everywhere in the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import BackendError
from broker.podtemplate import DEFAULT_TMP, DEFAULT_WORKSPACE, MIN_DISK, MIN_TMPFS, parse_size

DEFAULT_IMAGE = "firepool/sandbox-cpu:0.1.0"
SHARING = ("none", "hami", "volcano")
_KEYS = frozenset({
    "image", "imagePullPolicy", "resources", "standby", "serviceAccountName", "schedulerName", "nodeSelector",
    "tolerations", "affinity", "runtimeClassName", "volumes", "volumeMounts", "readOnlyRootFilesystem",
    "runAsUser", "sharing", "start_timeout_s", "topologyKey", "gpusPerNode", "start_delay_s",
    "workspace_size", "tmp_size", "shm_size", "termination_grace_s", "queue",
})


class TemplateError(BackendError):
    """A pool's Kubernetes template is malformed; the message names the pool and the key."""

    status = 400
    retryable = False


@dataclass(frozen=True)
class PodTemplate:
    """What the backend copies into a pool's pods."""

    image: str = DEFAULT_IMAGE
    pull_policy: str = "IfNotPresent"
    resources: Mapping[str, Any] = field(default_factory=dict)
    """The active pod's requests and limits."""
    standby_resources: Mapping[str, Any] = field(default_factory=dict)
    """A standby pod's requests and limits (HAMi/Volcano fractional share)."""
    service_account: str = ""
    scheduler: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    runtime_class: str = ""
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    read_only_root: bool = False
    run_as_user: int = 1000
    """The non-root uid of the agent and the job (the image's `sandbox` user)."""
    sharing: str = "none"
    """How standbys share a card: `hami`, `volcano` (fractional shares) or `none` (no standbys)."""
    start_timeout_s: float = 300.0
    """A pod still Pending this long after its create is deleted and its budget released."""
    topology_key: str = "kubernetes.io/hostname"
    """Where a gang is kept together (podAffinity) when it fits one node."""
    gpus_per_node: int = 8
    """GPUs of one node of this pool, to decide whether a gang fits one."""
    workspace_size: int | None = DEFAULT_WORKSPACE
    """sizeLimit of each disk-backed emptyDir a read-only root gets (/workspace, /pkg, /run/firepool)."""
    tmp_size: int | None = DEFAULT_TMP
    """sizeLimit of the memory-backed /tmp a read-only root gets."""
    shm_size: int | None = None
    """sizeLimit of a memory-backed /dev/shm; None keeps the container runtime's (64 MiB)."""
    termination_grace_s: int = 5
    """A deleted pod's grace (terminationGracePeriodSeconds): SIGTERM, then SIGKILL at its end; its GPUs
    count as taken until the object is gone."""
    queue: str = "default"
    """The Volcano queue of the pool's pods and gangs (PodGroup `spec.queue`); only with schedulerName volcano."""


def _mapping(pool: str, key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TemplateError(f"pool {pool}: template.{key} must be a mapping, got {value!r}")
    return value


def _items(pool: str, key: str, value: Any) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise TemplateError(f"pool {pool}: template.{key} must be a list of mappings, got {value!r}")
    return tuple(value)


def _text(pool: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TemplateError(f"pool {pool}: template.{key} must be a non-empty string, got {value!r}")
    return value


def parse_template(pool: str, raw: Mapping[str, Any]) -> PodTemplate:
    """Read a pool's `template`; raises TemplateError naming the first bad key."""
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise TemplateError(f"pool {pool}: template.{unknown[0]}: unknown key (known: {', '.join(sorted(_KEYS))})")
    kw: dict[str, Any] = {}
    for key, attr in (("image", "image"), ("imagePullPolicy", "pull_policy"), ("serviceAccountName", "service_account"),
                      ("schedulerName", "scheduler"), ("runtimeClassName", "runtime_class"),
                      ("topologyKey", "topology_key"), ("queue", "queue")):
        if key in raw:
            kw[attr] = _text(pool, key, raw[key])
    if kw.get("pull_policy", "IfNotPresent") not in ("Always", "IfNotPresent", "Never"):
        raise TemplateError(f"pool {pool}: template.imagePullPolicy must be Always, IfNotPresent or Never")
    for key, attr in (("resources", "resources"), ("nodeSelector", "node_selector"), ("affinity", "affinity")):
        if key in raw:
            kw[attr] = _mapping(pool, key, raw[key])
    if "standby" in raw:
        standby = _mapping(pool, "standby", raw["standby"])
        if set(standby) - {"resources"}:
            raise TemplateError(f"pool {pool}: template.standby takes only `resources`")
        kw["standby_resources"] = _mapping(pool, "standby.resources", standby.get("resources", {}))
    for key, attr in (("tolerations", "tolerations"), ("volumes", "volumes"), ("volumeMounts", "volume_mounts")):
        if key in raw:
            kw[attr] = _items(pool, key, raw[key])
    if "readOnlyRootFilesystem" in raw:
        if not isinstance(raw["readOnlyRootFilesystem"], bool):
            raise TemplateError(f"pool {pool}: template.readOnlyRootFilesystem must be true or false")
        kw["read_only_root"] = raw["readOnlyRootFilesystem"]
    for key, attr in (("runAsUser", "run_as_user"), ("gpusPerNode", "gpus_per_node"),
                      ("termination_grace_s", "termination_grace_s")):
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TemplateError(f"pool {pool}: template.{key} must be a positive integer"
                                    + (" (root is refused)" if key == "runAsUser" else ""))
            kw[attr] = value
    if "start_timeout_s" in raw:
        value = raw["start_timeout_s"]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise TemplateError(f"pool {pool}: template.start_timeout_s must be a positive number")
        kw["start_timeout_s"] = float(value)
    for key, minimum in (("workspace_size", MIN_DISK), ("tmp_size", MIN_TMPFS), ("shm_size", MIN_TMPFS)):
        if key in raw:
            try:
                kw[key] = parse_size(raw[key], key, minimum)
            except ValueError as exc:
                raise TemplateError(f"pool {pool}: {exc}") from None
    if "queue" in kw and kw.get("scheduler") != "volcano":
        raise TemplateError(f"pool {pool}: template.queue is a Volcano queue: it needs schedulerName volcano")
    sharing = raw.get("sharing")
    if sharing is None:
        scheduler = kw.get("scheduler", "")
        sharing = "volcano" if scheduler == "volcano" and _mentions(kw, "volcano.sh/vgpu") else \
            "hami" if _mentions(kw, "nvidia.com/gpumem") else "none"
    if sharing not in SHARING:
        raise TemplateError(f"pool {pool}: template.sharing must be one of {', '.join(SHARING)}, got {sharing!r}")
    kw["sharing"] = sharing
    return PodTemplate(**kw)


def _mentions(kw: Mapping[str, Any], prefix: str) -> bool:
    standby = kw.get("standby_resources") or {}
    return any(str(k).startswith(prefix) for part in standby.values() if isinstance(part, Mapping) for k in part)
