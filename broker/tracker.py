"""The in-memory pod tracker: every pod indexed by name, pool, caller, session and job behind ONE lock.

A claim finds a job's whole pod set, validates each transition, checks the caller's limits and records
the lease in one step under the lock, so no two claimers take one pod and no caller overruns a quota.
Nothing under the lock does I/O, logs or allocates more than a tuple: it is held for microseconds.
Search order inside a pool: the session's own idle pod (warm) -> a never-used idle pod (warm when it
was ready before the job came, new when the job waited for it) -> the caller's pod from another session (recycled: runs once, then
retires) -> a zero-VRAM standby on an active GPU (standby: promoted at the per-GPU gate) -> a new pod
(the caller waits; the shortfall is demand for the pool controller).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from broker.pods import Origin, Path, Pod, PodState, SessionKey
from broker.pools import CallerLimits, PoolSpec
from broker.reserving import REASON_AHEAD, REASON_BACKFILL, Estimate, Reservation

_IDLE = PodState.IDLE
_ASSIGNED = PodState.ASSIGNED
_RUNNING = PodState.RUNNING
_RESETTING = PodState.RESETTING
_RETIRING = PodState.RETIRING

REASON_NO_SESSION_POD = "no idle pod of this session"
REASON_NEW_SESSION = "new session: ran once on the caller's previous pod, which then retires"
REASON_TAG_HINT = "reuse_tag hint: the caller's pod of another tag"
REASON_TAKEOVER = "pool at its ceiling: took over the caller's least recently used session's pod (workspace wiped)"
REASON_NO_IDLE = "no idle pod, no standby: a pod was created"
REASON_SESSION_RESETTING = "the session's pod is resetting"
REASON_SINGLE_USE = "single_use: a pod created for this job"
REASON_STANDBY = "no idle pod: a standby on an active GPU, promoted once the previous job is gone"
REASON_QUOTA = "caller quota"


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
    """May take the caller's pod of another session (recycled); False does so only at the pool's ceiling."""


class Lease:
    """A claimed pod set, in rank order, and what it counts against its caller's limits."""

    __slots__ = ("job_id", "caller", "pods", "gpus")

    def __init__(self, job_id: str, caller: str, pods: tuple[Pod, ...], gpus: int) -> None:
        self.job_id = job_id
        self.caller = caller
        self.pods = pods
        self.gpus = gpus


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a claim took nothing, and how many of its pods it could not find."""

    reason: str
    missing: int


class _Bucket:
    """One pool's idle indexes."""

    __slots__ = ("spec", "fresh", "by_key", "by_caller", "hint", "standby", "physical")

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.hint = spec.reuse_tag == "hint"
        self.fresh: dict[str, Pod] = {}
        """Idle pods no job has used, not reserved."""
        self.by_key: dict[SessionKey, dict[str, Pod]] = {}
        """Idle used pods by the session that used them last."""
        self.by_caller: dict[str, dict[str, Pod]] = {}
        """Idle used pods by their last caller (any session)."""
        self.standby: dict[str, Pod] = {}
        """Idle standbys (broker.standby): claimed only when no owner's or unheld idle pod exists."""
        self.physical = 0
        """Pods of the pool that hold a card's count (not unpromoted standbys): at the ceiling no new pod comes."""


