"""Volcano gangs: one PodGroup per batch of a gang's pods, so the Volcano scheduler binds all or none.

Annotations alone (a group name on each pod) do not make a gang at Volcano: without a PodGroup whose
`minMember` counts the batch, Volcano makes a group of one per pod and binds each as it fits, and a part of a
gang holds cards while it waits for the rest (two half-placed gangs deadlock). So for a pool whose template
sends pods to the `volcano` scheduler, the backend creates `PodGroup <batch>` (minMember = the pods of the
batch, queue = the template's `queue`) before the batch's first pod, each pod names it in
`scheduling.k8s.io/group-name`, and the PodGroup is deleted once the last of its pods is gone (a restarted
broker deletes the groups none of its pods names).

A batch is the gang's pods the scaler created in one pass (broker.warmth): fewer than the world size when warm
pods serve the rest, since a group that counts pods never made would wait for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from broker.backends.kubernetes.manifests import LABEL_BROKER, LABEL_GANG, LABEL_POOL
from broker.backends.kubernetes.ratelimit import Retryable
from broker.errors import BackendError

log = logging.getLogger("firepool.k8s")

SCHEDULER = "volcano"
GROUP = "scheduling.volcano.sh"
VERSION = "v1beta1"
PLURAL = "podgroups"
GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""The pod's PodGroup (Volcano reads this key)."""
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
"""The queue of a pod outside any gang (Volcano makes it a group of one in that queue)."""
DEFAULT_QUEUE = "default"


def uses_volcano(scheduler: str) -> bool:
    """A pool's pods go to the Volcano scheduler (the template's `schedulerName`, as the volcano overlay sets)."""
    return scheduler == SCHEDULER


def batch_group(batch: tuple[str, int], scheduler: str) -> str:
    """The PodGroup of a pod of this gang batch (`PodRequest.gang_batch`): "" off Volcano or for a batch of one."""
    first, members = batch
    return f"{first}-gang" if first and members > 1 and uses_volcano(scheduler) else ""


def pod_annotations(group: str, queue: str) -> dict[str, str]:
    """What a Volcano pool's pod carries: its gang's group, or (outside a gang) its queue."""
    return {GROUP_ANNOTATION: group} if group else {QUEUE_ANNOTATION: queue}


def podgroup_manifest(name: str, members: int, queue: str, pod_labels: Mapping[str, str]) -> dict[str, Any]:
    """The PodGroup of one batch, labelled with its pods' broker, pool and gang (a restarted broker finds
    strays by the broker label)."""
    labels = {k: v for k, v in pod_labels.items() if k in (LABEL_BROKER, LABEL_POOL, LABEL_GANG)}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup",
            "metadata": {"name": name, "labels": labels},
            "spec": {"minMember": members, "queue": queue}}


class CustomObjects(Protocol):
    """The custom-object calls of `kubeapi.KubeApi` this module makes."""

    async def create_custom(self, group: str, version: str, plural: str,
                            body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def delete_custom(self, group: str, version: str, plural: str, name: str) -> bool: ...

    async def list_custom(self, group: str, version: str, plural: str, selector: str) -> list[dict[str, Any]]: ...


class PodGroups:
    """The PodGroups this backend made and which of its pods each still has."""

    def __init__(self, api: CustomObjects) -> None:
        self.api = api
        self._members: dict[str, set[str]] = {}
        self._made: dict[str, asyncio.Future[None]] = {}

    def members(self, group: str) -> frozenset[str]:
        return frozenset(self._members.get(group, ()))

    async def join(self, pod: str, manifest: Mapping[str, Any]) -> None:
        """Make sure the group exists (once per group, however many of its pods start together), then count
        `pod` in it; raises BackendError when the group cannot be made."""
        group = str(manifest["metadata"]["name"])
        self._members.setdefault(group, set()).add(pod)
        made = self._made.get(group)
        if made is None or (made.done() and (made.cancelled() or made.exception() is not None)):
            made = self._made[group] = asyncio.get_running_loop().create_task(self._make(manifest),
                                                                              name=f"podgroup {group}")
        await asyncio.shield(made)

    async def _make(self, manifest: Mapping[str, Any]) -> None:
        try:
            await self.api.create_custom(GROUP, VERSION, PLURAL, manifest)
        except BackendError as exc:
            if (exc.details or {}).get("status") != 409:  # already there (a retry, or a broker before a restart)
                raise

    def adopt(self, pod: str, group: str) -> None:
        """A running pod of a previous broker names this group: it exists and is kept while the pod lives."""
        self._members.setdefault(group, set()).add(pod)
        if group not in self._made:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            self._made[group] = done

    async def leave(self, pod: str, group: str) -> None:
        """`pod` is gone: the group goes with its last pod."""
        members = self._members.get(group)
        if members is None:
            return
        members.discard(pod)
        if members:
            return
        del self._members[group]
        made = self._made.pop(group, None)
        if made is not None and not made.done():
            with contextlib.suppress(BackendError, Retryable, asyncio.CancelledError):
                await made
        await self.remove(group)

    async def remove(self, group: str) -> None:
        try:
            await self.api.delete_custom(GROUP, VERSION, PLURAL, group)
        except (BackendError, Retryable) as exc:
            log.warning("deleting podgroup %s failed: %s", group, exc)

    async def sweep(self, selector: str) -> None:
        """Delete the broker's PodGroups (`selector`) no pod of it names any more: their pods went while no
        broker ran (restart recovery, after every live pod was adopted)."""
        try:
            groups = await self.api.list_custom(GROUP, VERSION, PLURAL, selector)
        except BackendError as exc:
            if exc.status == 404:
                return  # no Volcano on this cluster (the PodGroup kind is not served)
            log.warning("listing podgroups failed (strays stay until the next restart): %s", exc)
            return
        except Retryable as exc:
            log.warning("listing podgroups failed (strays stay until the next restart): %s", exc)
            return
        for obj in groups:
            group = str((obj.get("metadata") or {}).get("name", ""))
            if group and not self._members.get(group):
                await self.remove(group)
