"""The pool controller: creates pods for queued demand and the floor, retires expired and unwanted ones.

Each pass works in two steps (STYLE 5): observe counts from a tracker snapshot, then act — create pods
through the backend, retire pods whose keep-alive or owner hold expired. The plan itself is a pure
function of the counts, the pool spec, the demand and the clock (`plan`), so tests run it one tick at a
time. The dispatcher reports demand after every pass and wakes the controller; a periodic tick covers
expiries. Creation and deletion run as supervised tasks, off the claim path.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from broker.clock import Clock
from broker.errors import FirepoolError
from broker.pods import Origin, Pod, PodState, owner_annotations
from broker.pools import PoolSpec
from broker.ports.backend import Backend, PodRequest
from broker.standby import covered, exclusive_cards, group_key, groups, physical_groups, plan_standbys
from broker.stats import Stats
from broker.tasks import Supervisor, Wakeable
from broker.tracker import Tracker

log = logging.getLogger("firepool.pooling")


@dataclass(frozen=True)
class Counts:
    """One pool's pods by what they can do now (derived from pod records, never stored)."""

    starting: int = 0
    idle: int = 0
    """Unheld idle pods: never used, or their owner's hold expired."""
    fresh: int = 0
    """Never-used idle pods nobody reserved: supply for any caller's demand."""
    held: int = 0
    held_by: Mapping[str, int] = field(default_factory=dict)
    assigned: int = 0
    running: int = 0
    resetting: int = 0
    retiring: int = 0
    stale: int = 0
    single_use: int = 0
    replacing: int = 0
    """Busy pods that retire at release (a session boundary was crossed): each wants a replacement."""
    physical: int = 0
    """Every pod that holds capacity, retiring ones included until deleted; a GPU group counts once."""
    standby: int = 0
    """Standby pods (not yet promoted): never supply, never physical beyond their card's group."""

    @property
    def eligible(self) -> int:
        return self.starting + self.idle + self.assigned + self.running + self.resetting


def count(pods: list[Pod], spec: PoolSpec, now: float) -> Counts:
    """Derive a pool's counts from its pods."""
    c: Counter[str] = Counter()
    held_by: Counter[str] = Counter()
    template = spec.template_hash
    by_group = groups(pods)
    for pod in pods:
        state = pod.state
        if state is PodState.GONE:
            continue
        if pod.standby:
            c["standby"] += 1
            continue
        if pod.origin is Origin.SINGLE_USE:
            c["single_use"] += 1
        if pod.template != template and state is not PodState.RETIRING:
            c["stale"] += 1
        if pod.retire and state in (PodState.ASSIGNED, PodState.RUNNING, PodState.RESETTING) \
                and not covered(pod, by_group):
            c["replacing"] += 1
        if state is PodState.IDLE:
            if pod.held(now):
                c["held"] += 1
                held_by[pod.caller or ""] += 1
            else:
                c["idle"] += 1
                if not pod.used and pod.reserved_for is None:
                    c["fresh"] += 1
        else:
            c[state.value] += 1
    c["physical"] = physical_groups(pods)
    return Counts(held_by=dict(held_by), **{k: v for k, v in c.items()})


@dataclass(frozen=True)
class Plan:
    create: int = 0
    retire: tuple[str, ...] = ()
    reason: str = ""


