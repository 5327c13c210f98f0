"""The dispatcher: queued jobs in priority order -> claim -> version-checked commit -> hand to the executor.

Woken by submit, release and pod-ready events; a 3 s tick is only a fallback. For each queued job it
(1) claims the full pod set under the tracker lock, (2) prepares the lease, (3) commits QUEUED->RUNNING
with the pod bindings and acquisition paths, conditional on the row version, then hands the job to the
executor, which (4) marks the pods running and (5) launches. No user code runs before the commit: a
failed prepare retires the pods and keeps the job queued; a lost or failed commit returns the pods.
A new one-pod job that finds the queue empty is claimed at submit instead, and its insert commits it bound
(`insert_bound`): the same claim and the same attempt, in one commit where a queued job takes two. The commits
and the hand-off to the executor are broker.claiming.binding's.
A job that cannot be placed is skipped (no partial gang is ever held) and its pods count as demand.

A job committed QUEUED is always in the queue or adopted by the next sweeps: every tick the pass looks for live
QUEUED rows it neither queues nor binds (a retry whose hand-off raised, an outcome whose commit answer was lost)
and adopts one it finds twice at the same version. Only the newest row of a job is queued, never one being bound
or no longer QUEUED, and only a bind that committed its own attempt starts it: a job never runs twice.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.claiming.binding import Binder
from broker.claiming.jobbook import Abort, JobBook
from broker.claiming.passing import Shape, Tally
from broker.claiming.queueing import JobQueue, Reasons
from broker.claiming.reserving import Reservation, reserve_if_due, restart_estimate
from broker.claiming.reserving import refresh as refresh_reservations
from broker.claiming.tracker import (
    REASON_QUOTA,
    REASON_SESSION_RESETTING,
    REASON_TEAM_QUOTA,
    Claim,
    Lease,
    Shortfall,
    Tracker,
)
from broker.claiming.tracking import confined
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.events import EventLog
from broker.images import pinned
from broker.jobs import (
    ErrorClass,
    Job,
    JobState,
    job_sort_key,
    transition,
)
from broker.stats import Stats
from broker.tasks import Supervisor, Wakeable
from broker.warmth.placing import never_fits
from broker.warmth.pooling import PoolController

if TYPE_CHECKING:
    from broker.claiming.preempting import Preempter
    from broker.running.executing import Executor

log = logging.getLogger("firepool.dispatching")

FALLBACK_TICK = 3.0


class Dispatcher:
    def __init__(self, *, clock: Clock, book: JobBook, tracker: Tracker, controller: PoolController,
                 tasks: Supervisor, stats: Stats, tick: float = FALLBACK_TICK) -> None:
        self.clock = clock
        self.book = book
        self.tracker = tracker
        self.controller = controller
        self.tasks = tasks
        self.stats = stats
        self.tick = tick
        self.queued = JobQueue()
        """QUEUED jobs not being bound right now, in dispatch order (broker.claiming.queueing)."""
        self.waiting_reason = Reasons(self.queued)
        """job id -> why its last claim took nothing."""
        self.preempter: Preempter | None = None
        self.events: EventLog | None = None
        """Where reservation alerts go (broker.events)."""
        """Makes room for jobs within their team's quota (set when the catalog has quotas)."""
        self._loop = Wakeable(clock, tick, self.dispatch_once)
        self.wake = self._loop.wake
        self.binder = Binder(clock=clock, book=book, tracker=tracker, controller=controller, tasks=tasks, stats=stats,
                             adopt=self._adopt, wake=self.wake)
        """Commits claims and hands the jobs to the executor (broker.claiming.binding)."""
        self.binding = self.binder.binding
        self.run = self._loop.run
        self.passes = 0
        self._next_sweep = 0.0
        self._strays: dict[str, int] = {}
        """job id -> version of a live QUEUED row the last sweep found outside the queue (adopted if seen again)."""
        controller.waiting = self.waiting

    def waiting(self, job_id: str) -> bool:
        """The job is queued or being bound: pods made for it are not orphans."""
        return job_id in self.queued or job_id in self.binding

    def enqueue(self, job: Job) -> None:
        """A job is QUEUED (submitted, retried or recovered): dispatch soon. A row that a bound insert stored
        although its answer was lost (`insert_bound`), found again by its idempotency key, is re-queued first."""
        if not self.binder.landed(job) and self._adopt(job):
            self.wake()

    @property
    def executor(self) -> Executor | None:
        return self.binder.executor

    @executor.setter
    def executor(self, executor: Executor) -> None:
        self.binder.executor = executor

    async def insert_bound(self, job: Job, insert: Callable[[Job], Awaitable[Job]]) -> Job | None:
        """Submit's short way for a new one-pod job while nothing is queued: claim its pod now and insert it bound,
        its insert's commit its claim's (broker.claiming.binding). What `insert` stored, or None when no pod could
        be claimed now: nothing is inserted, and the job goes the usual way (stored QUEUED, claimed by a pass)."""
        spec = job.spec
        if self.queued or not self.passes or self.executor is None or spec.pods != 1 or spec.own_pods:
            return None  # queued jobs come first; and no claim before recovery ended and dispatching began
        now = self.clock.now()
        self.tracker.queued_sessions = frozenset()  # as a pass over this empty queue would set it
        got = self._claim(job, job_sort_key(job), now)
        if isinstance(got, Shortfall):
            return None
        return await self.binder.insert(job, got, now, insert)

    def _adopt(self, job: Job) -> bool:
        """Queue the job's newest row; not one that moved on (a stale hand-off) nor one being bound now."""
        live = self.book.live.get(job.id, job)
        if live.state is not JobState.QUEUED or job.id in self.binding:
            return False
        self.queued[job.id] = live
        return True

    def _sweep(self, now: float) -> None:
        """Adopt live QUEUED rows this dispatcher does not know, each once found on two sweeps in a row."""
        self._next_sweep = now + self.tick
        seen, self._strays = self._strays, {}
        for job in self.book.live.values():
            if job.state is not JobState.QUEUED or job.id in self.queued or job.id in self.binding:
                continue
            if seen.get(job.id) == job.version and self._adopt(job):
                log.warning("%s was QUEUED outside the dispatcher's queue; adopted", job.id)
            else:
                self._strays[job.id] = job.version

    def drop(self, job_id: str) -> None:
        job = self.queued.pop(job_id, None)
        if job is not None and job.spec.pods > 1:
            self.tracker.drop_reservation(job_id, job.spec.pool)
        self.waiting_reason.pop(job_id, None)
        self.tracker.drop_reclaim(job_id)
        if job is None or job.spec.own_pods:
            self.controller.abandon_single_use(job_id)  # the pods made for it would be orphans: retire them now

    def dispatch_once(self) -> int:
        """One pass over the queue; returns how many jobs were claimed."""
        self.passes += 1
        now = self.clock.now()
        t = Tally()
        claimed = 0
        if now >= self._next_sweep:
            self._sweep(now)
        refresh_reservations(self.tracker, self.book.live, now, self._break_hold, self._alert)
        # A queued job's session keeps its idle pod for it: no newer session of the caller recycles it first.
        self.tracker.queued_sessions = frozenset(self.queued.sessions)
        if self.preempter is not None:
            self.preempter.prune(self.book.live)
        memo = self.preempter is None  # preemption weighs each job on its own
        short: dict[Shape, _Like] = {}
        """shape (broker.claiming.passing) -> the first job of it that took nothing, and how many like jobs came
        after it: a deep queue of like jobs costs one claim and one tally, not one a job (a pass frees no pod)."""
        left = Counter(self.queued.shapes) if memo else Counter()
        """shape -> its jobs not yet walked past."""
        open_shapes, unshaped = len(left), self.queued.unshaped if memo else len(self.queued)
        for key in self.queued.in_order():
            if not open_shapes and not unshaped:
                break  # every job left is of a shape that came up short in this pass
            job = self.queued[key[2]]
            same = self.queued.shape_of(job.id) if memo else None
            if same is None:
                unshaped -= 1
            else:
                left[same] -= 1
                if (seen := short.get(same)) is not None:
                    seen.more += 1
                    continue
                if not left[same]:
                    open_shapes -= 1  # its last job: it closes, whether it takes a pod or not
            got = self._claim(job, key, now)
            if isinstance(got, Shortfall):
                if same is not None:
                    short[same] = _Like(got, job)
                    if left[same]:
                        open_shapes -= 1
                self._short(job, got, now, t, own_reason=same is None)
                continue
            claimed += 1
            del self.queued[job.id]
            self.waiting_reason.pop(job.id, None)
            self.binding.add(job.id)
            self.tasks.spawn(f"bind {job.id}", self.binder.bind(job.id, got, now))
        for same, like in short.items():
            like.more += left[same]  # its jobs the pass never reached
            if like.more:
                self._short(like.job, like.got, now, t, like.more)
        self.waiting_reason.by_shape = {same: like.got.reason for same, like in short.items()}
        self.controller.report_demand(t.demand, t.single_use, t.queued_by, t.over_quota, t.images, t.gangs, t.sets,
                                      t.where, t.owners, t.takers)
        return claimed

    def _short(self, job: Job, got: Shortfall, now: float, t: Tally, like: int = 0, own_reason: bool = True) -> None:
        """Tally a job that took nothing; `like`: only the like jobs after it (broker.claiming.passing.shape),
        whose rows are not read again, are tallied (the job itself was, as the first of its shape).
        `own_reason`: the job's waiting reason is its own (else its shape's, broker.claiming.queueing.Reasons)."""
        spec = job.spec
        n = like or 1
        pool = self.tracker.pool(spec.pool)
        confine = confined(spec.topology, pool, spec.pods) if pool is not None else ""
        why = never_fits(self.controller.set_ceilings, pool, spec.pods, confine,
                         self.controller.set_largest) if confine and pool else None
        if why is not None:
            self._unschedulable(job, why)  # before it could make anyone yield or hold room for it
            return
        if not like and own_reason:
            self.waiting_reason[job.id] = got.reason
        if got.reason == REASON_SESSION_RESETTING:
            return  # its own pod is back in milliseconds: no demand for another
        if got.reason.startswith(REASON_TEAM_QUOTA):
            got = Shortfall(REASON_QUOTA, got.missing)  # waits on its team's quota like a caller quota
        elif self.preempter is not None and not spec.single_use and got.reason != REASON_QUOTA:
            self.preempter.consider(job, self.book.live, now)  # short of capacity, not of its own quota
        # A `boundary` pool keeps live sessions: its jobs take another session's pod only at the ceiling.
        recycles = spec.recycle and pool is not None and pool.reuse_tag != "boundary"
        if confine:
            t.where[job.id] = confine
        if spec.own_pods:
            if got.reason != REASON_QUOTA:  # pods made now would hold room until its caller's jobs end
                t.single_use[job.id] = (spec.pool, spec.pods)
                if spec.image:
                    t.images[job.id] = (spec.image, pinned(spec.image) and not spec.single_use)
        elif job.id in t.where:
            if got.reason != REASON_QUOTA:  # a whole set made for it on one node, as single-use sets are
                t.sets[job.id] = (spec.pool, spec.pods)
                t.owners[job.id] = ((job.caller, spec.queue, spec.lease_tag), recycles)  # its held pods
        else:
            # The controller subtracts the pods still coming or idle; a reservation's pods are the gang's.
            t.demand[spec.pool] += n * (spec.pods - self.tracker.reserved_count(job.id))
            if spec.pods > 1:
                t.gangs[spec.pool].append((job.id, spec.pods))  # new pods for it are made beside each other
            if spec.pods > 1 and got.reason != REASON_QUOTA:
                reserve_if_due(self.tracker, job, self.book.live, now, self._break_hold)
            if recycles:  # the others use the caller's held pods of other sessions only at the ceiling
                t.add(t.queued_by, spec.pool, job.caller, n * spec.pods)
                if got.reason == REASON_QUOTA:  # takes no held pod until its caller's own jobs end
                    t.add(t.over_quota, spec.pool, job.caller, n * spec.pods)
            elif got.reason != REASON_QUOTA:  # no supply below the ceiling, but spared when holds break
                t.add(t.takers, spec.pool, job.caller, n * spec.pods)

    def _unschedulable(self, job: Job, why: str) -> None:
        """A confined gang that no node (domain) of its pool can ever hold, as the backend's nodes now tell: it
        fails, typed, instead of waiting for ever (admission refuses it at submit when the nodes were known)."""
        del self.queued[job.id]
        self.waiting_reason.pop(job.id, None)
        self.tasks.spawn(f"unschedulable {job.id}", self._fail_unschedulable(job.id, why))

    async def _fail_unschedulable(self, job_id: str, why: str) -> None:
        now = self.clock.now()

        def fail(current: Job) -> Job:
            if current.state is not JobState.QUEUED:
                raise Abort
            return transition(current, JobState.FAILED, now, error_class=ErrorClass.UNSCHEDULABLE, error_message=why)

        try:
            failed = await self.book.write(job_id, fail)
        except FirepoolError as exc:
            log.warning("failing unschedulable %s failed, it stays queued: %s", job_id, exc)
            failed = None
        if failed is not None and failed.state is JobState.FAILED:
            log.info("%s failed: %s", job_id, why)
            self.drop(job_id)
            return
        current = self.book.live.get(job_id)
        if current is not None:
            self._adopt(current)  # still QUEUED: the next pass judges it again

    def _alert(self, res: Reservation, held: int, why: str) -> None:
        """A reservation that cannot fill in time: a capacity event (R2), not a quiet wait."""
        if self.events is not None:
            spec = self.tracker.pool(res.pool)
            gpus = spec.gpus if spec is not None else 0
            self.events.emit("reservation.alert", res.job_id, why, held * gpus * (self.clock.now() - res.made_at),
                             res.caller, {"pool": res.pool, "pods": res.pods, "held": held})

    def _break_hold(self, pod: str, idle_since: float) -> bool:
        """Retire an idle pod another caller holds, for a reservation that needs its room."""
        held = self.tracker.pods.get(pod)
        owner, pool = (held.caller, held.pool) if held is not None else (None, "")
        if not self.controller.retire(pod, only_if_idle_since=idle_since):
            return False
        if self.events is not None:
            spec = self.tracker.pool(pool)
            restart = restart_estimate(spec) * max(1, spec.gpus) if spec is not None else 0.0
            self.events.emit("hold.broken", pod, f"a waiting gang's reservation in pool {pool} needs its room: "
                             f"the idle pod {owner or 'nobody'} held retires", restart or None, owner,
                             {"pool": pool, "for": "reservation"})
        return True

    def _claim(self, job: Job, order: tuple[int, float, str], now: float) -> Lease | Shortfall:
        """Ask the tracker for the job's pods; a lease, or why not."""
        spec = job.spec
        ends_by = now + spec.timeout_s if spec.timeout_s is not None else math.inf
        got = self.tracker.claim(Claim(job.id, job.caller, spec.pool, spec.queue, spec.lease_tag, spec.pods,
                                       spec.single_use, job.timings.get("submitted_at", now), ends_by, order,
                                       recycle=spec.recycle, image=spec.image,
                                       preemptible=bool(spec.extra.get("preemptible")), topology=spec.topology), now)
        if isinstance(got, Lease) and any(p.retire for p in got.pods):
            self.controller.wake()  # a pod that retires after this job (reuse_tag: retire, a backfill) wants a replacement now
        return got


@dataclass
class _Like:
    """The first job of a shape that took nothing in a pass, and how many like jobs came after it."""

    got: Shortfall
    job: Job
    more: int = 0
