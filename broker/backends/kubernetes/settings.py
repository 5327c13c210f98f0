"""The Kubernetes backend's settings: namespace, broker id, create pacing, timeouts, node labels."""

from __future__ import annotations

from dataclasses import dataclass

from broker.backends.kubernetes.annotating import DEFER_S
from broker.backends.kubernetes.kubeapi import ApiTimeouts
from broker.backends.kubernetes.manifests import AGENT_PORT
from broker.backends.kubernetes.nodes import DOMAIN_LABELS
from broker.backends.kubernetes.ratelimit import RateSettings


@dataclass(frozen=True)
class KubernetesSettings:
    namespace: str = "default"
    broker_id: str = "firepool"
    """The `firepool.io/broker` label value: which broker owns a pod (several may share a namespace)."""
    agent_port: int = AGENT_PORT
    rate: RateSettings = RateSettings()
    agent_timeout_s: float = 30.0
    """How long a running pod's agent may take to answer its first health check."""
    pull_backoff_s: float = 30.0
    """After an image pull error, new pods of that template fail at once for this long (doubling)."""
    domain_labels: tuple[str, ...] = DOMAIN_LABELS
    """Node labels whose value is the node's topology domain, first set wins (the catalog's
    `topology_domain_labels`)."""
    annotate_defer_s: float = DEFER_S
    """Owner-record changes that only age (hold deadline, idle-since, job) are coalesced this long
    (broker.backends.kubernetes.annotating); identity changes are written at once."""
    timeouts: ApiTimeouts = ApiTimeouts()
    """Bounds on every API call and on the pod watch (broker.backends.kubernetes.kubeapi)."""
    delete_wait_s: float = 30.0
    """Beyond a pod's grace period, how long a delete waits for the object to go (its GPUs count as taken
    until then); past it the delete gives up waiting and says so."""
