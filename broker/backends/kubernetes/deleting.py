"""Deleting a pod gracefully: the pod's own grace period (SIGTERM, then SIGKILL at its end), and the delete
returns only once the pod object is gone, so its GPUs count as taken (tracker, budgets) until they are free.

A mixin of `KubernetesBackend`: a force delete (grace 0) would remove the object while the container may
still be stopping, and the scheduler would hand its GPU to a new pod too early.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Protocol

from broker.backends.kubernetes import podstatus, volcano
from broker.backends.kubernetes.annotating import Annotator
from broker.backends.kubernetes.kubeapi import KubeApi
from broker.backends.kubernetes.manifests import secret_name
from broker.backends.kubernetes.ratelimit import Retryable, with_backoff
from broker.backends.kubernetes.records import PodRecord
from broker.backends.kubernetes.settings import KubernetesSettings
from broker.backends.kubernetes.watching import PodCache
from broker.clock import Clock
from broker.errors import BackendError
from broker.ports.agent import AgentClient

log = logging.getLogger("firepool.k8s")


class _Backend(Protocol):
    clock: Clock
    api: KubeApi
    cache: PodCache
    settings: KubernetesSettings
    annotator: Annotator
    _task: asyncio.Task[None] | None
    _pods: dict[str, PodRecord]
    _deleting: set[str]
    _vanished: dict[str, asyncio.Event]
    _clients: dict[str, AgentClient]
    podgroups: volcano.PodGroups

    async def _until_gone(self, name: str, vanished: asyncio.Event) -> None: ...


class Deleting:
    """The delete path (mixin)."""

    async def _destroy(self: _Backend, name: str, kinds: Sequence[str] = ("Pod", "Secret")) -> None:
        """Delete the pod and its Secret (and its PodGroup with the group's last pod); idempotent. The pod's
        agent client is closed first. Returns once the pod object is gone (its grace period ended), so its
        GPUs count as taken until they are free."""
        self._deleting.add(name)
        rec = self._pods.get(name)
        group = (rec.annotations if rec is not None else
                 podstatus.meta(self.cache.pods.get(name) or {}).get("annotations") or {}).get(volcano.GROUP_ANNOTATION)
        self.annotator.forget(name)
        vanished = self._vanished.setdefault(name, asyncio.Event())
        try:
            client = self._clients.pop(name, None)
            if client is not None:
                await client.close()
            rate = self.settings.rate
            for kind, obj in (("Pod", name), ("Secret", secret_name(name))):
                try:
                    if kind in kinds:
                        await with_backoff(self.clock, rate, functools.partial(self.api.delete, kind, obj))
                except (Retryable, BackendError) as exc:
                    log.warning("deleting %s %s failed: %s", kind.lower(), obj, exc)
            if "Pod" in kinds:
                await self._until_gone(name, vanished)
            self._pods.pop(name, None)
            if group and "Pod" in kinds:
                await self.podgroups.leave(name, group)
        finally:
            self._deleting.discard(name)
            self._vanished.pop(name, None)

    async def _until_gone(self: _Backend, name: str, vanished: asyncio.Event) -> None:
        """Wait for the watch to see the pod object go: SIGTERM, the grace period, SIGKILL, then removal."""
        pod = self.cache.pods.get(name)
        if pod is None or self._task is None:
            return  # never seen, or already gone; without a watch there is nothing to wait on
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        bound = float(grace if isinstance(grace, int) else 30) + self.settings.delete_wait_s
        if not await self.clock.wait(vanished, bound):
            log.warning("pod %s still there %.0f s after its delete: its GPUs are counted free from now", name,
                        bound)
