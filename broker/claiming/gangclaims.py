"""Gang reservations inside the tracker: the pods set aside for a waiting gang, and who may borrow them.

broker.claiming.reserving decides when a gang gets a reservation and estimates when it fills; this module is the
lock-held side: idle never-used pods go to the first reservation still short of pods, a reserved gang
claims its pods first, a job sure to end before the gang fills (or ahead of it in dispatch order) may
backfill them, and a pod another caller released retires while a reservation needs its room.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from broker.claiming.reserving import REASON_AHEAD, REASON_BACKFILL, Estimate, Reservation
from broker.claiming.searching import Search
from broker.claiming.tracking import (
    REASON_NO_IDLE,
    REASON_NO_SESSION_POD,
    Bucket,
    Claim,
    Pick,
    Shortfall,
    TrackerState,
)
from broker.jobs import PREEMPT_AGING
from broker.pods import Origin, Path, Pod


class GangClaims:
    """Reservation bookkeeping over the tracker's state. The methods the Tracker exposes take the tracker lock
    (`reserved_count` and `reserved_pools` read without it); the claim-time ones (`pick_gang`, `backfill`,
    `settle`, `makes_room`, `drop_held`) expect it held. A reserved gang's missing pods come from `search`."""

    __slots__ = ("state", "search")

    def __init__(self, state: TrackerState, search: Search) -> None:
        self.state = state
        self.search = search

    def reserve_gang(self, res: Reservation) -> bool:
        """Give a waiting gang a reservation: idle never-used pods of its pool go to it from now on.
        False when it has one already."""
        with self.state.lock:
            gangs = self.state.gangs.setdefault(res.pool, [])
            if any(r.job_id == res.job_id for r in gangs):
                return False
            bisect.insort(gangs, res, key=lambda r: r.order)
            bucket = self.state.buckets.get(res.pool)
            if bucket is not None:
                for pod in list(bucket.fresh.values()):
                    self.state.unindex_idle(pod)
                    self.state.index_idle(pod)
            return True

    def drop_reservation(self, job_id: str, pool: str) -> None:
        """The gang left the queue (cancelled, failed): its pods go back to the pool, or to the next gang."""
        with self.state.lock:
            self.drop_held(job_id, pool)

    def reservations(self, pool: str) -> list[tuple[Reservation, int]]:
        """The pool's reservations in order, each with how many pods it holds."""
        with self.state.lock:
            return [(r, len(self.state.reserved.get(r.job_id, ()))) for r in self.state.gangs.get(pool, ())]

    def reserved_count(self, job_id: str) -> int:
        """Pods set aside for this job (a reserved gang, or a single-use job's own pods)."""
        return len(self.state.reserved.get(job_id, ()))

    def reserved_pools(self) -> list[str]:
        return [pool for pool, gangs in self.state.gangs.items() if gangs]

    def age_reservation(self, pool: str, job_id: str, fills: int) -> None:
        """R2 aging: the reservation ranks AGING_BONUS higher per failed fill; the pool's order is kept sorted."""
        with self.state.lock:
            gangs = self.state.gangs.get(pool, [])
            for res in gangs:
                if res.job_id == job_id and fills > res.aged:
                    prio, submit, jid = res.order
                    res.order = (prio - PREEMPT_AGING * (fills - res.aged), submit, jid)
                    res.aged = fills
                    gangs.sort(key=lambda r: r.order)
                    return

    def mark_alerted(self, pool: str, job_id: str) -> bool:
        """Record that the reservation's capacity alert went out; False when it had already."""
        with self.state.lock:
            for res in self.state.gangs.get(pool, ()):
                if res.job_id == job_id and not res.alerted:
                    res.alerted = True
                    return True
            return False

    def apply_estimates(self, pool: str, estimates: Iterable[Estimate]) -> None:
        """Record the dispatcher's fill-time and room estimates (computed outside the lock)."""
        with self.state.lock:
            by_id = {e.job_id: e for e in estimates}
            for res in self.state.gangs.get(pool, ()):
                e = by_id.get(res.job_id)
                if e is not None:
                    res.fill_at, res.make_room, res.restart_s = e.fill_at, e.make_room, e.restart_s

    def makes_room(self, pod: Pod) -> bool:
        """A pod another caller released retires instead of being held, while a reservation needs room."""
        for res in self.state.gangs.get(pod.pool, ()):
            if res.make_room > 0 and res.caller != pod.caller:
                res.make_room -= 1
                return True
        return False

    def pick_gang(self, bucket: Bucket, want: Claim) -> list[Pick] | Shortfall:
        """A reserved gang: its reserved pods, then the usual search for the rest; all or nothing."""
        held = self.state.reserved.get(want.job_id, [])
        picked: list[Pick] = [
            (pod, Path.NEW if pod.idle_since >= want.since else Path.WARM,
             REASON_NO_IDLE if pod.idle_since >= want.since else REASON_NO_SESSION_POD)
            for pod in held[: want.pods]]
        need = want.pods - len(picked)
        if need == 0:
            return picked
        rest = self.search.pick(bucket, Claim(want.job_id, want.caller, want.pool, want.queue, want.tag, need,
                                        since=want.since))
        if isinstance(rest, Shortfall):
            return Shortfall(f"reservation holds {len(picked)} of {want.pods} pods", rest.missing)
        return picked + rest

    def backfill(self, want: Claim, short: Shortfall) -> list[Pick] | Shortfall:
        """Reserved pods for a job sure to end before their gang could fill, or one ahead of the gang in
        dispatch order (a reservation never inverts priorities); lowest reservation first."""
        for res in reversed(self.state.gangs.get(want.pool, ())):
            if res.job_id == want.job_id:
                continue
            spare = self.state.reserved.get(res.job_id, ())
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

    def settle(self, want: Claim, picked: Sequence[Pick]) -> None:
        """After a claim: the gang's reservation is done; backfilled pods of another caller retire at release."""
        for pod, _, reason in picked:
            if pod.reserved_for is not None and pod.origin is not Origin.SINGLE_USE:
                owner = next((r for r in self.state.gangs.get(pod.pool, ()) if r.job_id == pod.reserved_for), None)
                pod.reserved_for = None
                if reason == REASON_BACKFILL and owner is not None and owner.caller != want.caller:
                    pod.retire = True
        self.drop_held(want.job_id, want.pool)

    def drop_held(self, job_id: str, pool: str) -> None:
        """`drop_reservation` with the lock held (a claim settled, the gang left)."""
        gangs = self.state.gangs.get(pool)
        if not gangs:
            return
        for i, res in enumerate(gangs):
            if res.job_id == job_id:
                del gangs[i]
                break
        else:
            return
        if not gangs:
            del self.state.gangs[pool]
        for pod in self.state.reserved.pop(job_id, []):
            pod.reserved_for = None
            self.state.index_idle(pod)
