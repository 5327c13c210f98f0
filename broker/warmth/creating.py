"""Pods started and deleted through the backend for the pool controller, as supervised tasks off the claim path.

A create reserves the pod's GPUs (broker.warmth.accounting) and tracks it STARTING on the node placement
chose (broker.warmth.placing); the start runs as a task: a failed one backs the pool off for
2 s and gives the reservation back, a ready one tells the dispatcher. A retire moves the pod to RETIRING
under the tracker lock (only when it is not busy) and deletes it in the background; a deleted pod's
reservation is released.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

from broker.errors import FirepoolError
from broker.fleet.nodes import Fleet
from broker.health.epochs import recorded_epoch
from broker.pods import Origin, Pod, PodState, owner_annotations
from broker.pools import PoolSpec
from broker.ports.backend import Backend, PodInfo, PodRequest
from broker.stats import Stats
from broker.tasks import Supervisor
from broker.warmth import placing
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
    _gang_batches: dict[str, list[str]]
    """Pod name -> the names of its gang's pods created in the same pass (one shared list per gang and pass)."""
    _open_batches: dict[str, list[str]]
    confined: dict[str, str]
    """job -> `node` | `domain` for the waiting confined gangs (the dispatcher's report)."""
    _gang_topologies: dict[str, str]
    """Pod name -> the topology its gang is confined to, as it was when the pod was made."""
    """Gang -> the batch of this pass; closed (cleared) at the end of every pass."""

    def fleet(self) -> Fleet:
        """The backend's nodes with what the tracked pods hold on them (broker.warmth.placing)."""
        return placing.fleet_of(self.backend.nodes(), self.tracker.snapshot(), self.pools, self.avoid())

    def _create(self, spec: PoolSpec, origin: Origin, reserved_for: str | None = None,
                gpus: tuple[str, ...] = (), node: str = "", image: str = "", gang: tuple[str, int] = ("", 1)) -> bool:
        """Reserve the pod's GPUs (own budget first, then borrowed capacity), then start it; False if none fit.

        A standby (`gpus` set) reserves nothing: its group is already counted through the active pod.
        """
        name = f"{spec.name}-{secrets.token_hex(4)}"
        if origin is not Origin.STANDBY and not self._reserve(name, spec):
            return False
        pod = Pod(name, spec.name, gpus, state=PodState.STARTING, origin=origin, template=spec.template_hash,
                  created_at=self.clock.now(), reserved_for=reserved_for, image=image)
        pod.standby = origin is Origin.STANDBY
        pod.node = node
        pod.gang = gang[0]
        self.tracker.add(pod)
        self._gang_sizes[name] = gang[1]
        if gang[0] and reserved_for is not None:
            self._gang_topologies[name] = self.confined.get(reserved_for, "")
        if gang[0]:  # the spawned start runs after this pass ends, when its batch is complete
            batch = self._open_batches.setdefault(gang[0], [])
            batch.append(name)
            self._gang_batches[name] = batch
        self.tasks.spawn(f"create {name}", self._start_pod(pod, spec))
        return True

    def _gang_batch(self, name: str) -> tuple[str, int]:
        """(batch id, pods) of the pod's gang batch: named after its first pod, so unique and a valid name."""
        batch = self._gang_batches.pop(name, [])
        return (batch[0], len(batch)) if batch else ("", 0)

    def where(self, spec: PoolSpec, pods: int) -> list[str]:
        """The node of each of `pods` new pods of the pool, placed as one set ("": the backend chooses)."""
        return placing.where(self.fleet(), spec, pods) if pods > 0 and spec.gpus > 0 else [""] * pods

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
                    gang_batch=self._gang_batch(pod.name),
                    gang_topology=self._gang_topologies.pop(pod.name, ""),
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
