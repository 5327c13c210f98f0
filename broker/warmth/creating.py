"""Pods started and deleted through the backend for the pool controller, as supervised tasks off the claim path.

The controller's create (broker.warmth.pooling) reserves the pod's GPUs (broker.warmth.accounting) and
tracks it STARTING on the node placement chose; the start runs here: a failed one backs the pool off for
2 s and gives the reservation back, a ready one tells the dispatcher. A retire moves the pod to RETIRING
under the tracker lock (only when it is not busy) and deletes it in the background; a deleted pod's
reservation is released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.errors import FirepoolError
from broker.health.epochs import recorded_epoch
from broker.pods import Pod, owner_annotations
from broker.pools import PoolSpec
from broker.ports.backend import Backend, PodInfo, PodRequest
from broker.stats import Stats
from broker.tasks import Supervisor
from broker.warmth.accounting import Accounting
from broker.warmth.standby import group_key

log = logging.getLogger("firepool.pooling")


class Creating(Accounting):
    """The start/delete half of broker.warmth.pooling.PoolController (a mixin: its state lives there)."""

    backend: Backend
    tasks: Supervisor
    stats: Stats
    on_ready: Callable[[], None]
    wake: Callable[[], None]
    avoid: Callable[[], frozenset[str]]
    created: Callable[[Pod, PodInfo], None] | None
    _backoff_until: dict[str, float]
    _gang_sizes: dict[str, int]

    async def _start_pod(self, pod: Pod, spec: PoolSpec) -> None:
        pin = group_key(pod) if pod.standby else ()
        try:
            # A standby's and a custom image's record is written at create: a restarted broker must never
            # take either for a plain pool pod.
            info = await self.backend.create(
                PodRequest(
                    name=pod.name,
                    pool=spec,
                    origin=pod.origin,
                    gpus=pin,
                    annotations=owner_annotations(pod) if pod.standby or pod.image else {},
                    image=pod.image,
                    node=pod.node,
                    gang=pod.gang,
                    gang_size=self._gang_sizes.pop(pod.name, 1),
                    avoid=self.avoid(),
                )
            )
        except FirepoolError as exc:
            log.warning("creating pod %s failed: %s", pod.name, exc)
            self._backoff_until[spec.name] = self.clock.now() + 2.0
            self.tracker.retire(pod.name)
            self.tracker.remove(pod.name)
            self._release(pod)
            self.wake()  # the next pass sees the backoff and sleeps until it ends, not a whole tick
            return
        self.stats.pods_created[spec.name] += 1
        pod.epoch = str(recorded_epoch(info.details, {}) or "")  # R5: the identity work on it is bound under
        if self.created is not None:
            self.created(pod, info)
        if not self.tracker.ready(pod.name, self.clock.now(), info.gpus, info.node):
            await self._delete(pod.name)  # retired while starting
            return
        self.on_ready()
        self.wake()  # a rollout's next drain waits for this replacement

    def retire(self, name: str, *, only_if_idle_since: float | None = None) -> bool:
        """Retire a pod now (it must not be busy); its deletion runs in the background."""
        if self.tracker.retire(name, only_if_idle_since=only_if_idle_since) is None:
            return False
        self.tasks.spawn(f"delete {name}", self._delete(name))
        return True

    def delete_retiring(self, name: str) -> None:
        """Delete a pod the tracker already moved to RETIRING (unclean reset, lost, single-use)."""
        self.tasks.spawn(f"delete {name}", self._delete(name))

    async def _delete(self, name: str) -> None:
        try:
            await self.backend.delete(name)
        except FirepoolError as exc:
            log.warning("deleting pod %s failed (will be retried by recovery): %s", name, exc)
        pod = self.tracker.pods.get(name)
        self.tracker.remove(name)
        if pod is not None:
            self._release(pod)
            self.stats.pods_deleted[pod.pool] += 1
        self.wake()
