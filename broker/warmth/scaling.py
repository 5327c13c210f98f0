"""The scaler: a pure function from a pool's pods, its spec and its queued demand to a plan (paper §7, App. A.5).

`count` derives the terms (eligible, physical, held, stale, single-use, standby) from pod records;
`plan` turns them into `add = min(max(floorDeficit, demandDeficit), ceiling − physical, step, headroom)`
or, when nothing is added, a scale-down of idle pods whose keep-alive expired. An active–standby group
counts once: standby pods are never physical and never supply.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from broker.pods import Origin, Pod, PodState
from broker.pools import PoolSpec

_BUSY = (PodState.ASSIGNED, PodState.RUNNING, PodState.RESETTING)


def is_standby(pod: Pod) -> bool:
    """A zero-VRAM standby staged on an active pod's GPU (not yet promoted by a claim)."""
    return pod.standby and pod.state in (PodState.STARTING, PodState.IDLE)


@dataclass(frozen=True)
class Counts:
    """One pool's pods by what they can do now (derived from pod records, never stored).

    Every pod lands in exactly one of starting / idle / held / assigned / running / resetting / retiring,
    or is a standby; `stale` and `single_use` overlap those. An active–standby group is one physical pod.
    """

    starting: int = 0
    """Current-template, non-single-use pods still starting: supply for demand."""
    idle: int = 0
    """Unheld idle pods: never used, or their owner's hold expired."""
    fresh: int = 0
    """Never-used, current-template idle pods nobody reserved: supply for any caller."""
    held: int = 0
    held_by: Mapping[str, int] = field(default_factory=dict)
    held_matched: int = 0
    """Held pods whose owner has queued jobs in this pool: idle (supply) for that owner only."""
    expired_holds: int = 0
    """Used idle pods whose owner hold ran out: they retire (a used pod serves only its owner)."""
    assigned: int = 0
    running: int = 0
    resetting: int = 0
    retiring: int = 0
    stale: int = 0
    """Old-template pods not yet retiring: capacity that cannot serve warm jobs."""
    single_use: int = 0
    """Pods made for one job, or of one caller's custom image, not retiring: physical (the ceiling, the budget),
    never supply for others, never floor nor idle-cap pods."""
    replacing: int = 0
    """Busy pods that retire at release (session boundary, drain, preemption): each wants a replacement."""
    standby: int = 0
    """Standby pods; their group is counted once, through the active pod."""
    physical: int = 0
    """Every non-standby pod that holds capacity, retiring ones included until deleted."""

    @property
    def eligible(self) -> int:
        """Pods that serve or will serve warm jobs: starting, idle supply, assigned and running."""
        return self.starting + self.fresh + self.held_matched + self.assigned + self.running

    @property
    def busy(self) -> int:
        return self.assigned + self.running + self.resetting


def count(pods: list[Pod], spec: PoolSpec, now: float, queued_by: Mapping[str, int] | None = None) -> Counts:
    """Derive a pool's counts from its pods; `queued_by` (caller -> queued pods) turns owner holds into supply."""
    c: Counter[str] = Counter()
    held_by: Counter[str] = Counter()
    template = spec.template_hash
    sharing = followers(pods, spec, now)
    standby_cards = {p.gpus for p in pods if p.gpus and is_standby(p)}
    for pod in pods:
        state = pod.state
        if state is PodState.GONE:
            continue
        if pod.name in sharing:
            c["standby"] += 1
            continue
        c["physical"] += 1
        single = pod.origin is Origin.SINGLE_USE or bool(pod.image)
        old = pod.template != template
        if single and state is not PodState.RETIRING:  # a retiring one counts once, as retiring (the floor subtracts both)
            c["single_use"] += 1
            if pod.image and state is PodState.IDLE:
                continue  # its caller's image only: not an idle, held or fresh pod of the pool
        if old and state is not PodState.RETIRING:
            c["stale"] += 1
        if pod.retire and state in _BUSY and pod.gpus not in standby_cards:
            c["replacing"] += 1  # (a standby on the same card is its replacement already)
        if state is PodState.IDLE:
            if pod.held(now):
                c["held"] += 1
                held_by[pod.caller or ""] += 1
            else:
                c["idle"] += 1
                if pod.used:
                    c["expired_holds"] += 1
                elif pod.reserved_for is None and not old and not single:
                    c["fresh"] += 1
        elif state is PodState.STARTING:
            if not single and not old and pod.reserved_for is None:  # a confined gang's set serves only it
                c["starting"] += 1
        else:
            c[state.value] += 1
    matched = sum(min(n, (queued_by or {}).get(owner, 0)) for owner, n in held_by.items())
    return Counts(held_by=dict(held_by), held_matched=matched, **{k: v for k, v in c.items()})