class Tracker:
    """Pods by name, pool, caller, session and job; one lock over all of it."""

    def __init__(self, pools: Mapping[str, PoolSpec], limits: Mapping[str, CallerLimits] | None = None) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {name: _Bucket(spec) for name, spec in pools.items()}
        self._limits: dict[str, CallerLimits] = dict(limits or {})
        """Per caller, with `default` for the rest; empty means unlimited (and a faster claim)."""
        self._returning: dict[str, SessionKey] = {}
        """Resetting pods that go back to their session when clean: pod name -> session."""
        self._returning_keys: dict[SessionKey, int] = {}
        """Sessions with pods in `_returning`, and how many: their next job waits for them."""
        self.pods: dict[str, Pod] = {}
        self._leases: dict[str, Lease] = {}
        self._reserved: dict[str, list[Pod]] = {}
        """Idle single-use pods by the job they were created for."""
        self._usage: dict[str, list[int]] = {}
        """caller -> [gpus, pods] held by its assigned and running jobs."""
        self._gate: dict[str, str] = {}
        """GPU key -> the pod running a job on it (the per-GPU gate)."""
        self._unverified: set[str] = set()
        """GPU keys whose standbys are not promoted until a sweep confirms the card is only this pool's group."""
        self._gangs: dict[str, list[Reservation]] = {}
        """pool -> waiting gangs' reservations in (priority, submit time, id) order; their pods are in `_reserved`."""

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
            if pod.state is _IDLE:
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

    def ready(self, name: str, now: float, gpus: tuple[str, ...] = ()) -> bool:
        """STARTING -> IDLE with the devices the backend bound; False when it is no longer starting."""
        with self._lock:
            pod = self.pods.get(name)
            if pod is None or pod.state is not PodState.STARTING:
                return False
            pod.gpus = gpus
            pod.move(_IDLE)
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
            if pod is None or pod.state in (_ASSIGNED, _RUNNING, _RETIRING):
                return None
            if only_if_idle_since is not None and (pod.state is not _IDLE or pod.idle_since != only_if_idle_since):
                return None
            if pod.state is _IDLE:
                self._unindex_idle(pod)
            verified = pod.state is not _RESETTING
            pod.move(_RETIRING)
            if verified:
                self._leave_gate(pod)
            return pod

    def remove(self, name: str) -> None:
        """RETIRING -> GONE: the backend deleted it (and with it any process it still had)."""
        with self._lock:
            pod = self.pods.pop(name, None)
            if pod is not None:
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
            picked: Sequence[tuple[Pod, str, str | None]] | Shortfall | None = None
            if want.single_use:
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
            if picked is None:
                gang = self._gangs and want.job_id in self._reserved
                picked = self._pick_gang(bucket, want) if gang else self._pick(bucket, want)
            if isinstance(picked, Shortfall) and self._gangs:
                picked = self._backfill(want, picked)
            if isinstance(picked, Shortfall):
                return picked
            job_id = want.job_id
            for pod, path, reason in picked:
                if pod.state is _IDLE:
                    self._unindex_idle(pod)
                pod.move(_ASSIGNED)
                pod.job = job_id
                pod.path = path
                pod.reason = reason
                if path is Path.RECYCLED and reason is not REASON_TAKEOVER:
                    pod.retire = True
            if self._gangs:
                self._settle(want, picked)
            n = len(picked)
            lease = Lease(job_id, want.caller, tuple(p[0] for p in picked), n * bucket.spec.gpus)
            self._leases[job_id] = lease
            usage = self._usage.get(want.caller)
            if usage is None:
                self._usage[want.caller] = [lease.gpus, n]
            else:
                usage[0] += lease.gpus
                usage[1] += n
            return lease

    def _over_limit(self, want: Claim, gpus_per_pod: int) -> bool:
        limits = self._limits.get(want.caller) or self._limits.get("default")
        if limits is None:
            return False
        held_gpus, held_pods = self._usage.get(want.caller) or (0, 0)
        return ((limits.max_pods is not None and held_pods + want.pods > limits.max_pods)
                or (limits.max_gpus is not None and held_gpus + want.pods * gpus_per_pod > limits.max_gpus))

    def _gate_open(self, pod: Pod) -> bool:
        """No other pod runs a job on any of this pod's GPUs."""
        gate = self._gate
        for g in pod.gpus:
            holder = gate.get(g)
            if holder is not None and holder != pod.name:
                return False
        return True

    def _pick(self, bucket: _Bucket, want: Claim) -> list[tuple[Pod, str, str | None]] | Shortfall:
        """The general search: whole set in search order, or a shortfall that takes nothing."""
        n = want.pods
        key = (want.caller, want.queue, want.tag)
        picked: list[tuple[Pod, str, str | None]] = []
        taken: set[str] = set()
        cards: set[str] = set()
        """Devices of the pods picked so far: a set never puts two of its pods on one card."""

        def usable(pod: Pod) -> bool:
            return pod.name not in taken and self._gate_open(pod) and cards.isdisjoint(pod.gpus)

        def take(pod: Pod, path: str, reason: str | None) -> bool:
            picked.append((pod, path, reason))
            taken.add(pod.name)
            cards.update(pod.gpus)
            return len(picked) == n

        own = bucket.by_key.get(key)
        if own:
            for pod in reversed(own.values()):
                if usable(pod) and take(pod, Path.WARM, None):
                    return picked
        mine = bucket.by_caller.get(want.caller)
        if bucket.hint and mine:
            for pod in reversed(mine.values()):
                if pod.key is not None and pod.key[1] == want.queue and usable(pod) \
                        and take(pod, Path.WARM, REASON_TAG_HINT):
                    return picked
        for pod in reversed(bucket.fresh.values()):
            if usable(pod):
                path = Path.NEW if pod.idle_since >= want.since else Path.WARM
                if take(pod, path, REASON_NO_IDLE if path is Path.NEW else REASON_NO_SESSION_POD):
                    return picked
        if mine and want.recycle:
            for pod in reversed(mine.values()):
                if usable(pod) and take(pod, Path.RECYCLED, REASON_NEW_SESSION):
                    return picked
        if bucket.standby:
            # A standby may wait at the gate for its card's job: that wait is the handover. Cards that are
            # free come first, then cards whose job is already resetting, then cards still running one.
            for pod in sorted(bucket.standby.values(), key=self._gate_wait_rank):
                if pod.name in taken or not cards.isdisjoint(pod.gpus) \
                        or (self._unverified and not self._unverified.isdisjoint(pod.gpus)):
                    continue
                if take(pod, Path.STANDBY, REASON_STANDBY):
                    return picked
        if mine and not want.recycle and bucket.physical >= bucket.spec.max_count:
            # recycle=False gives way only at the ceiling: the caller's least recently used session hands
            # its pod over for good (the agent empties the workspace at the session change).
            for pod in list(mine.values()):
                if usable(pod) and take(pod, Path.RECYCLED, REASON_TAKEOVER):
                    return picked
        return Shortfall("no idle pod", n - len(picked))

    def _session_pod_resetting(self, want: Claim) -> Shortfall | None:
        """A session whose own pod is still resetting waits the few ms for it rather than take another
        pod: the result is committed while the reset runs, so a quick next call must not lose its warm
        workspace (a failed reset retires the pod and the next pass takes another)."""
        if self._returning_keys.get((want.caller, want.queue, want.tag)):
            return Shortfall(REASON_SESSION_RESETTING, want.pods)
        return None

    def _gate_wait_rank(self, pod: Pod) -> int:
        """0: the card is free; 1: its job ended and the reset is under way; 2: a job still runs there."""
        rank = 0
        for g in pod.gpus:
            holder = self.pods.get(self._gate.get(g, ""))
            if holder is not None and holder is not pod:
                rank = max(rank, 1 if holder.state is _RESETTING else 2)
        return rank

    def _pick_reserved(self, want: Claim) -> list[tuple[Pod, str, str | None]] | Shortfall:
        ready = self._reserved.get(want.job_id, [])
        if len(ready) < want.pods:
            return Shortfall("single-use pod starting", want.pods - len(ready))
        del self._reserved[want.job_id]
        return [(pod, Path.NEW, REASON_SINGLE_USE) for pod in ready[: want.pods]]

    def unclaim(self, job_id: str, now: float) -> None:
        """ASSIGNED -> IDLE: the binding did not commit, so no user code ran; the pods are untouched."""
        with self._lock:
            lease = self._leases.pop(job_id, None)
            if lease is None:
                return
            for pod in lease.pods:
                pod.move(_IDLE)
                pod.job = None
                pod.retire = False
                self._index_idle(pod)
            self._unuse(lease)

    def start(self, job_id: str) -> bool:
        """ASSIGNED -> RUNNING, taking each pod's GPUs through the per-GPU gate.

        False (and nothing changes) when another pod still runs on one of the GPUs: at most one pod
        per physical GPU runs a job at a time; the caller retries when that pod's reset is verified.
        """
        with self._lock:
            lease = self._leases.get(job_id)
            pods = lease.pods if lease else ()
            gate = self._gate
            for pod in pods:
                if gate and not self._gate_open(pod):
                    return False
            for pod in pods:
                pod.move(_RUNNING)
                pod.used = True
                if pod.standby:
                    self._buckets[pod.pool].physical += 1  # promoted: it now holds the card's count
                pod.standby = False  # promoted: the card's previous job is verified gone
                for g in pod.gpus:
                    gate[g] = pod.name
            return True

    def begin_reset(self, job_id: str, key: SessionKey) -> tuple[Pod, ...]:
        """RUNNING (or ASSIGNED) -> RESETTING for every pod of the job; `key` becomes the owner."""
        with self._lock:
            lease = self._leases.pop(job_id, None)
            return self._begin_reset(lease, key) if lease is not None else ()

    def finish_reset(self, name: str, clean: bool, now: float, hold_seconds: float) -> bool:
        """RESETTING -> IDLE held for its owner when clean and reusable; else -> RETIRING.

        Returns True when the pod went back to the pool. The pod leaves the per-GPU gate here,
        after the agent verified that the previous job's processes are gone.
        """
        with self._lock:
            pod = self.pods.get(name)
            if pod is None or pod.state is not _RESETTING:
                return False
            return self._finish_reset(pod, clean, now, hold_seconds)

    def release(self, job_id: str, key: SessionKey, now: float, hold_seconds: float) -> None:
        """begin_reset + a clean finish_reset in one step, for resets known to be clean (fakes, benchmarks)."""
        with self._lock:
            lease = self._leases.pop(job_id, None)
            if lease is not None:
                for pod in self._begin_reset(lease, key, returning=False):
                    self._finish_reset(pod, True, now, hold_seconds)

    def _begin_reset(self, lease: Lease, key: SessionKey, returning: bool = True) -> tuple[Pod, ...]:
        for pod in lease.pods:
            if pod.state is _ASSIGNED:  # the launch never went out; the pod may still be dirty
                pod.move(_RUNNING)
            pod.move(_RESETTING)
            pod.caller = key[0]
            pod.key = key
            pod.job = None
            if returning and not pod.retire and pod.origin is not Origin.SINGLE_USE:
                self._returning[pod.name] = key
                self._returning_keys[key] = self._returning_keys.get(key, 0) + 1
        self._unuse(lease)
        return lease.pods

    def _finish_reset(self, pod: Pod, clean: bool, now: float, hold_seconds: float) -> bool:
        if self._returning:
            self._returned(pod)
        if pod.gpus and clean:
            # Only a verified reset opens the gate; an unclean pod keeps it until it is deleted.
            self._leave_gate(pod)
        if not clean or pod.retire or pod.origin is Origin.SINGLE_USE or (self._gangs and self._makes_room(pod)):
            pod.move(_RETIRING)
            return False
        pod.move(_IDLE)
        pod.idle_since = now
        pod.hold_until = now + hold_seconds
        self._index_idle(pod)
        return True

    def _returned(self, pod: Pod) -> None:
        key = self._returning.pop(pod.name, None)
        if key is not None:
            left = self._returning_keys[key] - 1
            if left:
                self._returning_keys[key] = left
            else:
                del self._returning_keys[key]

    def lost(self, name: str) -> Pod | None:
        """A pod vanished or its agent stays unreachable: RETIRING from any live state."""
        with self._lock:
            pod = self.pods.get(name)
            if pod is None or pod.state in (_RETIRING, PodState.GONE):
                return None
            if pod.state is _IDLE:
                self._unindex_idle(pod)
            if pod.state is _ASSIGNED:
                pod.move(_RUNNING)
            if pod.state is _RUNNING:
                pod.move(_RESETTING)
            self._returned(pod)
            pod.move(_RETIRING)  # the gate stays closed until remove(): its processes may still run
            return pod

    def retire_at_release(self, name: str) -> bool:
        """Mark a busy pod to retire when its job ends (drain, preemption); False when it is not busy."""
        with self._lock:
            pod = self.pods.get(name)
            if pod is None or pod.state not in (_ASSIGNED, _RUNNING, _RESETTING):
                return False
            pod.retire = True
            return True

    def reserve(self, pod: Pod, job_id: str) -> None:
        """Mark a STARTING pod as created for one single-use job."""
        with self._lock:
            pod.reserved_for = job_id

    # ---------------------------------------------------------------- gang reservations (broker.reserving)

    def reserve_gang(self, res: Reservation) -> bool:
        """Give a waiting gang a reservation: idle never-used pods of its pool go to it from now on.
        False when it has one already."""
        with self._lock:
            gangs = self._gangs.setdefault(res.pool, [])
            if any(r.job_id == res.job_id for r in gangs):
                return False
            bisect.insort(gangs, res, key=lambda r: r.order)
            bucket = self._buckets.get(res.pool)
            if bucket is not None:
                for pod in list(bucket.fresh.values()):
                    self._unindex_idle(pod)
                    self._index_idle(pod)
            return True

    def drop_reservation(self, job_id: str, pool: str) -> None:
        """The gang left the queue (cancelled, failed): its pods go back to the pool, or to the next gang."""
        with self._lock:
            self._drop_reservation(job_id, pool)

    def reservations(self, pool: str) -> list[tuple[Reservation, int]]:
        """The pool's reservations in order, each with how many pods it holds."""
        with self._lock:
            return [(r, len(self._reserved.get(r.job_id, ()))) for r in self._gangs.get(pool, ())]

    def reserved_count(self, job_id: str) -> int:
        """Pods set aside for this job (a reserved gang, or a single-use job's own pods)."""
        return len(self._reserved.get(job_id, ()))

    def reserved_pools(self) -> list[str]:
        return [pool for pool, gangs in self._gangs.items() if gangs]

    def apply_estimates(self, pool: str, estimates: Iterable[Estimate]) -> None:
        """Record the dispatcher's fill-time and room estimates (computed outside the lock)."""
        with self._lock:
            by_id = {e.job_id: e for e in estimates}
            for res in self._gangs.get(pool, ()):
                e = by_id.get(res.job_id)
                if e is not None:
                    res.fill_at, res.make_room, res.restart_s = e.fill_at, e.make_room, e.restart_s

    def _feed(self, pod: Pod) -> None:
        """A never-used pod became idle: it goes to the first reservation of its pool still short of pods."""
        for res in self._gangs.get(pod.pool, ()):
            if len(self._reserved.get(res.job_id, ())) < res.pods:
                pod.reserved_for = res.job_id
                return

    def _makes_room(self, pod: Pod) -> bool:
        """A pod another caller released retires instead of being held, while a reservation needs room."""
        for res in self._gangs.get(pod.pool, ()):
            if res.make_room > 0 and res.caller != pod.caller:
                res.make_room -= 1
                return True
        return False

    def _pick_gang(self, bucket: _Bucket, want: Claim) -> list[tuple[Pod, str, str | None]] | Shortfall:
        """A reserved gang: its reserved pods, then the usual search for the rest; all or nothing."""
        held = self._reserved.get(want.job_id, [])
        picked: list[tuple[Pod, str, str | None]] = [
            (pod, Path.NEW if pod.idle_since >= want.since else Path.WARM,
             REASON_NO_IDLE if pod.idle_since >= want.since else REASON_NO_SESSION_POD)
            for pod in held[: want.pods]]
        need = want.pods - len(picked)
        if need == 0:
            return picked
        rest = self._pick(bucket, Claim(want.job_id, want.caller, want.pool, want.queue, want.tag, need,
                                        since=want.since))
        if isinstance(rest, Shortfall):
            return Shortfall(f"reservation holds {len(picked)} of {want.pods} pods", rest.missing)
        return picked + rest

    def _backfill(self, want: Claim, short: Shortfall) -> list[tuple[Pod, str, str | None]] | Shortfall:
        """Reserved pods for a job sure to end before their gang could fill, or one ahead of the gang in
        dispatch order (a reservation never inverts priorities); lowest reservation first."""
        for res in reversed(self._gangs.get(want.pool, ())):
            if res.job_id == want.job_id:
                continue
            spare = self._reserved.get(res.job_id, ())
            if len(spare) < want.pods:
                continue
            ahead = want.order is not None and want.order < res.order
            # An unknown fill time (inf) admits no backfill: nothing proves the job ends before it.
            if not ahead and not want.ends_by + (0.0 if want.caller == res.caller else res.restart_s) \
                    <= res.fill_at < math.inf:
                continue
            why = REASON_AHEAD if ahead else REASON_BACKFILL
            return [(pod, Path.NEW if pod.idle_since >= want.since else Path.WARM, why) for pod in spare[-want.pods:]]
        return short

    def _settle(self, want: Claim, picked: Sequence[tuple[Pod, str, str | None]]) -> None:
        """After a claim: the gang's reservation is done; backfilled pods of another caller retire at release."""
        for pod, _, reason in picked:
            if pod.reserved_for is not None and pod.origin is not Origin.SINGLE_USE:
                owner = next((r for r in self._gangs.get(pod.pool, ()) if r.job_id == pod.reserved_for), None)
                pod.reserved_for = None
                if reason == REASON_BACKFILL and owner is not None and owner.caller != want.caller:
                    pod.retire = True
        self._drop_reservation(want.job_id, want.pool)

    def _drop_reservation(self, job_id: str, pool: str) -> None:
        gangs = self._gangs.get(pool)
        if not gangs:
            return
        for i, res in enumerate(gangs):
            if res.job_id == job_id:
                del gangs[i]
                break
        else:
            return
        if not gangs:
            del self._gangs[pool]
        for pod in self._reserved.pop(job_id, []):
            pod.reserved_for = None
            self._index_idle(pod)

    # ---------------------------------------------------------------- recovery

    def adopt_running(self, job_id: str, names: Iterable[str], caller: str) -> None:
        """Recovery: re-attach a live attempt's pods (IDLE -> ASSIGNED -> RUNNING) without a claim."""
        with self._lock:
            pods = tuple(self.pods[n] for n in names)
            for pod in pods:
                if pod.state is _IDLE:
                    self._unindex_idle(pod)
                pod.move(_ASSIGNED)
                pod.move(_RUNNING)
                pod.job = job_id
                pod.used = True
                for g in pod.gpus:
                    self._gate[g] = pod.name
            lease = Lease(job_id, caller, pods, sum(len(p.gpus) for p in pods))
            self._leases[job_id] = lease
            usage = self._usage.setdefault(caller, [0, 0])
            usage[0] += lease.gpus
            usage[1] += len(pods)

    def end_session(self, key: SessionKey, jobs: Collection[str] = ()) -> tuple[list[str], list[str]]:
        """A caller ended a session: its idle pods go RETIRING now, its busy ones retire at release.

        A pod matches when it was last used by the session (`key`) or runs one of its `jobs` now.
        Returns (retired now, retiring at release). Pods of other callers never match the key.
        """
        now_retired: list[str] = []
        at_release: list[str] = []
        with self._lock:
            for pod in self.pods.values():
                if pod.key != key and (pod.job is None or pod.job not in jobs):
                    continue
                if pod.state is _IDLE:
                    self._unindex_idle(pod)
                    pod.move(_RETIRING)
                    self._leave_gate(pod)
                    now_retired.append(pod.name)
                elif pod.state in (_ASSIGNED, _RUNNING, _RESETTING):
                    pod.retire = True
                    at_release.append(pod.name)
        return now_retired, at_release

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
                    self._buckets[name] = _Bucket(spec)
                else:
                    bucket.spec = spec
                    bucket.hint = spec.reuse_tag == "hint"

    # ---------------------------------------------------------------- internals (lock held)

    def _index_idle(self, pod: Pod) -> None:
        if pod.standby:
            self._buckets[pod.pool].standby[pod.name] = pod
            return
        if self._gangs and pod.key is None and pod.reserved_for is None:
            self._feed(pod)
        if pod.reserved_for is not None:
            self._reserved.setdefault(pod.reserved_for, []).append(pod)
            return
        bucket = self._buckets[pod.pool]
        if pod.key is None:
            bucket.fresh[pod.name] = pod
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

    def _unindex_idle(self, pod: Pod) -> None:
        if pod.standby:
            del self._buckets[pod.pool].standby[pod.name]
            return
        if pod.reserved_for is not None:
            ready = self._reserved.get(pod.reserved_for)
            if ready and pod in ready:
                ready.remove(pod)
            return
        bucket = self._buckets[pod.pool]
        if pod.key is None:
            del bucket.fresh[pod.name]
            return
        own = bucket.by_key[pod.key]
        del own[pod.name]
        if not own:
            del bucket.by_key[pod.key]
        mine = bucket.by_caller[pod.key[0]]
        del mine[pod.name]
        if not mine:
            del bucket.by_caller[pod.key[0]]

    def _unuse(self, lease: Lease) -> None:
        usage = self._usage[lease.caller]
        usage[0] -= lease.gpus
        usage[1] -= len(lease.pods)

    def _leave_gate(self, pod: Pod) -> None:
        for g in pod.gpus:
            if self._gate.get(g) == pod.name:
                del self._gate[g]