def plan(spec: PoolSpec, pods: list[Pod], counts: Counts, demand: int, now: float) -> Plan:
    """Pods to create for demand and the floor, and expired idle pods to retire.

    Creation: need = max(floor - physical, demand + replacing - starting - fresh); starting and fresh
    pods are supply, so a slow start does not trigger another wave on every pass (nor a pod that became
    ready since the dispatcher reported the demand), and a pod that runs one job across a
    session boundary is replaced while it runs, so the new session's next job finds a warm pod instead
    of waiting for one. Retirement: a used pod whose owner hold expired
    retires (its state belongs to one caller); a never-used idle pod past its keep-alive retires unless
    the floor or the idle cap keeps it.
    """
    floor_deficit = max(0, spec.min_count - (counts.physical - counts.retiring - counts.single_use))
    demand_deficit = max(0, demand + counts.replacing - counts.starting - counts.fresh)
    want = max(floor_deficit, demand_deficit)
    room = spec.max_count - counts.physical
    create = max(0, min(want, room, spec.step))
    if create:
        why = "floor" if floor_deficit >= demand_deficit else "demand"
        return Plan(create=create, reason=f"create {create} for {why} (demand {demand}, starting {counts.starting})")
    expired_holds = [p.name for p in pods
                     if p.state is PodState.IDLE and p.used and p.hold_until <= now]
    unused = sorted((p for p in pods if p.state is PodState.IDLE and not p.used and p.reserved_for is None
                     and not p.standby),
                    key=lambda p: p.idle_since)
    expired_unused = [p for p in unused if now - p.idle_since >= spec.keep_alive]
    keep = min(len(unused), max(spec.max_idle_count, 0))
    removable = max(0, counts.physical - counts.retiring - len(expired_holds) - spec.min_count)
    retire_unused = [p.name for p in expired_unused][: max(0, min(len(unused) - keep, removable))]
    retire = tuple(expired_holds + retire_unused)
    if retire:
        return Plan(retire=retire, reason=f"retire {len(expired_holds)} expired holds, "
                                          f"{len(retire_unused)} idle past keep-alive")
    return Plan(reason="steady")


