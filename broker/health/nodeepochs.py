"""Node boot epochs (design R5): the epoch recorded for each node, and which pods a change voids.

A node reports a boot epoch (`Node.boot_epoch`: /proc boot_id locally, `status.nodeInfo.bootID` on
Kubernetes). A node that rebooted, or was replaced under the same name, reports another one: whatever
ran there is gone even when the pod object survives (a pod's UID outlives a reboot of its node), so
every pod bound under the old epoch is invalidated. The table is the broker's record of node state; a
restarted broker rebuilds it from what pods carry (`firepool.dev/epoch` ends in `@<node boot epoch>`,
broker.health.epochs), so a change during the outage is caught at recovery. First contact records the
node and trusts nothing that was not bound under that epoch.

Pure: `NodeEpochs.observe` takes the nodes as reported and returns the changes; `voided` says which
pods no longer stand. The health monitor acts on both (broker.health.monitor).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from broker.fleet.nodes import Node
from broker.health.epochs import Epoch, Verdict, judge


@dataclass(frozen=True)
class NodeChange:
    """A node that answered with another boot epoch than the recorded one."""

    node: str
    recorded: str
    reported: str


class NodeEpochs:
    """node id -> the boot epoch last reported (and trusted from then on)."""

    def __init__(self) -> None:
        self.recorded: dict[str, str] = {}

    def observe(self, nodes: Iterable[Node]) -> list[NodeChange]:
        """Record each node's epoch; the nodes whose epoch changed since the last report."""
        changes = []
        for node in nodes:
            if not node.boot_epoch:
                continue  # a node that reports none cannot be judged; its pods keep their own epochs
            recorded = self.recorded.get(node.id)
            if judge(Epoch(node=recorded or ""), Epoch(node=node.boot_epoch)) is Verdict.CHANGED:
                changes.append(NodeChange(node.id, recorded or "", node.boot_epoch))
            self.recorded[node.id] = node.boot_epoch
        return changes

    def current(self, node: str) -> str:
        return self.recorded.get(node, "")


def voided(pod_epoch: str, node: str, current: Mapping[str, str], changed: Collection[str]) -> bool:
    """Does a pod on `node`, bound under `pod_epoch`, stand no longer? Yes when its node's epoch just changed
    (nothing bound to the old epoch is trusted, whatever the pod recorded), or when the pod recorded another
    node epoch than the node's current one (it was made under an epoch before the last reboot)."""
    if not node:
        return False
    if node in changed:
        return True
    now = current.get(node, "")
    if now and pod_epoch.endswith("@" + now):
        return False  # the common case, every pass for every pod: bound under the node's epoch of now
    recorded = Epoch.parse(pod_epoch)
    if recorded is None or not recorded.node or not now:
        return False
    return judge(Epoch(node=recorded.node), Epoch(node=now)) is Verdict.CHANGED
