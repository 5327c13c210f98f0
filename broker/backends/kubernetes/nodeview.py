"""The cluster's nodes as the Kubernetes backend last read them: for placement, node epochs and quarantine.

A mixin of `KubernetesBackend`. Node objects are listed at most every `NODES_EVERY_S` on the create path
and whenever the control plane's node-epoch loop asks (`refresh_nodes`); a pod's node boot epoch
(`details["node_epoch"]`, design R5) and the nodes a quarantine keeps out (`avoided_nodes`) are read here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

from broker.backends.kubernetes.kubeapi import KubeApi
from broker.backends.kubernetes.nodes import DOMAIN_LABELS, parse_nodes
from broker.backends.kubernetes.ratelimit import Retryable
from broker.backends.kubernetes.settings import KubernetesSettings
from broker.clock import Clock
from broker.errors import BackendError
from broker.fleet.nodes import Node
from broker.ports.backend import avoided_node_ids

log = logging.getLogger("firepool.k8s")

NODES_EVERY_S = 30.0
"""How old the node list may get before the next create or list reads it again."""


class NodeView:
    """Node state of the backend (mixin); the backend's `__init__` sets these attributes."""

    clock: Clock
    api: KubeApi
    settings: KubernetesSettings
    _nodes: list[Node]
    _nodes_at: float
    _nodes_failed: bool

    async def refresh_nodes(self) -> list[Node]:
        """Read the cluster's Node objects again (at most every NODES_EVERY_S unless forced by a create)."""
        try:
            self._nodes = parse_nodes(await self.api.nodes(), self.settings.domain_labels)
            self._nodes_failed = False
        except (BackendError, Retryable) as exc:
            # A 5xx or a dropped connection: keep the last list, the next read tries again. Forbidden without
            # the ClusterRole firepool-broker-nodes: say it once, then placement is the scheduler's.
            (log.debug if self._nodes_failed else log.warning)(
                "listing nodes failed (placement keeps the last list, %d nodes): %s", len(self._nodes), exc
            )
            self._nodes_failed = True
        self._nodes_at = self.clock.now()
        return self._nodes

    def nodes(self) -> list[Node]:
        """The Ready, schedulable nodes with GPUs, as last read (the watch loop and list_pods refresh them)."""
        return list(self._nodes)

    def avoided_nodes(self, avoid: frozenset[str]) -> list[str]:
        """Nodes `avoid` names (`node:<id>`, a quarantined node: GPU nodes and CPU-only ones, which the node list
        leaves out) and nodes every GPU of which is to be avoided: a new pod gets none of them, CPU pods
        included (required node affinity, NotIn)."""
        return sorted({n.id for n in self._nodes if n.gpus and avoid.issuperset(n.gpus)} | avoided_node_ids(avoid))

    def _node_epoch(self, node: str) -> str:
        """The boot epoch the node reports now (as last read); "" for a node not (or not yet) listed."""
        return next((n.boot_epoch for n in self._nodes if n.id == node), "") if node else ""

    def set_domain_labels(self, labels: Sequence[str] | None) -> None:
        """Read topology domains from these node labels from the next node list on (a catalog reload)."""
        wanted = tuple(labels) if labels else DOMAIN_LABELS
        if wanted != self.settings.domain_labels:
            self.settings = dataclasses.replace(self.settings, domain_labels=wanted)
            self._nodes_at = -math.inf  # the next create or node poll reads the nodes again
