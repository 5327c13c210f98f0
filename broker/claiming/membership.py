"""Pods in and out of the tracker: a new pod, one that became ready, one retired, one the backend deleted.

Each method takes the tracker's one lock (the state's) and keeps the pool's counts (`physical`, `starting`) and the
idle indexes right; broker.claiming.tracker composes this with the claim rules and exposes the same methods.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.claiming.tracking import ASSIGNED, IDLE, RESETTING, RETIRING, RUNNING, TrackerState
from broker.pods import Pod, PodState


class Membership:
    """The tracked pods' comings and goings over the tracker's state."""

    __slots__ = ("state",)

    def __init__(self, state: TrackerState) -> None:
        self.state = state

    def add(self, pod: Pod) -> None:
        """Track a new pod (STARTING, or IDLE when recovery restores it).

        A standby restored by recovery fails closed: its card takes no promotion until `verify_cards`.
        """
        s = self.state
        with s.lock:
            if pod.name in s.pods:
                raise ValueError(f"pod {pod.name} is already tracked")
            s.pods[pod.name] = pod
            if not pod.standby and (bucket := s.buckets.get(pod.pool)) is not None:
                bucket.physical += 1
                if pod.state is PodState.STARTING:
                    bucket.starting += 1
            if pod.state is IDLE:
                if pod.standby:
                    s.unverified.update(pod.gpus)
                s.index_idle(pod)

    def unverified_cards(self) -> set[str]:
        """Cards whose standbys wait for an exclusivity sweep (after a restart)."""
        s = self.state
        with s.lock:
            return set(s.unverified)

    def verify_cards(self, keys: Iterable[str]) -> None:
        """A sweep found these cards shared only by their Firepool group: promotions may resume."""
        s = self.state
        with s.lock:
            s.unverified.difference_update(keys)

    def ready(self, name: str, now: float, gpus: tuple[str, ...] = (), node: str = "") -> bool:
        """STARTING -> IDLE with the devices (and node) the backend bound; False when it is no longer starting."""
        s = self.state
        with s.lock:
            pod = s.pods.get(name)
            if pod is None or pod.state is not PodState.STARTING:
                return False
            pod.gpus = gpus
            pod.node = node or pod.node
            self._started(pod)
            pod.move(IDLE)
            pod.idle_since = now
            s.index_idle(pod)
            return True

    def retire(self, name: str, *, only_if_idle_since: float | None = None) -> Pod | None:
        """Move a pod to RETIRING (from STARTING, IDLE or RESETTING); None when it is busy or gone.

        With `only_if_idle_since`, retire only if the pod is still idle since that time (the
        controller decided on a snapshot without the lock; a claim since then wins).
        """
        s = self.state
        with s.lock:
            pod = s.pods.get(name)
            if pod is None or pod.state in (ASSIGNED, RUNNING, RETIRING):
                return None
            if only_if_idle_since is not None and (pod.state is not IDLE or pod.idle_since != only_if_idle_since):
                return None
            if pod.state is IDLE:
                s.unindex_idle(pod)
            elif pod.state is PodState.STARTING:
                self._started(pod)
            verified = pod.state is not RESETTING
            pod.move(RETIRING)
            if verified:
                s.leave_gate(pod)
            return pod

    def remove(self, name: str) -> None:
        """RETIRING -> GONE: the backend deleted it (and with it any process it still had)."""
        s = self.state
        with s.lock:
            pod = s.pods.pop(name, None)
            if pod is not None:
                if pod.state is PodState.STARTING:
                    self._started(pod)
                pod.move(PodState.GONE)
                s.leave_gate(pod)
                if not pod.standby and (bucket := s.buckets.get(pod.pool)) is not None:
                    bucket.physical -= 1

    def _started(self, pod: Pod) -> None:
        """A pod leaves STARTING (ready, retired or gone): one fewer coming for its pool."""
        s = self.state
        if not pod.standby and (bucket := s.buckets.get(pod.pool)) is not None:
            bucket.starting -= 1
