"""Build the Kubernetes backend from `serve`'s flags: the client config, the namespace, the broker id."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from broker.backends.kubernetes.backend import KubernetesBackend, KubernetesSettings
from broker.backends.kubernetes.kubeapi import Connection, KubeApi, api_client
from broker.backends.kubernetes.manifests import valid_label_value
from broker.backends.kubernetes.ratelimit import RateSettings
from broker.clock import Clock
from broker.fencing import Term

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_namespace() -> str:
    """The broker's own namespace when it runs in a pod, else `default`."""
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def kubernetes_backend(clock: Clock, namespace: str | None, kubeconfig: str | None, broker_id: str = "firepool",
                       create_qps: float = 20.0, create_burst: int = 40,
                       domain_labels: Sequence[str] | None = None, term: Term | None = None) -> KubernetesBackend:
    """`term`: the broker's (`broker.fencing`), named by every request to a pod's agent."""
    if not valid_label_value(broker_id) or not broker_id:
        raise ValueError(f"--broker-id {broker_id!r} must be a label value (letters, digits, '-', '_', '.')")
    ns = namespace or default_namespace()
    rate = RateSettings(qps=create_qps, burst=create_burst)
    settings = KubernetesSettings(namespace=ns, broker_id=broker_id, rate=rate)
    if domain_labels:
        settings = dataclasses.replace(settings, domain_labels=tuple(domain_labels))
    api = KubeApi(api_client(Connection(namespace=ns, kubeconfig=kubeconfig)), ns, settings.timeouts)
    return KubernetesBackend(clock, api, settings, term=term)
