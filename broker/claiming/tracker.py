"""The in-memory pod tracker: every pod indexed by name, pool, caller, session and job behind ONE lock.

A claim finds a job's whole pod set, validates each transition, checks the caller's limits and records
the lease in one step under the lock, so no two claimers take one pod and no caller overruns a quota.
Nothing under the lock does I/O, logs or allocates more than a tuple: it is held for microseconds.
The search order is broker.claiming.searching's (a gang kept on one node: setsearch); a waiting gang's reserved
pods are gangclaims'; team quotas quotaclaims'; the indexes and what a claim asks for and gets are
tracking's (with why `recycle` exists); what happens to a lease's pods after the claim (start, reset,
release, loss, session end) is releasing's. This module takes the pods in and out of the tracker and
makes the claim; the one lock is tracking's, and every pod state change is made under it.

Session continuity. The pod a session's first job runs on is that session's pod from then on, whatever
path it came by. A `recycled` pod (the caller's idle pod of another session) crosses the boundary at the
new session's start: the agent empties the workspace when the session changes and the reset between
jobs is verified as always; at release `begin_reset` makes the new session its owner, so the session's
next jobs find it warm with their files. Pools choose the boundary with `reuse_tag`: `boundary` (the
default, as above), `hint` (the tag only routes: the caller's pod of another tag on the same queue is
taken warm, workspace kept), `retire` (the paper's rule, the "Reuse Off" arm: a pod that crosses a
session boundary runs that one job and retires). Pods never cross callers.

"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from broker.claiming.releasing import Releasing
from broker.claiming.tracking import (
    ASSIGNED,
    IDLE,
    REASON_NEW_SESSION,
    REASON_NEW_SESSION_RETIRE,
    REASON_NO_IDLE,
    REASON_NO_SESSION_POD,
    REASON_QUOTA,
    REASON_SESSION_RESETTING,
    REASON_SINGLE_USE,
    REASON_STANDBY,
    REASON_TAG_HINT,
    REASON_TAKEOVER,
    REASON_TEAM_QUOTA,
    RESETTING,
    RETIRING,
    RUNNING,
    Bucket,
    Claim,
    Lease,
    Pick,
    Shortfall,
    confined,
)
from broker.fleet.quotas import Kind
from broker.pods import Path, Pod, PodState
from broker.pools import PoolSpec

__all__ = [
    "REASON_NEW_SESSION", "REASON_NEW_SESSION_RETIRE", "REASON_NO_IDLE", "REASON_NO_SESSION_POD", "REASON_QUOTA",
    "REASON_SESSION_RESETTING", "REASON_SINGLE_USE", "REASON_STANDBY", "REASON_TAG_HINT", "REASON_TAKEOVER",
    "REASON_TEAM_QUOTA",
    "Claim", "Lease", "Shortfall", "Tracker",
]


class Tracker(Releasing):
    """Pods by name, pool, caller, session and job; one lock over all of it."""

    # ---------------------------------------------------------------- membership

    def add(self, pod: Pod) -> None:
        """Track a new pod (STARTING, or IDLE when recovery restores it).

        A standby restored by recovery fails closed: its card takes no promotion until `verify_cards`.
        """
        with self._lock:
            if pod.name in self.pods:
                raise ValueError(f"pod {pod.name} is already tracked")
            self.pods[pod.name] = pod
            if not pod.standby and (bucket := self._buckets.get(pod.pool)) is not None:
                bucket.physical += 1
                if pod.state is PodState.STARTING:
                    bucket.starting += 1
            if pod.state is IDLE:
                if pod.standby:
                    self._unverified.update(pod.gpus)
                self._index_idle(pod)

    def unverified_cards(self) -> set[str]:
        """Cards whose standbys wait for an exclusivity sweep (after a restart)."""
        with self._lock:
            return set(self._unverified)

    def verify_cards(self, keys: Iterable[str]) -> None:
        """A sweep found these cards shared only by their Firepool group: promotions may resume."""
        with self._lock:
            self._unverified.difference_update(keys)

    def ready(self, name: str, now: float, gpus: tuple[str, ...] = (), node: str = "") -> bool:
        """STARTING -> IDLE with the devices (and node) the backend bound; False when it is no longer starting."""
        with self._lock:
            pod = self.pods.get(name)
            if pod is None or pod.state is not PodState.STARTING:
                return False
            pod.gpus = gpus
            pod.node = node or pod.node
            self._started(pod)
            pod.move(IDLE)
            pod.idle_since = now
            self._index_idle(pod)
            return True

    def retire(self, name: str, *, only_if_idle_since: float | None = None) -> Pod | None:
        """Move a pod to RETIRING (from STARTING, IDLE or RESETTING); None when it is busy or gone.

        With `only_if_idle_since`, retire only if the pod is still idle since that time (the
        controller decided on a snapshot without the lock; a claim since then wins).
        """
        with self._lock:
            pod = self.pods.get(name)
            if pod is None or pod.state in (ASSIGNED, RUNNING, RETIRING):
                return None
            if only_if_idle_since is not None and (pod.state is not IDLE or pod.idle_since != only_if_idle_since):
                return None
            if pod.state is IDLE:
                self._unindex_idle(pod)
            elif pod.state is PodState.STARTING:
                self._started(pod)
            verified = pod.state is not RESETTING
            pod.move(RETIRING)
            if verified:
                self._leave_gate(pod)
            return pod

    def remove(self, name: str) -> None:
        """RETIRING -> GONE: the backend deleted it (and with it any process it still had)."""
        with self._lock:
            pod = self.pods.pop(name, None)
            if pod is not None:
                if pod.state is PodState.STARTING:
                    self._started(pod)
                pod.move(PodState.GONE)
                self._leave_gate(pod)
                if not pod.standby and (bucket := self._buckets.get(pod.pool)) is not None:
                    bucket.physical -= 1

    # ---------------------------------------------------------------- claim path

    def claim(self, want: Claim, now: float) -> Lease | Shortfall:
        """Take the job's whole pod set, or nothing. The one step under the lock."""
        with self._lock:
            bucket = self._buckets.get(want.pool)
            if bucket is None:
                return Shortfall(f"unknown pool {want.pool}", 0)
            if self._limits and self._over_limit(want, bucket.spec.gpus):
                return Shortfall(REASON_QUOTA, want.pods)
            borrowed = False
            if self._quotas is not None and bucket.spec.gpus:
                verdict = self._quotas.classify(want.caller, want.pods * bucket.spec.gpus, want.preemptible,
                                                self._quota_use)
                if verdict.kind is Kind.REFUSED:
                    return Shortfall(verdict.reason, want.pods)
                borrowed = verdict.kind is Kind.BORROWED  # broker.claiming.quotaclaims
            picked: Sequence[Pick] | Shortfall | None = None
            if want.image:
                picked = self._pick_image(bucket, want)
                if isinstance(picked, Shortfall):
                    return picked  # never a shared pod, nor a gang's (no backfill)
            elif want.single_use:
                picked = self._pick_reserved(want)
            elif want.pods == 1 and (own := bucket.by_key.get((want.caller, want.queue, want.tag))):
                # Fast path: the session's own idle pod, the common case of a warm loop.
                gate = self._gate
                for pod in reversed(own.values()):
                    if not gate or self._gate_open(pod):
                        picked = ((pod, Path.WARM, None),)
                        break
            if picked is None and self._returning_keys:
                picked = self._session_pod_resetting(want)
            where = "" if want.pods == 1 or want.single_use or want.image else \
                confined(want.topology, bucket.spec, want.pods)  # broker.claiming.setsearch
            if picked is None:
                gang = self._gangs and want.job_id in self._reserved
                picked = self._pick_set(bucket, want, where) if where else \
                    self._pick_gang(bucket, want) if gang else self._pick(bucket, want)
            if isinstance(picked, Shortfall) and self._gangs and not where:  # a confined set takes no other's pods
                picked = self._backfill(want, picked)
            if isinstance(picked, Shortfall):
                return picked
            if self._taken:
                picked = self._tell_taken(want, picked)
            job_id = want.job_id
            claimed = self._claimed
            for pod, path, reason in picked:
                if pod.state is IDLE:
                    self._unindex_idle(pod)
                for g in pod.gpus:
                    claimed[g] = pod.name
                pod.move(ASSIGNED)
                pod.job = job_id
                pod.path = path
                pod.reason = reason
                if pod.image:
                    pod.reserved_for = None  # its job took it: from now on it is its caller's (or it retires)
                if path is Path.RECYCLED:
                    if bucket.retire:
                        pod.retire = True  # reuse_tag: retire, the paper's rule: one job across a boundary
                    if reason is REASON_TAKEOVER and pod.key is not None:
                        self._note_taken(pod.key, want.tag)
            if where:
                self._settle_set(want, picked)
            elif self._gangs:
                self._settle(want, picked)
            n = len(picked)
            lease = Lease(job_id, want.caller, tuple(p[0] for p in picked), n * bucket.spec.gpus, borrowed)
            self._leases[job_id] = lease
            if self._quotas is not None:
                self._use_quota(lease)
            usage = self._usage.get(want.caller)
            if usage is None:
                self._usage[want.caller] = [lease.gpus, n]
            else:
                usage[0] += lease.gpus
                usage[1] += n
            return lease

    def _started(self, pod: Pod) -> None:
        """A pod leaves STARTING (ready, retired or gone): one fewer coming for its pool."""
        if not pod.standby and (bucket := self._buckets.get(pod.pool)) is not None:
            bucket.starting -= 1

    def _tell_taken(self, want: Claim, picked: Sequence[Pick]) -> Sequence[Pick]:
        """A session whose pod a takeover took: its first claim since records why it did not run warm there."""
        note = self._taken.pop((want.caller, want.queue, want.tag), None)
        if note is None:
            return picked
        return [(pod, path, reason if reason is None else f"{note}; {reason}") for pod, path, reason in picked]

    def reserve(self, pod: Pod, job_id: str) -> None:
        """Mark a STARTING pod as created for one single-use job."""
        with self._lock:
            pod.reserved_for = job_id

    # ---------------------------------------------------------------- recovery

    def adopt_running(self, job_id: str, names: Iterable[str], caller: str) -> None:
        """Recovery: re-attach a live attempt's pods (IDLE -> ASSIGNED -> RUNNING) without a claim."""
        with self._lock:
            pods = tuple(self.pods[n] for n in names)
            for pod in pods:
                if pod.state is IDLE:
                    self._unindex_idle(pod)
                pod.move(ASSIGNED)
                pod.move(RUNNING)
                pod.job = job_id
                pod.used = True
                for g in pod.gpus:
                    self._gate[g] = pod.name
            lease = Lease(job_id, caller, pods, sum(len(p.gpus) for p in pods))
            if self._quotas is not None:
                self._adopt_quota(lease)
            self._leases[job_id] = lease
            usage = self._usage.setdefault(caller, [0, 0])
            usage[0] += lease.gpus
            usage[1] += len(pods)

    # ---------------------------------------------------------------- views

    def snapshot(self) -> list[Pod]:
        """All tracked pods (a list copy; fields may move on, re-check under the lock before acting)."""
        return list(self.pods.values())

    def pods_of(self, job_id: str) -> tuple[Pod, ...]:
        lease = self._leases.get(job_id)
        return lease.pods if lease else ()

    def usage(self, caller: str) -> tuple[int, int]:
        """(gpus, pods) the caller's assigned and running jobs hold."""
        held = self._usage.get(caller)
        return (held[0], held[1]) if held else (0, 0)

    def pool(self, name: str) -> PoolSpec | None:
        bucket = self._buckets.get(name)
        return bucket.spec if bucket else None

    def update_pools(self, pools: Mapping[str, PoolSpec]) -> None:
        """Apply a changed catalog (new pools appear; changed specs take effect on the next claim)."""
        with self._lock:
            for name, spec in pools.items():
                bucket = self._buckets.get(name)
                if bucket is None:
                    self._buckets[name] = Bucket(spec)
                else:
                    bucket.respec(spec)
