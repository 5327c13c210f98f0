"""The in-memory pod tracker: every pod indexed by name, pool, caller, session and job behind ONE lock.

A claim finds a job's whole pod set, validates each transition, checks the caller's limits and records
the lease in one step under the lock, so no two claimers take one pod and no caller overruns a quota.
Nothing under the lock does I/O, logs or allocates more than a tuple: it is held for microseconds.
The search order is broker.claiming.searching's (a gang kept on one node: setsearch); a waiting gang's reserved
pods are gangclaims'; team quotas quotaclaims'; the indexes and what a claim asks for and gets are
tracking's (with why `recycle` exists); what happens to a lease's pods after the claim (start, reset,
release, loss, session end) is releasing's. Those rules are small objects over the one state value
(tracking's `TrackerState`), composed here, and import one way: data types at the bottom, the rules above,
this module on top. Pods come and go through membership's; this module makes the claim. The one lock is the
state's, and every pod state change is made under it.

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

from collections.abc import Collection, Iterable, Mapping, Sequence

from broker.claiming.gangclaims import GangClaims
from broker.claiming.membership import Membership
from broker.claiming.quotaclaims import QuotaClaims
from broker.claiming.releasing import Releasing
from broker.claiming.reserving import Estimate, Reservation
from broker.claiming.searching import Search
from broker.claiming.setsearch import SetSearch
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
    RUNNING,
    Bucket,
    Claim,
    Lease,
    Pick,
    Shortfall,
    TrackerState,
    confined,
)
from broker.fleet.quotas import Kind, QuotasSpec, Verdict
from broker.pods import Path, Pod, SessionKey
from broker.pools import CallerLimits, PoolSpec

__all__ = [
    "REASON_NEW_SESSION", "REASON_NEW_SESSION_RETIRE", "REASON_NO_IDLE", "REASON_NO_SESSION_POD", "REASON_QUOTA",
    "REASON_SESSION_RESETTING", "REASON_SINGLE_USE", "REASON_STANDBY", "REASON_TAG_HINT", "REASON_TAKEOVER",
    "REASON_TEAM_QUOTA",
    "Claim", "Lease", "Shortfall", "Tracker",
]


class Tracker:
    """Pods by name, pool, caller, session and job; one lock over all of it.

    The state is one value (`state`, broker.claiming.tracking); the search, confined-set, gang, quota and release
    rules are small objects over it, and the methods below that are not the claim itself or pod membership hand
    over to them under the same lock."""

    __slots__ = ("state", "pods", "_members", "_search", "_sets", "_gang_rules", "_quota_rules", "_releasing")

    def __init__(self, pools: Mapping[str, PoolSpec], limits: Mapping[str, CallerLimits] | None = None,
                 quotas: QuotasSpec | None = None) -> None:
        self.state = TrackerState(pools, limits, quotas)
        self.pods = self.state.pods
        """Every tracked pod by name (the state's dict itself: read it, change it under the lock only)."""
        self._members = Membership(self.state)
        self._search = Search(self.state)
        self._sets = SetSearch(self.state)
        self._gang_rules = GangClaims(self.state, self._search)
        self._quota_rules = QuotaClaims(self.state)
        self._releasing = Releasing(self.state, self._gang_rules.makes_room)

    @property
    def queued_sessions(self) -> frozenset[SessionKey]:
        """Sessions with a job in the queue (the dispatcher sets it each pass; see TrackerState)."""
        return self.state.queued_sessions

    @queued_sessions.setter
    def queued_sessions(self, sessions: frozenset[SessionKey]) -> None:
        self.state.queued_sessions = sessions

    @property
    def budget_full(self) -> frozenset[str]:
        """Pools whose accelerator budget allows no new pod (the pool controller sets it each pass)."""
        return self.state.budget_full

    @budget_full.setter
    def budget_full(self, pools: frozenset[str]) -> None:
        self.state.budget_full = pools

    # ---------------------------------------------------------------- membership (broker.claiming.membership)

    def add(self, pod: Pod) -> None:
        """Track a new pod (STARTING, or IDLE when recovery restores it)."""
        self._members.add(pod)

    def unverified_cards(self) -> set[str]:
        """Cards whose standbys wait for an exclusivity sweep (after a restart)."""
        return self._members.unverified_cards()

    def verify_cards(self, keys: Iterable[str]) -> None:
        """A sweep found these cards shared only by their Firepool group: promotions may resume."""
        self._members.verify_cards(keys)

    def ready(self, name: str, now: float, gpus: tuple[str, ...] = (), node: str = "") -> bool:
        """STARTING -> IDLE with the devices (and node) the backend bound; False when it is no longer starting."""
        return self._members.ready(name, now, gpus, node)

    def retire(self, name: str, *, only_if_idle_since: float | None = None) -> Pod | None:
        """Move a pod to RETIRING (from STARTING, IDLE or RESETTING); None when it is busy or gone."""
        return self._members.retire(name, only_if_idle_since=only_if_idle_since)

    def remove(self, name: str) -> None:
        """RETIRING -> GONE: the backend deleted it (and with it any process it still had)."""
        self._members.remove(name)

    # ---------------------------------------------------------------- claim path

    def claim(self, want: Claim, now: float) -> Lease | Shortfall:
        """Take the job's whole pod set, or nothing. The one step under the lock."""
        s = self.state
        with s.lock:
            bucket = s.buckets.get(want.pool)
            if bucket is None:
                return Shortfall(f"unknown pool {want.pool}", 0)
            if s.limits and self._search.over_limit(want, bucket.spec.gpus):
                return Shortfall(REASON_QUOTA, want.pods)
            borrowed = False
            if s.quotas is not None and bucket.spec.gpus:
                verdict = s.quotas.classify(want.caller, want.pods * bucket.spec.gpus, want.preemptible,
                                                s.quota_use)
                if verdict.kind is Kind.REFUSED:
                    return Shortfall(verdict.reason, want.pods)
                borrowed = verdict.kind is Kind.BORROWED  # broker.claiming.quotaclaims
            picked: Sequence[Pick] | Shortfall | None = None
            if want.image:
                picked = self._search.pick_image(bucket, want)
                if isinstance(picked, Shortfall):
                    return picked  # never a shared pod, nor a gang's (no backfill)
            elif want.single_use:
                picked = self._search.pick_reserved(want)
            elif want.pods == 1 and (own := bucket.by_key.get((want.caller, want.queue, want.tag))):
                # Fast path: the session's own idle pod, the common case of a warm loop.
                gate = s.gate
                for pod in reversed(own.values()):
                    if not gate or s.gate_open(pod):
                        picked = ((pod, Path.WARM, None),)
                        break
            if picked is None and s.returning_keys:
                picked = self._search.session_pod_resetting(want)
            where = "" if want.pods == 1 or want.single_use or want.image else \
                confined(want.topology, bucket.spec, want.pods)  # broker.claiming.setsearch
            if picked is None:
                gang = s.gangs and want.job_id in s.reserved
                picked = self._sets.pick_set(bucket, want, where) if where else \
                    self._gang_rules.pick_gang(bucket, want) if gang else self._search.pick(bucket, want)
            if isinstance(picked, Shortfall) and s.gangs and not where:  # a confined set takes no other's pods
                picked = self._gang_rules.backfill(want, picked)
            if isinstance(picked, Shortfall):
                return picked
            if s.taken:
                picked = self._tell_taken(want, picked)
            job_id = want.job_id
            claimed = s.claimed
            for pod, path, reason in picked:
                if pod.state is IDLE:
                    s.unindex_idle(pod)
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
                        s.note_taken(pod.key, want.tag)
            if where:
                self._sets.settle_set(want, picked)
            elif s.gangs:
                self._gang_rules.settle(want, picked)
            n = len(picked)
            lease = Lease(job_id, want.caller, tuple(p[0] for p in picked), n * bucket.spec.gpus, borrowed)
            s.leases[job_id] = lease
            if s.quotas is not None:
                self._quota_rules.use_quota(lease)
            usage = s.usage.get(want.caller)
            if usage is None:
                s.usage[want.caller] = [lease.gpus, n]
            else:
                usage[0] += lease.gpus
                usage[1] += n
            return lease

    def _tell_taken(self, want: Claim, picked: Sequence[Pick]) -> Sequence[Pick]:
        """A session whose pod a takeover took: its first claim since records why it did not run warm there."""
        s = self.state
        note = s.taken.pop((want.caller, want.queue, want.tag), None)
        if note is None:
            return picked
        return [(pod, path, reason if reason is None else f"{note}; {reason}") for pod, path, reason in picked]

    def reserve(self, pod: Pod, job_id: str) -> None:
        """Mark a STARTING pod as created for one single-use job."""
        s = self.state
        with s.lock:
            pod.reserved_for = job_id

    # ---------------------------------------------------------------- recovery

    def adopt_running(self, job_id: str, names: Iterable[str], caller: str) -> None:
        """Recovery: re-attach a live attempt's pods (IDLE -> ASSIGNED -> RUNNING) without a claim."""
        s = self.state
        with s.lock:
            pods = tuple(s.pods[n] for n in names)
            for pod in pods:
                if pod.state is IDLE:
                    s.unindex_idle(pod)
                pod.move(ASSIGNED)
                pod.move(RUNNING)
                pod.job = job_id
                pod.used = True
                for g in pod.gpus:
                    s.gate[g] = pod.name
            lease = Lease(job_id, caller, pods, sum(len(p.gpus) for p in pods))
            if s.quotas is not None:
                self._quota_rules.adopt_quota(lease)
            s.leases[job_id] = lease
            usage = s.usage.setdefault(caller, [0, 0])
            usage[0] += lease.gpus
            usage[1] += len(pods)

    # ---------------------------------------------------------------- views

    def snapshot(self) -> list[Pod]:
        """All tracked pods (a list copy; fields may move on, re-check under the lock before acting)."""
        s = self.state
        return list(s.pods.values())

    def pods_of(self, job_id: str) -> tuple[Pod, ...]:
        s = self.state
        lease = s.leases.get(job_id)
        return lease.pods if lease else ()

    def usage(self, caller: str) -> tuple[int, int]:
        """(gpus, pods) the caller's assigned and running jobs hold."""
        s = self.state
        held = s.usage.get(caller)
        return (held[0], held[1]) if held else (0, 0)

    def pool(self, name: str) -> PoolSpec | None:
        s = self.state
        bucket = s.buckets.get(name)
        return bucket.spec if bucket else None

    def update_pools(self, pools: Mapping[str, PoolSpec]) -> None:
        """Apply a changed catalog (new pools appear; changed specs take effect on the next claim)."""
        s = self.state
        with s.lock:
            for name, spec in pools.items():
                bucket = s.buckets.get(name)
                if bucket is None:
                    s.buckets[name] = Bucket(spec)
                else:
                    bucket.respec(spec)

    # ---------------------------------------------------------------- confined sets (broker.claiming.setsearch)

    def set_domains(self, domains: Mapping[str, str]) -> None:
        """node id -> topology domain, as the backend reports nodes (no lock: one reference swap)."""
        self._sets.set_domains(domains)

    def unreserve(self, pods: Iterable[Pod]) -> None:
        """Pods made for a confined set whose job no longer waits join the pool as never-used pods."""
        self._sets.unreserve(pods)

    # ---------------------------------------------------------------- gang reservations (broker.claiming.gangclaims)

    def reserve_gang(self, res: Reservation) -> bool:
        """Give a waiting gang a reservation; False when it has one already."""
        return self._gang_rules.reserve_gang(res)

    def drop_reservation(self, job_id: str, pool: str) -> None:
        """The gang left the queue: its pods go back to the pool, or to the next gang."""
        self._gang_rules.drop_reservation(job_id, pool)

    def reservations(self, pool: str) -> list[tuple[Reservation, int]]:
        """The pool's reservations in order, each with how many pods it holds."""
        return self._gang_rules.reservations(pool)

    def reserved_count(self, job_id: str) -> int:
        """Pods set aside for this job (a reserved gang, or a single-use job's own pods)."""
        return self._gang_rules.reserved_count(job_id)

    def reserved_pools(self) -> list[str]:
        return self._gang_rules.reserved_pools()

    def age_reservation(self, pool: str, job_id: str, fills: int) -> None:
        """R2 aging: the reservation ranks higher per failed fill."""
        self._gang_rules.age_reservation(pool, job_id, fills)

    def mark_alerted(self, pool: str, job_id: str) -> bool:
        """Record that the reservation's capacity alert went out; False when it had already."""
        return self._gang_rules.mark_alerted(pool, job_id)

    def apply_estimates(self, pool: str, estimates: Iterable[Estimate]) -> None:
        """Record the dispatcher's fill-time and room estimates (computed outside the lock)."""
        self._gang_rules.apply_estimates(pool, estimates)

    # ---------------------------------------------------------------- team quotas (broker.claiming.quotaclaims)

    def set_quotas(self, quotas: QuotasSpec | None) -> None:
        """A catalog reload: swap the quota tree and recount the running leases under it."""
        self._quota_rules.set_quotas(quotas)

    def leases(self) -> list[Lease]:
        """Every claimed pod set (a list copy), for the preemption decision outside the lock."""
        return self._quota_rules.leases()

    def quota_verdict(self, caller: str, gpus: int, preemptible: bool) -> Verdict | None:
        """How a job of `gpus` would be placed by quota now; None without quotas."""
        return self._quota_rules.quota_verdict(caller, gpus, preemptible)

    def reclaim(self, job_id: str, caller: str, gpus: int) -> None:
        """A queued in-quota job preempted borrowers: its GPUs stop being lendable until it is placed or leaves."""
        self._quota_rules.reclaim(job_id, caller, gpus)

    def drop_reclaim(self, job_id: str) -> None:
        """The job left the queue without being placed."""
        self._quota_rules.drop_reclaim(job_id)

    def quota_view(self) -> dict[str, dict[str, int]]:
        """GPUs held in quota per quota node and borrowed per team."""
        return self._quota_rules.quota_view()

    # ---------------------------------------------------------------- after the claim (broker.claiming.releasing)

    def unclaim(self, job_id: str, now: float) -> None:
        """ASSIGNED -> IDLE: the binding did not commit, so no user code ran."""
        self._releasing.unclaim(job_id, now)

    def start(self, job_id: str) -> bool:
        """ASSIGNED -> RUNNING through the per-GPU gate; False (nothing changes) while another pod runs there."""
        return self._releasing.start(job_id)

    def begin_reset(self, job_id: str, key: SessionKey) -> tuple[Pod, ...]:
        """RUNNING (or ASSIGNED) -> RESETTING for every pod of the job; `key` becomes the owner."""
        return self._releasing.begin_reset(job_id, key)

    def finish_reset(self, name: str, clean: bool, now: float, hold_seconds: float) -> bool:
        """RESETTING -> IDLE held for its owner when clean and reusable, else RETIRING; True when it went back."""
        return self._releasing.finish_reset(name, clean, now, hold_seconds)

    def release(self, job_id: str, key: SessionKey, now: float, hold_seconds: float) -> None:
        """begin_reset + a clean finish_reset in one step, for resets known to be clean (fakes, benchmarks)."""
        self._releasing.release(job_id, key, now, hold_seconds)

    def lost(self, name: str) -> Pod | None:
        """A pod vanished or its agent stays unreachable: RETIRING from any live state."""
        return self._releasing.lost(name)

    def retire_at_release(self, name: str) -> bool:
        """Mark a busy pod to retire when its job ends; False when it is not busy."""
        return self._releasing.retire_at_release(name)

    def end_session(self, key: SessionKey, jobs: Collection[str] = ()) -> tuple[list[str], list[str]]:
        """A caller ended a session: (its idle pods retired now, its busy ones retiring at release)."""
        return self._releasing.end_session(key, jobs)
