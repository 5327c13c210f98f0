"""The tracker's state: what a claim asks for and gets, each pool's idle indexes, and the index upkeep.

Everything here runs with the tracker lock held (broker.claiming.tracker takes it). The state is one value that
the claim rules work on (broker.claiming.searching's search order, setsearch's confined sets, gangclaims' reserved
pods, quotaclaims' quota use, releasing's ends of leases); this module imports none of them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from broker.claiming.reserving import Reservation
from broker.fleet.quotas import QuotasSpec, QuotaTree, QuotaUse
from broker.pods import Origin, Pod, PodState, SessionKey
from broker.pools import CallerLimits, PoolSpec

IDLE = PodState.IDLE
ASSIGNED = PodState.ASSIGNED
RUNNING = PodState.RUNNING
RESETTING = PodState.RESETTING
RETIRING = PodState.RETIRING

REASON_NO_SESSION_POD = "no idle pod of this session"
REASON_NEW_SESSION = ("new session: took the caller's pod of another session (workspace emptied); "
                      "it is this session's pod from now on")
REASON_NEW_SESSION_RETIRE = "new session: ran once on the caller's previous pod, which then retires (reuse_tag: retire)"
REASON_TAG_HINT = "reuse_tag hint: the caller's pod of another tag"
REASON_TAKEOVER = ("pool at its ceiling: took over the caller's least recently used session's pod "
                   "(workspace emptied); it is this session's pod from now on")
TAKEN_NOTES = 4096
"""Sessions whose pod a takeover took that are told so on their next claim, at most (the oldest go first)."""
REASON_NO_IDLE = "no idle pod, no standby: a pod was created"
REASON_SESSION_RESETTING = "the session's pod is resetting"
REASON_SINGLE_USE = "single_use: a pod created for this job"
REASON_STANDBY = "no idle pod: a standby on an active GPU, promoted once the previous job is gone"
REASON_QUOTA = "caller quota"
REASON_TEAM_QUOTA = "team quota"
"""Prefix of a team-quota refusal (broker.fleet.quotas says which node is full and why)."""
REASON_IMAGE_NEW = "custom image: a pod created for this job"
REASON_IMAGE_STARTING = "custom image pod starting"

Pick = tuple[Pod, str, str | None]
"""A picked pod, the acquisition path it got and why a warmer one was not used."""


@dataclass(frozen=True, slots=True)
class Claim:
    """What a job asks the tracker for."""

    job_id: str
    caller: str
    pool: str
    queue: str = "default"
    tag: str = ""
    pods: int = 1
    single_use: bool = False
    since: float = 0.0
    """When the job was submitted: a never-used pod that became ready after it was made for it (`new`)."""
    ends_by: float = math.inf
    """When the job ends at the latest if it starts now (now + timeout_s): may it backfill a reservation?"""
    order: tuple[int, float, str] | None = None
    """The job's dispatch order: a job ahead of a reserved gang may take the gang's pods."""
    recycle: bool = True
    """May take the caller's idle pod of another session before a standby or a new pod; False takes one
    only at the pool's ceiling. A `boundary` pool (Bucket.keeps) treats every claim as False: nothing lost
    below the ceiling (docs/security.md).

    Why both exist: taking another session's idle pod still empties that session's workspace, so whether a
    new session may do it first is the caller's call. `true` suits callers whose sessions follow one another
    (CLI tags, SDK runs, notebooks: a live kernel's pod is busy, never idle); `false` protects sessions that
    live side by side (MCP conversations idle between calls): a standby or a new pod first, and only at the
    pool's ceiling does the least recently used session hand its pod over (a takeover). Either way the pod
    then stays with the new session."""
    preemptible: bool = False
    """The job may run beyond its team's guarantee on borrowed quota, and yield it (broker.fleet.quotas)."""
    image: str = ""
    """A custom image (broker.images): only pods made for this job, or the caller's idle pods of this
    digest-pinned image, serve it."""
    topology: str = ""
    """`node` | `domain` | `any`; empty: the pool's. A gang confined to a node or domain never runs split."""


def confined(topology: str, spec: PoolSpec, pods: int) -> str:
    """`node` or `domain` when a job's pods must stay together (a gang whose own or pool topology says so)."""
    where = topology or spec.topology
    return where if pods > 1 and where != "any" else ""


class Lease:
    """A claimed pod set, in rank order, and what it counts against its caller's limits."""

    __slots__ = ("job_id", "caller", "pods", "gpus", "borrowed")

    def __init__(self, job_id: str, caller: str, pods: tuple[Pod, ...], gpus: int, borrowed: bool = False) -> None:
        self.job_id = job_id
        self.caller = caller
        self.pods = pods
        self.gpus = gpus
        self.borrowed = borrowed
        """Runs beyond its team's guarantee, on quota borrowed from other teams: first to yield."""


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a claim took nothing, and how many of its pods it could not find."""

    reason: str
    missing: int


class Bucket:
    """One pool's idle indexes."""

    __slots__ = ("spec", "fresh", "by_key", "by_caller", "hint", "retire", "keeps", "standby", "physical", "starting",
                 "fresh_by_node", "images")

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.hint = spec.reuse_tag == "hint"
        self.retire = spec.reuse_tag == "retire"
        """The paper's rule: a pod that crosses a session boundary runs one job there, then retires."""
        self.keeps = spec.reuse_tag == "boundary"
        """Nothing lost below the ceiling: another session of the caller empties a live session's idle pod only
        when the pool can neither make nor find another (docs/security.md)."""
        self.fresh: dict[str, Pod] = {}
        """Idle pods no job has used, not reserved."""
        self.fresh_by_node: dict[str, dict[str, Pod]] = {}
        """The same pods by node (pods with a node only): a gang takes its pods from one node when it can."""
        self.by_key: dict[SessionKey, dict[str, Pod]] = {}
        """Idle used pods by the session that used them last."""
        self.by_caller: dict[str, dict[str, Pod]] = {}
        """Idle used pods by their last caller (any session), least recently released first."""
        self.standby: dict[str, Pod] = {}
        """Idle standbys (broker.warmth.standby): claimed only when no owner's or unheld idle pod exists."""
        self.physical = 0
        """Pods of the pool that hold a card's count (not unpromoted standbys): at the ceiling no new pod comes."""
        self.starting = 0
        """Non-standby pods still starting: while one comes, no session's pod is taken over (the job waits)."""
        self.images: dict[tuple[str, str], dict[str, Pod]] = {}
        """Idle pods of a digest-pinned custom image by (caller, image): that caller's jobs of that image only."""

    def respec(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.hint = spec.reuse_tag == "hint"
        self.retire = spec.reuse_tag == "retire"
        self.keeps = spec.reuse_tag == "boundary"

    def recycled_reason(self) -> str:
        return REASON_NEW_SESSION_RETIRE if self.retire else REASON_NEW_SESSION


class TrackerState:
    """The tracker's state as one value: its indexes and their upkeep. Every method here expects the caller to hold
    `lock`; the claim rules (searching, setsearch, gangclaims, quotaclaims, releasing) work on this value."""

    def __init__(self, pools: Mapping[str, PoolSpec], limits: Mapping[str, CallerLimits] | None = None,
                 quotas: QuotasSpec | None = None) -> None:
        self.lock = threading.Lock()
        self.quotas: QuotaTree | None = QuotaTree(quotas) if quotas is not None and quotas.orgs else None
        """Team quotas (None: none configured, and a faster claim)."""
        self.quota_use = QuotaUse()
        self.reclaims: dict[str, tuple[str, int]] = {}
        """job id -> (team key, GPUs) of a queued in-quota job that preempted borrowers, until it is placed."""
        self.buckets: dict[str, Bucket] = {name: Bucket(spec) for name, spec in pools.items()}
        self.limits: dict[str, CallerLimits] = dict(limits or {})
        """Per caller, with `default` for the rest; empty means unlimited (and a faster claim)."""
        self.returning: dict[str, SessionKey] = {}
        """Resetting pods that go back to their session when clean: pod name -> session."""
        self.returning_keys: dict[SessionKey, int] = {}
        """Sessions with pods in `returning`, and how many: their next job waits for them."""
        self.pods: dict[str, Pod] = {}
        self.leases: dict[str, Lease] = {}
        self.reserved: dict[str, list[Pod]] = {}
        """Idle single-use pods by the job they were created for, and idle pods set aside for a gang."""
        self.usage: dict[str, list[int]] = {}
        """caller -> [gpus, pods] held by its assigned and running jobs."""
        self.gate: dict[str, str] = {}
        """GPU key -> the pod running a job on it (the per-GPU gate)."""
        self.claimed: dict[str, str] = {}
        """GPU key -> the pod last claimed on it: the card's latest user, whom a standby's claim avoids crowding
        (broker.claiming.searching); an ASSIGNED pod's job takes the gate only at launch."""
        self.unverified: set[str] = set()
        """GPU keys whose standbys are not promoted until a sweep confirms the card is only this pool's group."""
        self.gangs: dict[str, list[Reservation]] = {}
        """pool -> waiting gangs' reservations in (priority, submit time, id) order; their pods are in `reserved`."""
        self.domains: dict[str, str] = {}
        """node id -> topology domain (broker.claiming.setsearch); replaced whole, never changed in place."""
        self.queued_sessions: frozenset[SessionKey] = frozenset()
        """Sessions with a job in the queue (the dispatcher sets it each pass): their idle pods are theirs to take
        warm, so no other session of the caller recycles or takes them over."""
        self.budget_full: frozenset[str] = frozenset()
        """Pools whose accelerator budget allows no new pod (the pool controller sets it each pass): a ceiling too."""
        self.taken: dict[SessionKey, str] = {}
        """Session -> what its next claim records: its idle pod was taken over by another session of its caller."""

    def full(self, bucket: Bucket) -> bool:
        """The pool can neither make a pod (ceiling, budget) nor expect one (none starting): a session's pod may
        then be taken over."""
        return not bucket.starting and (bucket.physical >= bucket.spec.max_count
                                        or bucket.spec.name in self.budget_full)

    def note_taken(self, victim: SessionKey, tag: str) -> None:
        """A takeover: the victim session's next claim says whose session took its pod (a rare path)."""
        taken = self.taken
        if len(taken) >= TAKEN_NOTES:
            del taken[next(iter(taken))]
        taken[victim] = (f"session {victim[2] or '(untagged)'}'s pod was taken by your session "
                         f"{tag or '(untagged)'} at the pool ceiling")

    def gate_open(self, pod: Pod) -> bool:
        """No other pod runs a job on any of this pod's GPUs."""
        gate = self.gate
        for g in pod.gpus:
            holder = gate.get(g)
            if holder is not None and holder != pod.name:
                return False
        return True

    def leave_gate(self, pod: Pod) -> None:
        for g in pod.gpus:
            if self.gate.get(g) == pod.name:
                del self.gate[g]

    def unuse(self, lease: Lease) -> None:
        usage = self.usage[lease.caller]
        usage[0] -= lease.gpus
        usage[1] -= len(lease.pods)
        if self.quotas is not None and (path := self.quotas.path(lease.caller)) is not None:
            self.quota_use.remove(path, lease.gpus, lease.borrowed)

    def end_reclaim(self, job_id: str) -> None:
        claim = self.reclaims.pop(job_id, None)
        if claim is not None:
            team, gpus = claim
            self.quota_use.reclaiming[team] = self.quota_use.reclaiming.get(team, 0) - gpus

    def returned(self, pod: Pod) -> None:
        """The pod's reset ended (clean or not): its session stops waiting for it."""
        key = self.returning.pop(pod.name, None)
        if key is not None:
            left = self.returning_keys[key] - 1
            if left:
                self.returning_keys[key] = left
            else:
                del self.returning_keys[key]

    def feed(self, pod: Pod) -> None:
        """A never-used pod became idle: it goes to the first reservation of its pool still short of pods."""
        for res in self.gangs.get(pod.pool, ()):
            if len(self.reserved.get(res.job_id, ())) < res.pods:
                pod.reserved_for = res.job_id
                return

    def index_idle(self, pod: Pod) -> None:
        if pod.standby:
            self.buckets[pod.pool].standby[pod.name] = pod
            return
        if pod.image:
            # Never the shared pool: the job it was made for, else its caller's jobs of the same image.
            # A never-used one nobody reserved (a restart) is indexed nowhere: the controller retires it.
            if pod.reserved_for is not None:
                self.reserved.setdefault(pod.reserved_for, []).append(pod)
            elif pod.caller is not None and pod.origin is Origin.CUSTOM_IMAGE:
                self.buckets[pod.pool].images.setdefault((pod.caller, pod.image), {})[pod.name] = pod
            return
        if self.gangs and pod.key is None and pod.reserved_for is None:
            self.feed(pod)
        if pod.reserved_for is not None:
            self.reserved.setdefault(pod.reserved_for, []).append(pod)
            return
        bucket = self.buckets[pod.pool]
        if pod.key is None:
            bucket.fresh[pod.name] = pod
            if pod.node:
                on = bucket.fresh_by_node.get(pod.node)
                if on is None:
                    bucket.fresh_by_node[pod.node] = {pod.name: pod}
                else:
                    on[pod.name] = pod
            return
        own = bucket.by_key.get(pod.key)
        if own is None:
            bucket.by_key[pod.key] = {pod.name: pod}
        else:
            own[pod.name] = pod
        mine = bucket.by_caller.get(pod.key[0])
        if mine is None:
            bucket.by_caller[pod.key[0]] = {pod.name: pod}
        else:
            mine[pod.name] = pod

    def unindex_idle(self, pod: Pod) -> None:
        if pod.standby:
            del self.buckets[pod.pool].standby[pod.name]
            return
        if pod.image and pod.reserved_for is None:
            images = self.buckets[pod.pool].images
            mine = images.get((pod.caller or "", pod.image))
            if mine is not None and mine.pop(pod.name, None) is not None and not mine:
                del images[(pod.caller or "", pod.image)]
            return
        if pod.reserved_for is not None:
            ready = self.reserved.get(pod.reserved_for)
            if ready and pod in ready:
                ready.remove(pod)
            return
        bucket = self.buckets[pod.pool]
        if pod.key is None:
            del bucket.fresh[pod.name]
            if pod.node:
                on = bucket.fresh_by_node[pod.node]
                del on[pod.name]
                if not on:
                    del bucket.fresh_by_node[pod.node]
            return
        own = bucket.by_key[pod.key]
        del own[pod.name]
        if not own:
            del bucket.by_key[pod.key]
        mine = bucket.by_caller[pod.key[0]]
        del mine[pod.name]
        if not mine:
            del bucket.by_caller[pod.key[0]]

