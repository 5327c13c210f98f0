"""The end of a lease, under the tracker lock: a claim undone, a start through the per-GPU gate, the reset
with proof that hands a pod back to its session (or retires it), lost pods and ended sessions.

Every pod state change after a claim happens here (broker.claiming.tracker does the claim and the pods'
membership); the indexes it updates are broker.claiming.tracking's. The lock is the tracker's one lock:
each public method takes it, the private ones expect it held.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from broker.claiming.tracking import ASSIGNED, IDLE, RESETTING, RETIRING, RUNNING, Lease, TrackerState
from broker.pods import Origin, Pod, PodState, SessionKey


class Releasing:
    """Start, reset, release, loss and session end of the pods a claim took, over the tracker's state.

    `makes_room(pod)` says whether a released pod retires to make room for a waiting gang (broker.claiming.
    gangclaims' rule, passed in so this module needs nothing of it)."""

    __slots__ = ("state", "makes_room")

    def __init__(self, state: TrackerState, makes_room: Callable[[Pod], bool]) -> None:
        self.state = state
        self.makes_room = makes_room

    def unclaim(self, job_id: str, now: float) -> None:
        """ASSIGNED -> IDLE: the binding did not commit, so no user code ran; the pods are untouched."""
        with self.state.lock:
            lease = self.state.leases.pop(job_id, None)
            if lease is None:
                return
            for pod in lease.pods:
                pod.move(IDLE)
                pod.job = None
                pod.retire = False
                self.state.index_idle(pod)
            self.state.unuse(lease)

    def start(self, job_id: str) -> bool:
        """ASSIGNED -> RUNNING, taking each pod's GPUs through the per-GPU gate.

        False (and nothing changes) when another pod still runs on one of the GPUs: at most one pod
        per physical GPU runs a job at a time; the caller retries when that pod's reset is verified.
        """
        with self.state.lock:
            lease = self.state.leases.get(job_id)
            pods = lease.pods if lease else ()
            gate = self.state.gate
            for pod in pods:
                if gate and not self.state.gate_open(pod):
                    return False
            for pod in pods:
                pod.move(RUNNING)
                pod.used = True
                if pod.standby:
                    self.state.buckets[pod.pool].physical += 1  # promoted: it now holds the card's count
                pod.standby = False  # promoted: the card's previous job is verified gone
                for g in pod.gpus:
                    gate[g] = pod.name
            return True

    def begin_reset(self, job_id: str, key: SessionKey) -> tuple[Pod, ...]:
        """RUNNING (or ASSIGNED) -> RESETTING for every pod of the job; `key` becomes the owner."""
        with self.state.lock:
            lease = self.state.leases.pop(job_id, None)
            return self._begin_reset(lease, key) if lease is not None else ()

    def finish_reset(self, name: str, clean: bool, now: float, hold_seconds: float) -> bool:
        """RESETTING -> IDLE held for its owner when clean and reusable; else -> RETIRING.

        Returns True when the pod went back to the pool. The pod leaves the per-GPU gate here,
        after the agent verified that the previous job's processes are gone.
        """
        with self.state.lock:
            pod = self.state.pods.get(name)
            if pod is None or pod.state is not RESETTING:
                return False
            return self._finish_reset(pod, clean, now, hold_seconds)

    def release(self, job_id: str, key: SessionKey, now: float, hold_seconds: float) -> None:
        """begin_reset + a clean finish_reset in one step, for resets known to be clean (fakes, benchmarks)."""
        s = self.state
        with s.lock:
            lease = s.leases.pop(job_id, None)
            if lease is not None:
                for pod in self._begin_reset(lease, key, returning=False):
                    self._finish_reset(pod, True, now, hold_seconds)

    def _begin_reset(self, lease: Lease, key: SessionKey, returning: bool = True) -> tuple[Pod, ...]:
        for pod in lease.pods:
            if pod.state is ASSIGNED:  # the launch never went out; the pod may still be dirty
                pod.move(RUNNING)
            pod.move(RESETTING)
            pod.caller = key[0]
            pod.key = key
            pod.job = None
            if returning and not pod.retire and pod.origin is not Origin.SINGLE_USE and not pod.image:
                self.state.returning[pod.name] = key
                self.state.returning_keys[key] = self.state.returning_keys.get(key, 0) + 1
        self.state.unuse(lease)
        return lease.pods

    def _finish_reset(self, pod: Pod, clean: bool, now: float, hold_seconds: float) -> bool:
        s = self.state
        if s.returning:
            s.returned(pod)
        if pod.gpus and clean:
            # Only a verified reset opens the gate; an unclean pod keeps it until it is deleted.
            s.leave_gate(pod)
        if (
            not clean
            or pod.retire
            or pod.origin is Origin.SINGLE_USE
            or (s.gangs and self.makes_room(pod))
        ):
            pod.move(RETIRING)
            return False
        pod.move(IDLE)
        pod.idle_since = now
        pod.hold_until = now + hold_seconds
        s.index_idle(pod)
        return True

    def lost(self, name: str) -> Pod | None:
        """A pod vanished or its agent stays unreachable: RETIRING from any live state."""
        with self.state.lock:
            pod = self.state.pods.get(name)
            if pod is None or pod.state in (RETIRING, PodState.GONE):
                return None
            if pod.state is IDLE:
                self.state.unindex_idle(pod)
            if pod.state is ASSIGNED:
                pod.move(RUNNING)
            if pod.state is RUNNING:
                pod.move(RESETTING)
            self.state.returned(pod)
            pod.move(RETIRING)  # the gate stays closed until remove(): its processes may still run
            return pod

    def retire_at_release(self, name: str) -> bool:
        """Mark a busy pod to retire when its job ends (drain, preemption); False when it is not busy."""
        with self.state.lock:
            pod = self.state.pods.get(name)
            if pod is None or pod.state not in (ASSIGNED, RUNNING, RESETTING):
                return False
            pod.retire = True
            return True

    def end_session(self, key: SessionKey, jobs: Collection[str] = ()) -> tuple[list[str], list[str]]:
        """A caller ended a session: its idle pods go RETIRING now, its busy ones retire at release.

        A pod matches when it was last used by the session (`key`) or runs one of its `jobs` now.
        Returns (retired now, retiring at release). Pods of other callers never match the key.
        """
        now_retired: list[str] = []
        at_release: list[str] = []
        with self.state.lock:
            for pod in self.state.pods.values():
                if pod.key != key and (pod.job is None or pod.job not in jobs):
                    continue
                if pod.state is IDLE:
                    self.state.unindex_idle(pod)
                    pod.move(RETIRING)
                    self.state.leave_gate(pod)
                    now_retired.append(pod.name)
                elif pod.state in (ASSIGNED, RUNNING, RESETTING):
                    pod.retire = True
                    at_release.append(pod.name)
        return now_retired, at_release
