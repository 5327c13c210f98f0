"""Identity epochs (design R5): a name is not an identity; (name, epoch) is.

A pod's epoch has three parts: the backend's identity of the pod object (a Kubernetes pod UID; empty where
a name cannot be reused by another object while the record lives), the agent's incarnation (a counter
persisted outside the sandbox and bumped at every agent start, `firepool_agent.incarnation`) and the boot
epoch of the node it runs on (`Node.boot_epoch`: /proc boot_id, a Kubernetes node's bootID; a node that
rebooted or was replaced under the same name kills or voids what ran there, even when the pod object and
its UID survive). The backend records the epoch it started (`PodInfo.details["pod_uid"]`/`["incarnation"]`/
`["started_node_epoch"]`: the node's boot epoch when the pod started), the broker writes the epoch
it binds work under on the pod record (`firepool.dev/epoch`, with the owner annotations), and the agent
reports its incarnation in every health answer. One rule (`judge`) decides, for a restarted broker and
the Kubernetes backend's own UID checks alike:

    recorded == reported           -> TRUSTED   bindings (holds, attempts) stand
    nothing recorded or reported   -> UNKNOWN   first contact: nothing bound to it is trusted
    recorded != reported           -> CHANGED   another machine or agent: everything bound to the old
                                                epoch is invalidated and the pod is never reused
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.pods import ANNOTATION_PREFIX

EPOCH_ANNOTATION = ANNOTATION_PREFIX + "epoch"
"""On the pod record: the epoch the broker bound work under (written with the owner annotations)."""


class Verdict(enum.Enum):
    TRUSTED = "trusted"
    UNKNOWN = "unknown"
    CHANGED = "changed"


@dataclass(frozen=True)
class Epoch:
    identity: str = ""
    """The backend's object identity (pod UID); "" where the backend has none."""
    incarnation: int | None = None
    """The agent's start counter; None when not known."""
    node: str = ""
    """The boot epoch of the pod's node; "" where the backend reports none."""

    def __str__(self) -> str:
        """`identity#incarnation`, then `@node` when the node's boot epoch is known (what pods carry)."""
        text = f"{self.identity}#{'' if self.incarnation is None else self.incarnation}"
        return f"{text}@{self.node}" if self.node else text

    @classmethod
    def parse(cls, text: str | None) -> Epoch | None:
        if not text or "#" not in text:
            return None
        head, at, node = text.rpartition("@")
        if not at or "#" not in head or "#" in node:  # no node part (an annotation written before node epochs)
            head, node = text, ""
        identity, _, incarnation = head.rpartition("#")
        try:
            return cls(identity, int(incarnation) if incarnation else None, node)
        except ValueError:
            return None

    @property
    def known(self) -> bool:
        return self.incarnation is not None or bool(self.identity) or bool(self.node)


def judge(recorded: Epoch | None, reported: Epoch | None) -> Verdict:
    """The R5 rule: a part known on both sides must match; nothing known is not trusted."""
    if recorded is None or reported is None or not recorded.known or not reported.known:
        return Verdict.UNKNOWN
    compared = False
    for mine, theirs in ((recorded.identity, reported.identity), (recorded.node, reported.node)):
        if mine and theirs:
            if mine != theirs:
                return Verdict.CHANGED
            compared = True
    if recorded.incarnation is not None and reported.incarnation is not None:
        if recorded.incarnation != reported.incarnation:
            return Verdict.CHANGED
        compared = True
    return Verdict.TRUSTED if compared else Verdict.UNKNOWN


def recorded_epoch(details: Mapping[str, Any], annotations: Mapping[str, str]) -> Epoch | None:
    """The epoch work on the pod was bound under (the broker's annotation), else the one the backend
    recorded when it started the pod (`details`: `pod_uid`, `incarnation`, `started_node_epoch`: never the
    node's epoch as listed now, which a reboot changed); None when neither says."""
    bound = Epoch.parse(annotations.get(EPOCH_ANNOTATION))
    if bound is not None and bound.known:
        return bound
    incarnation = details.get("incarnation")
    identity = str(details.get("pod_uid") or "")
    node = str(details.get("started_node_epoch") or "")
    if isinstance(incarnation, int) or identity or node:
        return Epoch(identity, incarnation if isinstance(incarnation, int) else None, node)
    return None


def reported_epoch(details: Mapping[str, Any], incarnation: int | None) -> Epoch:
    """What a pod reports now: its object's identity as the backend sees it, its agent's incarnation and its
    node's boot epoch as the backend reads it now."""
    return Epoch(str(details.get("pod_uid") or ""), incarnation, str(details.get("node_epoch") or ""))
