"""What the backend knows of each of its pods, and the rule for adopting a previous broker's pod.

A pod is adopted only when it runs and its agent Secret records its UID: a pod recreated under the same
name (another UID) is a different pod, and nothing on it is trusted.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.backends.kubernetes import hami, podstatus
from broker.backends.kubernetes.manifests import (
    ANN_CREATED,
    ANN_GPUS,
    ANN_READY,
    LABEL_POOL,
    LABEL_TEMPLATE,
    SECRET_KEY,
)

log = logging.getLogger("firepool.k8s")

ANN_POD_UID = "firepool.io/pod-uid"
"""On the Secret: the UID of the pod it was made for."""


@dataclass
class PodRecord:
    name: str
    pool: str
    secret: str
    template: str
    created_at: float
    ready: podstatus.ReadyRecord
    uid: str = ""
    ip: str = ""
    gpus: tuple[str, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    up: bool = False
    """Created and answered: listed, reachable."""
    lost: str = ""
    """Why the pod can no longer be trusted (deleted from outside, replaced, failed)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)


def adopt(pod: Mapping[str, Any], secret_obj: Mapping[str, Any] | None) -> PodRecord | None:
    """The record of a pod a previous broker made, or None when it is not to be trusted or not running."""
    meta = podstatus.meta(pod)
    name = str(meta.get("name"))
    if secret_obj is None:
        log.warning("pod %s has no agent Secret: not trusted", name)
        return None
    recorded = (podstatus.meta(secret_obj).get("annotations") or {}).get(ANN_POD_UID, "")
    if recorded != podstatus.uid(pod):
        log.warning("pod %s has UID %s, its Secret was made for %s: not trusted", name, podstatus.uid(pod),
                    recorded or "(none)")
        return None
    if not podstatus.running(pod) or podstatus.ended(pod):
        return None
    try:
        value = base64.b64decode((secret_obj.get("data") or {}).get(SECRET_KEY, "")).decode()
    except ValueError:
        return None
    labels = meta.get("labels") or {}
    ann = dict(meta.get("annotations") or {})
    gpus = tuple(g for g in ann.get(ANN_GPUS, "").split(",") if g) or hami.allocated_uuids(ann)
    try:
        created = float(ann.get(ANN_CREATED) or 0.0)
    except ValueError:
        created = 0.0
    return PodRecord(name=name, pool=str(labels.get(LABEL_POOL, "")), secret=value,
                     template=str(labels.get(LABEL_TEMPLATE, "")), created_at=created,
                     ready=podstatus.ReadyRecord.loads(created, ann.get(ANN_READY, "")), uid=podstatus.uid(pod),
                     ip=podstatus.pod_ip(pod), gpus=gpus, annotations=ann, up=True)