class PoolController:
    def __init__(self, *, clock: Clock, backend: Backend, tracker: Tracker, pools: Mapping[str, PoolSpec],
                 tasks: Supervisor, stats: Stats, on_ready: Callable[[], None], tick: float = 1.0) -> None:
        self.clock = clock
        self.backend = backend
        self.tracker = tracker
        self.pools = dict(pools)
        self.tasks = tasks
        self.stats = stats
        self.on_ready = on_ready
        self.tick = tick
        self.demand: dict[str, int] = {}
        self.single_use: dict[str, tuple[str, int]] = {}
        """job id -> (pool, pods) of unplaced single-use jobs."""
        self._reserved_started: dict[str, int] = {}
        self.last_plan: dict[str, Plan] = {}
        self._loop = Wakeable(clock, tick, self.reconcile_once)
        self.wake = self._loop.wake
        self.run = self._loop.run
        self._backoff_until: dict[str, float] = {}
        self._sweeping = False

    def report_demand(self, demand: Mapping[str, int], single_use: Mapping[str, tuple[str, int]]) -> None:
        """The dispatcher's view after a pass: pods missing per pool, and unplaced single-use jobs."""
        changed = dict(demand) != self.demand or set(single_use) != set(self.single_use)
        self.demand = dict(demand)
        self.single_use = dict(single_use)
        if changed:
            self.wake()

    def reconcile_once(self) -> dict[str, Plan]:
        """Observe, plan and act for every pool; returns the plans (for tests and /v1/pools)."""
        now = self.clock.now()
        by_pool: dict[str, list[Pod]] = {name: [] for name in self.pools}
        for pod in self.tracker.snapshot():
            by_pool.setdefault(pod.pool, []).append(pod)
        plans: dict[str, Plan] = {}
        for name, spec in self.pools.items():
            pods = by_pool.get(name, [])
            counts = count(pods, spec, now)
            if self._backoff_until.get(name, 0.0) > now:
                plans[name] = Plan(reason="backing off after a failed create")
                continue
            p = plan(spec, pods, counts, self.demand.get(name, 0), now)
            plans[name] = p
            for _ in range(p.create):
                self._create(spec, Origin.DEMAND if self.demand.get(name) else Origin.WARM)
            for pod_name in p.retire:
                victim = self.tracker.pods.get(pod_name)
                if victim is not None:
                    self.retire(pod_name, only_if_idle_since=victim.idle_since)
            self._stage_standbys(spec, pods, now)
            room = spec.max_count - counts.physical - p.create
            for job_id, (pool, n) in self.single_use.items():
                if pool != name or job_id in self._reserved_started:
                    continue
                if room < n:
                    break
                room -= n
                self._reserved_started[job_id] = n
                for _ in range(n):
                    self._create(spec, Origin.SINGLE_USE, reserved_for=job_id)
        self.last_plan = plans
        return plans

    def _stage_standbys(self, spec: PoolSpec, pods: list[Pod], now: float) -> None:
        """Stage standbys into the open slots of active GPUs; retire those no card wants (broker.standby)."""
        if not self._sweeping and self.tracker.unverified_cards():
            self._sweeping = True
            self.tasks.spawn("standby sweep", self._sweep())
        staged = plan_standbys(spec, pods, now)
        for key in staged.create:
            self._create(spec, Origin.STANDBY, gpus=key)
        for name in staged.retire:
            victim = self.tracker.pods.get(name)
            if victim is not None:
                self.retire(name, only_if_idle_since=victim.idle_since)

    async def _sweep(self) -> None:
        """Re-verify card exclusivity after a restart; a failed read changes nothing this time."""
        try:
            infos = await self.backend.list_pods()
        except FirepoolError as exc:
            log.warning("standby sweep failed, promotions stay disabled: %s", exc)
        else:
            self.tracker.verify_cards(exclusive_cards(infos) & self.tracker.unverified_cards())
        finally:
            self._sweeping = False
        self.on_ready()

    def _create(self, spec: PoolSpec, origin: Origin, reserved_for: str | None = None,
                gpus: tuple[str, ...] = ()) -> None:
        name = f"{spec.name}-{secrets.token_hex(4)}"
        pod = Pod(name, spec.name, gpus, state=PodState.STARTING, origin=origin, template=spec.template_hash,
                  created_at=self.clock.now(), reserved_for=reserved_for)
        pod.standby = origin is Origin.STANDBY
        self.tracker.add(pod)
        self.tasks.spawn(f"create {name}", self._start_pod(pod, spec))

    async def _start_pod(self, pod: Pod, spec: PoolSpec) -> None:
        pin = group_key(pod) if pod.standby else ()
        try:
            info = await self.backend.create(PodRequest(name=pod.name, pool=spec, origin=pod.origin, gpus=pin,
                                                        annotations=owner_annotations(pod) if pod.standby else {}))
        except FirepoolError as exc:
            log.warning("creating pod %s failed: %s", pod.name, exc)
            self._backoff_until[spec.name] = self.clock.now() + 2.0
            if pod.reserved_for is not None:
                self._reserved_started.pop(pod.reserved_for, None)
            self.tracker.retire(pod.name)
            self.tracker.remove(pod.name)
            return
        self.stats.pods_created[spec.name] += 1
        if not self.tracker.ready(pod.name, self.clock.now(), info.gpus):
            await self._delete(pod.name)  # retired while starting
            return
        self.on_ready()

    def forget_single_use(self, job_id: str) -> None:
        """A single-use job was placed or ended: stop tracking its reservation."""
        self._reserved_started.pop(job_id, None)
        self.single_use.pop(job_id, None)

    def retire(self, name: str, *, only_if_idle_since: float | None = None) -> bool:
        """Retire a pod now (it must not be busy); its deletion runs in the background."""
        if self.tracker.retire(name, only_if_idle_since=only_if_idle_since) is None:
            return False
        self.tasks.spawn(f"delete {name}", self._delete(name))
        return True

    def delete_retiring(self, name: str) -> None:
        """Delete a pod the tracker already moved to RETIRING (unclean reset, lost, single-use)."""
        self.tasks.spawn(f"delete {name}", self._delete(name))

    async def _delete(self, name: str) -> None:
        try:
            await self.backend.delete(name)
        except FirepoolError as exc:
            log.warning("deleting pod %s failed (will be retried by recovery): %s", name, exc)
        pod = self.tracker.pods.get(name)
        self.tracker.remove(name)
        if pod is not None:
            self.stats.pods_deleted[pod.pool] += 1
        self.wake()
