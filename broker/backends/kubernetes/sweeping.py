"""The card sweep after a restart: which shared (standby) cards hold a share of anyone outside their group.

Reads each node's HAMi register and every pod on it; a failed read marks the node's cards foreign, so
promotions stay fenced until a sweep succeeds. Only pools with standbys share cards.
"""

from __future__ import annotations

import dataclasses
import logging

from broker.backends.kubernetes import hami
from broker.backends.kubernetes.kubeapi import KubeApi
from broker.backends.kubernetes.ratelimit import Retryable
from broker.errors import BackendError
from broker.ports.backend import PodInfo

log = logging.getLogger("firepool.k8s")


async def sweep_cards(api: KubeApi, live: list[PodInfo]) -> None:
    """Mark (in place, `details.foreign`) the cards of shared groups that hold a share of anyone else."""
    nodes: dict[str, list[int]] = {}
    for i, info in enumerate(live):
        if info.gpus and info.details.get("node") and any(p.gpus == info.gpus and p.name != info.name
                                                          for p in live):
            nodes.setdefault(str(info.details["node"]), []).append(i)
    for node, indexes in nodes.items():
        try:
            node_obj, on_node = await api.node(node), await api.pods_on_node(node)
        except (BackendError, Retryable) as exc:
            log.warning("card sweep of node %s failed; its cards stay fenced: %s", node, exc)
            node_obj, on_node = None, []
        for i in indexes:
            foreign = hami.foreign_cards(live[i].gpus, live[i].pool, node_obj, on_node)
            if foreign:
                live[i] = dataclasses.replace(live[i], details={**live[i].details, "foreign": foreign})