def _rank(pod: Pod, now: float) -> int:
    if is_standby(pod):
        return -1
    if pod.state in _BUSY:
        return 4
    if pod.state is PodState.IDLE:
        return 3 if pod.held(now) else 2
    return 1 if pod.state is PodState.STARTING else 0


def followers(pods: list[Pod], spec: PoolSpec, now: float) -> set[str]:
    """Pods whose active–standby group is counted through another pod: unpromoted standbys, and pods
    sharing a GPU with a more active member of their group. A group with no active pod (its active
    retired, its standby not yet promoted) is counted through the standby, so it still holds its GPU."""
    out: set[str] = set()
    best: dict[tuple[str, ...], Pod] = {}
    for pod in pods:
        if pod.state is PodState.GONE:
            continue
        if not pod.gpus or spec.standbys_per_active <= 0:
            if is_standby(pod):
                out.add(pod.name)
            continue
        other = best.get(pod.gpus)
        if other is None or (_rank(pod, now), pod.created_at) > (_rank(other, now), other.created_at):
            if other is not None:
                out.add(other.name)
            best[pod.gpus] = pod
        else:
            out.add(pod.name)
    return out


@dataclass(frozen=True)
class Plan:
    create: int = 0
    retire: tuple[str, ...] = ()
    reason: str = ""


def plan(spec: PoolSpec, pods: list[Pod], counts: Counts, demand: int, now: float,
         headroom: int | None = None, single_use: int = 0) -> Plan:
    """Pods to create for demand and the floor, or idle pods to retire (App. A.5).

    `demand` is the pods of queued warm jobs (jobs waiting on their caller's quota included); assigned
    and running pods appear on both sides of `demand − eligible` and cancel. A busy pod that retires at
    release is demand as well, so a new session's next job finds its replacement warm. `headroom` is
    how many more pods the global budget (plus borrowed capacity) allows; None is unlimited. `single_use`
    is the pods queued single-use jobs still need: the floor never takes the room they are made in.
    Scale-down: a used pod whose hold expired always retires (its state belongs to one caller); of the
    never-used idle pods past keep-alive, `remove = min(idle − retain, expiredIdle, physical − floor)`.
    """
    busy = counts.assigned + counts.running
    room = spec.max_count - counts.physical
    floor_deficit = max(0, min(spec.min_count - (counts.physical - counts.retiring - counts.single_use),
                               room - single_use))
    demand_deficit = max(0, demand + counts.replacing - counts.starting - counts.fresh - counts.held_matched)
    want = max(floor_deficit, demand_deficit)
    limit = spec.step if headroom is None else min(spec.step, headroom)
    create = max(0, min(want, room, limit))
    if create:
        why = "floor" if floor_deficit >= demand_deficit else "demand"
        return Plan(create=create, reason=f"create {create} for {why} (demand {demand}, starting {counts.starting}, "
                                          f"physical {counts.physical}/{spec.max_count})")
    expired_holds = [p.name for p in pods
                     if p.state is PodState.IDLE and p.used and p.hold_until <= now and not is_standby(p)]
    unused = sorted((p for p in pods if p.state is PodState.IDLE and not p.used and p.reserved_for is None
                     and not is_standby(p) and not p.image), key=lambda p: p.idle_since)
    idle = len(unused)
    idle_cap = min(spec.max_idle_count, spec.max_count - (counts.physical - idle))
    retain = max(idle_cap, spec.min_count - (counts.held + busy), demand - counts.starting, 0)
    expired = sum(1 for p in unused if now - p.idle_since >= spec.keep_alive)
    live = counts.physical - counts.retiring - len(expired_holds)
    remove = max(0, min(idle - retain, expired, live - spec.min_count))
    retire = tuple(expired_holds + [p.name for p in unused[:remove]])
    if retire:
        return Plan(retire=retire, reason=f"retire {len(expired_holds)} expired holds, {remove} idle past keep-alive")
    if want and room <= 0:
        return Plan(reason=f"at ceiling {spec.max_count} with {want} pods wanted")
    if want and headroom is not None and headroom <= 0:
        return Plan(reason=f"budget of {spec.accelerator} exhausted with {want} pods wanted")
    return Plan(reason="steady")


def blocked_at_ceiling(spec: PoolSpec, counts: Counts, demand: int, headroom: int | None = None) -> int:
    """Pods queued jobs want that the ceiling (or the accelerator's budget, a ceiling across pools) keeps
    from being created; 0 when nothing is blocked."""
    want = max(0, demand + counts.replacing - counts.starting - counts.fresh - counts.held_matched)
    room = max(0, spec.max_count - counts.physical)
    if headroom is not None:
        room = min(room, max(0, headroom))
    return max(0, want - room)

