"""Gang reservations and backfill: a gang that has waited too long is not starved by small jobs.

Without a reservation a gang holds nothing while it waits (its claim is all or none). Once it has
waited longer than its pool's `reserve_gangs_after`, it gets a reservation: the pool's newly idle
never-used pods are set aside for it, in the total order (priority, submit time, id) of the waiting
gangs, so two reservations never split pods between them and deadlock. At the pool's ceiling, pods
that other callers release retire instead of being held, so their capacity comes back as fresh pods
for the gang (owner-only reuse forbids handing them over). A job may still run on a reserved pod if
it is sure to end before the gang could fill (backfill): its `timeout_s` ends by the gang's estimated
fill time. Idle pods other callers hold retire too when the gang needs their room. The tracker applies
all of this under its lock; this module owns the records and the estimates, which the dispatcher
computes outside the lock from a snapshot once per pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from broker.jobs import Job, job_sort_key
from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec

Retire = Callable[[str, float], bool]

REASON_BACKFILL = "backfill: a pod reserved for a waiting gang, free again before the gang can fill"
REASON_AHEAD = "a pod reserved for a gang that comes after this job in dispatch order"


@dataclass(slots=True)
class Reservation:
    """One waiting gang's claim on its pool's newly idle pods; fields below `order` change under the lock."""

    job_id: str
    caller: str
    pool: str
    pods: int
    order: tuple[int, float, str]
    """The gang's dispatch order (-priority, submit time, id): reservations fill in this order."""
    made_at: float
    fill_at: float = math.inf
    """The earliest time the gang could hold all its pods (estimate); inf until known."""
    restart_s: float = 0.0
    """How long replacing a pod takes in this pool: a backfilled pod of another caller retires at release."""
    make_room: int = 0
    """Pods released by other callers that retire instead of being held, to free room at the ceiling."""
    aged: int = 0
    """Failed fills so far: each `reserve_gangs_after` the gang stays short raises its rank by AGING_BONUS (R2)."""
    alerted: bool = False
    """A `reservation.alert` capacity event went out: it could not fill within `reservation_alert_after`."""


def due(spec: PoolSpec, pods: int, single_use: bool, waited: float) -> bool:
    """A gang gets a reservation once it has waited longer than its pool's `reserve_gangs_after`."""
    after = spec.reserve_gangs_after
    return pods > 1 and not single_use and after is not None and waited >= after


def restart_estimate(spec: PoolSpec) -> float:
    """How long a new pod of this pool takes to start, as the template declares it (0 when unknown): its
    `start_delay_s` plus the median of its modelled venue cold start (`venue_delay`: `median_s` × `scale`,
    which broker.backends.startdelay adds to every real start; the median is the typical draw)."""
    venue = spec.template.get("venue_delay")
    modelled = _seconds(venue.get("median_s")) * _seconds(venue.get("scale", 1.0)) if isinstance(venue, Mapping) else 0.0
    return _seconds(spec.template.get("start_delay_s", 0.0)) + modelled


def _seconds(raw: object) -> float:
    return float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) and raw > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Estimate:
    job_id: str
    fill_at: float
    make_room: int
    restart_s: float
    victims: tuple[tuple[str, float], ...] = ()
    """(pod, idle since) of idle pods other callers hold, oldest first, to retire now for the room."""


def estimate(spec: PoolSpec, reservations: Sequence[tuple[Reservation, int]], pods: Iterable[Pod],
             running: Callable[[str], tuple[str, float]], now: float) -> list[Estimate]:
    """Fill time and room to make for each reservation of one pool, in reservation order.

    `reservations` pairs each reservation with the number of pods it holds; `running(job_id)` gives a
    running job's caller and the time it ends at the latest (inf without a timeout). Every pod that
    could come to a gang becomes the time it could: idle, starting and creatable pods about now, busy
    pods when their job must end, and other callers' pods only after they retire and a replacement
    starts (they never change hands). Earlier reservations take the earlier times.
    """
    restart = restart_estimate(spec)
    physical = 0
    shared: list[float] = []
    """When a pod any gang may use appears (fresh, starting, or capacity coming free)."""
    used: list[tuple[str, float, float]] = []
    """(caller, when free, when free for another caller): pods that stay their caller's."""
    holds: list[tuple[float, str, str]] = []
    """(idle since, pod, caller) of idle used pods: their holds break for a reservation that needs room."""
    for pod in pods:
        state = pod.state
        if state is PodState.GONE or pod.origin is Origin.SINGLE_USE:
            continue
        physical += 1
        if state is PodState.RETIRING or state is PodState.STARTING:
            shared.append(now + restart)
        elif state is PodState.IDLE:
            if pod.reserved_for is not None:
                continue  # its reservation's holding
            if pod.key is None or pod.caller is None:
                shared.append(now)
            else:
                used.append((pod.caller, now, now + restart))
                holds.append((pod.idle_since, pod.name, pod.caller))
        else:  # assigned, running or resetting: free once its job ends, at the latest
            caller, ends = running(pod.job) if pod.job is not None else (pod.caller or "", now)
            if pod.retire:
                shared.append(ends + restart)
            else:
                used.append((caller, ends, ends + restart))
    room = max(0, spec.max_count - physical)
    shared.extend([now + restart] * room)
    out: list[Estimate] = []
    taken = 0
    for i, (res, held) in enumerate(reservations):
        missing = max(0, res.pods - held)
        own = [free for caller, free, _ in used if caller == res.caller]
        foreign = [later for caller, _, later in used if caller != res.caller]
        times = sorted([*shared, *own, *foreign])[taken:]
        fill_at = now if missing == 0 else times[missing - 1] if len(times) >= missing else math.inf
        # Only the first reservation makes room: pods go to reservations in order.
        make_room = max(0, missing - len(shared) - len(own)) if i == 0 else 0
        victims = tuple((name, since) for since, name, caller in sorted(holds) if caller != res.caller)[:make_room]
        out.append(Estimate(res.job_id, fill_at, make_room, restart, victims))
        taken += missing
    return out


class ReservationBook(Protocol):
    """What reservations need of the tracker (broker.claiming.tracker.Tracker is one). The tracker holds these
    records, so this module sits below it and names only this face: the claim path's modules import one way."""

    def pool(self, name: str) -> PoolSpec | None: ...
    def snapshot(self) -> list[Pod]: ...
    def reserve_gang(self, res: Reservation) -> bool: ...
    def reservations(self, pool: str) -> list[tuple[Reservation, int]]: ...
    def reserved_pools(self) -> list[str]: ...
    def age_reservation(self, pool: str, job_id: str, fills: int) -> None: ...
    def mark_alerted(self, pool: str, job_id: str) -> bool: ...
    def apply_estimates(self, pool: str, estimates: Iterable[Estimate]) -> None: ...


def reserve_if_due(tracker: ReservationBook, job: Job, live: Mapping[str, Job], now: float, retire: Retire) -> bool:
    """After a gang's claim fell short: give it a reservation once it has waited long enough."""
    spec = tracker.pool(job.spec.pool)
    waited = now - job.timings.get("queued_at", job.timings.get("submitted_at", now))
    if spec is None or not due(spec, job.spec.pods, job.spec.single_use, waited):
        return False
    if tracker.reserve_gang(Reservation(job.id, job.caller, spec.name, job.spec.pods, job_sort_key(job), now)):
        refresh(tracker, live, now, retire)  # make room now, not one pass later
    return True


Alert = Callable[[Reservation, int, str], None]
"""alert(reservation, pods it holds, why): a reservation that cannot fill in time raises a capacity event."""


def failed_fills(spec: PoolSpec, res: Reservation, now: float) -> int:
    """Fill attempts a short reservation has failed: one per `reserve_gangs_after` it has waited (R2 aging)."""
    period = spec.reserve_gangs_after or 60.0
    return int((now - res.made_at) // period) if period > 0 else 0


def overdue(spec: PoolSpec, res: Reservation, held: int, now: float) -> bool:
    """Short of pods for longer than `reservation_alert_after`, and not alerted yet (R2's starvation guard)."""
    after = spec.reservation_alert_after
    return held < res.pods and not res.alerted and after is not None and now - res.made_at >= after


def age_and_alert(tracker: ReservationBook, spec: PoolSpec, now: float, alert: Alert | None) -> None:
    """Age every short reservation of the pool by its failed fills; alert on those overdue."""
    for res, held in tracker.reservations(spec.name):
        if held >= res.pods:
            continue
        fills = failed_fills(spec, res, now)
        if fills > res.aged:
            tracker.age_reservation(spec.name, res.job_id, fills)
        if overdue(spec, res, held, now) and tracker.mark_alerted(spec.name, res.job_id) and alert is not None:
            alert(res, held, f"gang {res.job_id} holds {held} of {res.pods} pods of pool {spec.name} after "
                             f"{now - res.made_at:.0f} s (reservation_alert_after {spec.reservation_alert_after:g} s): "
                             "the pool cannot host it as things stand; a capacity-planning signal")


def refresh(tracker: ReservationBook, live: Mapping[str, Job], now: float, retire: Retire, alert: Alert | None = None) -> None:
    """Re-estimate every reservation's fill time and room to make (outside the lock, once a pass), and
    break the holds the first reservation needs broken: `retire(pod, idle_since)` retires a pod still
    idle since then (a claim since the snapshot wins) and says whether it did."""
    pools = tracker.reserved_pools()
    if not pools:
        return
    by_pool: dict[str, list[Pod]] = {name: [] for name in pools}
    for pod in tracker.snapshot():
        if pod.pool in by_pool:
            by_pool[pod.pool].append(pod)

    def running(job_id: str) -> tuple[str, float]:
        job = live.get(job_id)
        if job is None:
            return "", math.inf
        timeout = job.spec.timeout_s
        began = job.timings.get("committed_at", now)
        return job.caller, began + timeout if timeout is not None else math.inf

    for name in pools:
        spec = tracker.pool(name)
        if spec is None:
            continue
        age_and_alert(tracker, spec, now, alert)
        estimates = estimate(spec, tracker.reservations(name), by_pool[name], running, now)
        for i, e in enumerate(estimates):
            if e.victims:
                broken = sum(1 for pod, since in e.victims if retire(pod, since))
                estimates[i] = dataclasses.replace(e, make_room=e.make_room - broken)
        tracker.apply_estimates(name, estimates)
