"""The pool controller: creates pods for queued demand and the floor, retires expired and unwanted ones.

Each pass works in two steps (STYLE 5): observe counts from a tracker snapshot, then act — create pods
through the backend, retire pods whose keep-alive or owner hold expired. The plan itself is a pure
function of the counts, the pool spec, the demand and the clock (`plan`), so tests run it one tick at a
time. The dispatcher reports demand after every pass and wakes the controller; the loop also wakes at the
next keep-alive or hold expiry, and every 30 s at the latest. Each create first reserves its GPUs in the
budget ledger (or borrowed capacity). Idle pods no queued job can take give way when the ceiling blocks
queued jobs (broker.warmth.holds), single-use jobs get whole sets of pods made for them and pods made for
a job that left retire at once (broker.warmth.singleuse), stale pods drain after a template change, and
borrowed pods go back when their owner reclaims; a gang confined to one node or domain gets a whole set
made for it there. Starts and deletions run as supervised tasks, off the claim path (broker.warmth.creating);
the budget and borrowed-capacity books are broker.warmth.accounting's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from broker.claiming.reserving import restart_estimate
from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.events import EventLog
from broker.fleet.nodes import Fleet, Node
from broker.pods import Origin, Pod, PodState, SessionKey
from broker.pools import PoolSpec
from broker.ports.backend import Backend, PodInfo
from broker.stats import Stats
from broker.tasks import Supervisor, Wakeable
from broker.warmth import placing
from broker.warmth.borrowing import Borrowing
from broker.warmth.budgets import Ledger
from broker.warmth.creating import Creating
from broker.warmth.holds import MIN_TENURE_S, BlockedSet, breaks_for_sets, hold_units
from broker.warmth.rollout import drain
from broker.warmth.scaling import Counts, Plan, blocked_at_ceiling, count, plan
from broker.warmth.singleuse import gang_hints, made_on, orphans, scattered, set_orphans, wanted, wanted_sets
from broker.warmth.standby import exclusive_cards, plan_standbys

MIN_GAP_S = 0.005
"""Reconcile passes woken in quick succession (a fan-out ends a job and holds a pod every few milliseconds) run at
most this often: a pod takes seconds to start, and a pass costs the broker ~0.2 ms."""
LAZY_GAP_S = 0.05
"""How soon a pass follows a change that asks for nothing new (less demand, a pod back from its reset): at fan-out
rates those come every few milliseconds, and more demand or a lost pod still wakes the loop at once."""

log = logging.getLogger("firepool.pooling")

__all__ = ["Counts", "Plan", "PoolController", "count", "plan"]


RECONCILE_S = 30.0
"""Default reconcile interval (paper App. A.5); demand changes and expiries wake the loop sooner."""


def _more(now: Mapping[str, int], before: Mapping[str, int]) -> bool:
    """Whether any count in `now` is above its count `before`."""
    return any(n > before.get(key, 0) for key, n in now.items())


class PoolController(Creating):
    def __init__(self, *, clock: Clock, backend: Backend, tracker: Tracker, pools: Mapping[str, PoolSpec],
                 tasks: Supervisor, stats: Stats, on_ready: Callable[[], None], tick: float = RECONCILE_S,
                 budgets: Mapping[str, float] | None = None, borrowing: Borrowing | None = None,
                 hold_tenure: float = MIN_TENURE_S, min_gap: float = MIN_GAP_S) -> None:
        self.clock = clock
        self.backend = backend
        self.tracker = tracker
        self.pools = dict(pools)
        self.tasks = tasks
        self.stats = stats
        self.on_ready = on_ready
        self.tick = tick
        self.demand: dict[str, int] = {}
        self.queued_by: dict[str, dict[str, int]] = {}
        """pool -> caller -> pods of that caller's queued jobs (owners with queued jobs keep their holds)."""
        self.takers: dict[str, dict[str, int]] = {}
        """pool -> caller -> pods of queued jobs that take the caller's held pods only at the ceiling (a `boundary`
        pool's, or `recycle: false`): no supply below it, but spared when holds break (a takeover serves them)."""
        self.over_quota: dict[str, dict[str, int]] = {}
        """pool -> caller -> of those, pods waiting on the caller's quota: they spare no hold (they could not
        take a held pod now, and the caller's own finishing jobs bring theirs back)."""
        self.single_use: dict[str, tuple[str, int]] = {}
        """job id -> (pool, pods) of unplaced single-use jobs (custom-image jobs too)."""
        self.images: dict[str, tuple[str, bool]] = {}
        """job id -> (custom image, reusable: digest-pinned) of the unplaced single-use jobs that bring one."""
        self.sets: dict[str, tuple[str, int]] = {}
        """job id -> (pool, pods) of gangs confined to one node or domain that no pods in place could serve: a
        whole set is made for each on one node (or domain), reserved for it (broker.claiming.setsearch)."""
        self.confined: dict[str, str] = {}
        """job id -> `node` | `domain` of the waiting confined jobs (single-use sets are placed so too)."""
        self.set_owners: dict[str, tuple[SessionKey, bool]] = {}
        """job id -> (session, recycle) of each gang in `sets`: whose held pods its claim may take."""
        self.set_ceilings: dict[str, dict[str, int]] = {}
        """pool -> {`node`, `domain`} -> the most pods one node (domain) of it can ever hold, from the backend's
        nodes (placing.set_ceilings; replaced whole, never below an earlier pass's under the same catalog): a
        confined gang larger never runs."""
        self.set_largest: dict[str, dict[str, str]] = {}
        """pool -> {`node`, `domain`} -> which node (domain) holds that ceiling (placing.largest_names)."""
        self._measured: list[Node] | None = None
        """The node list `set_ceilings` was measured on."""
        self.gangs: dict[str, list[tuple[str, int]]] = {}
        """pool -> waiting gangs (job id, pods) in dispatch order: demand pods are made for them, side by side."""
        self.waiting: Callable[[str], bool] = lambda job_id: False
        """Whether a job is queued or being bound (the dispatcher sets it): its single-use pods are no orphans."""
        self.last_plan: dict[str, Plan] = {}
        self.ledger = Ledger(budgets)
        """GPUs (CPU cores) reserved per accelerator across all pools, before every create."""
        self.borrowing = borrowing
        self.hold_tenure = hold_tenure
        self.holds_broken: dict[str, int] = {}
        self.events: EventLog | None = None
        """Where hold breaks and budget throttling are recorded (broker.events); None: nowhere."""
        self.throttled: set[str] = set()
        """Pools whose creates the accelerator budget holds back now (one event when it starts)."""
        self._loop = Wakeable(clock, tick, self.reconcile_once, min_gap=min_gap, lazy_gap=LAZY_GAP_S)
        self.wake = self._loop.wake
        self.nudge = self._loop.nudge
        self.run = self._loop.run
        self._backoff_until: dict[str, float] = {}
        self._gang_sizes: dict[str, int] = {}
        self._gang_batches: dict[str, list[str]] = {}
        self._open_batches: dict[str, list[str]] = {}
        self._gang_topologies: dict[str, str] = {}
        self._sweeping = False
        self.avoid: Callable[[], frozenset[str]] = frozenset
        """Devices no new pod may get (broker.health.quarantine sets it)."""
        self.created: Callable[[Pod, PodInfo], None] | None = None
        """Told of every pod the backend started (broker.health learns its node)."""

    def report_demand(self, demand: Mapping[str, int], single_use: Mapping[str, tuple[str, int]],
                      queued_by: Mapping[str, Mapping[str, int]] | None = None,
                      over_quota: Mapping[str, Mapping[str, int]] | None = None,
                      images: Mapping[str, tuple[str, bool]] | None = None,
                      gangs: Mapping[str, list[tuple[str, int]]] | None = None,
                      sets: Mapping[str, tuple[str, int]] | None = None,
                      confined: Mapping[str, str] | None = None,
                      set_owners: Mapping[str, tuple[SessionKey, bool]] | None = None,
                      takers: Mapping[str, Mapping[str, int]] | None = None) -> None:
        """The dispatcher's view after a pass: pods missing per pool (and per caller, and of those how many wait
        on their caller's quota), unplaced single-use jobs, gangs that wait for a whole set on one node or
        domain (and whose session each is, and whether it may recycle), and which waiting jobs are confined so
        (job -> `node` | `domain`)."""
        by = {pool: dict(callers) for pool, callers in (queued_by or {}).items()}
        quota = {pool: dict(callers) for pool, callers in (over_quota or {}).items()}
        self.takers = {pool: dict(callers) for pool, callers in (takers or {}).items()}
        changed = (dict(demand) != self.demand or set(single_use) != set(self.single_use)
                   or by != self.queued_by or quota != self.over_quota or set(sets or {}) != set(self.sets))
        # More wanted (pods, a caller's waiting jobs, single-use pods or sets, room freed from a quota) is acted
        # on at once; less of it can wait for a lazy pass.
        wants_more = (_more(demand, self.demand) or not set(single_use) <= set(self.single_use)
                      or not set(sets or {}) <= set(self.sets)
                      or any(_more(callers, self.queued_by.get(pool, {})) for pool, callers in by.items())
                      or any(_more(callers, quota.get(pool, {})) for pool, callers in self.over_quota.items()))
        self.demand = dict(demand)
        self.single_use = dict(single_use)
        self.sets = dict(sets or {})
        self.set_owners = dict(set_owners or {})
        self.confined = dict(confined or {})
        self.images = dict(images or {})
        self.gangs = {pool: list(waiting) for pool, waiting in (gangs or {}).items()}
        self.queued_by = by
        self.over_quota = quota
        if wants_more:
            self.wake()
        elif changed:
            self.nudge()

    def update_pools(self, pools: Mapping[str, PoolSpec]) -> None:
        """A reloaded catalog: changed templates make older pods stale, and they drain from the next pass."""
        self.pools = dict(pools)
        self._measured = self.backend.nodes()
        self.set_ceilings = placing.set_ceilings(self._measured, self.pools)  # a new catalog: measured afresh
        self.set_largest = placing.largest_names(self._measured, self.pools, self.set_ceilings)
        self.wake()

    def reconcile_once(self) -> dict[str, Plan]:
        """Observe, plan and act for every pool; returns the plans (for tests and /v1/pools)."""
        now = self.clock.now()
        nodes = self.backend.nodes()
        self.tracker.set_domains({node.id: node.domain_key for node in nodes})
        if nodes != self._measured:  # comparing costs a tenth of measuring them again (128 nodes)
            self._measured = nodes
            self.set_ceilings = placing.set_ceilings(nodes, self.pools, self.set_ceilings)
            self.set_largest = placing.largest_names(nodes, self.pools, self.set_ceilings, self.set_largest)
        snapshot = self.tracker.snapshot()
        self._sync_ledgers(snapshot)
        by_pool: dict[str, list[Pod]] = {name: [] for name in self.pools}
        for pod in snapshot:
            by_pool.setdefault(pod.pool, []).append(pod)
        if self.borrowing is not None:
            self._preempt_borrowed()
        plans: dict[str, Plan] = {}
        full: set[str] = set()
        for name, spec in self.pools.items():
            pods = by_pool.get(name, [])
            queued_by = self.queued_by.get(name, {})
            counts = count(pods, spec, now, queued_by)
            orphaned = orphans(pods, self._single_use_waiting)
            for pod in orphaned:  # whatever else this pass decides: no job may ever take them
                self.retire(pod.name, only_if_idle_since=None if pod.state is PodState.STARTING else pod.idle_since)
            self.tracker.unreserve(set_orphans(pods, self._single_use_waiting))  # plain pool pods from now on
            if self._backoff_until.get(name, 0.0) > now:
                plans[name] = Plan(reason="backing off after a failed create")
                continue
            demand = self.demand.get(name, 0)
            headroom = self.headroom(spec)
            if headroom is not None and headroom <= 0:
                full.add(name)
            singles = wanted(self.single_use, name, pods)
            p = plan(spec, pods, counts, demand, now, headroom, single_use=sum(n for _, n in singles))
            created = 0
            hints = gang_hints(self.gangs.get(name, ()), pods, p.create) if demand else []
            for i, node in enumerate(self.where(spec, p.create)):
                if not self._create(spec, Origin.DEMAND if demand else Origin.WARM, node=node,
                                    gang=hints[i] if i < len(hints) else ("", 1)):
                    break
                created += 1
            if created < p.create:
                why = f"budget of {spec.accelerator}" if len(self.where(spec, p.create)) >= p.create else \
                    "the pool's node set"
                p = Plan(create=created, reason=f"{p.reason}; {why} allowed {created}")
            self._note_throttle(spec, p, created, demand)
            made, blocked_sets, spared = self._make_sets(spec, pods, singles,
                                                         spec.max_count - counts.physical - created)
            created += made
            retire = list(p.retire)
            # Pods already retiring free their room soon: break holds only for what they will not cover.
            freeing = counts.retiring + len(orphaned)
            plain = blocked_at_ceiling(spec, counts, demand, headroom)
            quota = self.over_quota.get(name, {})
            spare = {owner: n - quota.get(owner, 0) for owner, n in queued_by.items()}
            for owner, n in self.takers.get(name, {}).items():  # they take their caller's held pods over
                spare[owner] = spare.get(owner, 0) + n
            for owner, n in spared.items():  # held pods that complete a waiting confined gang's set are its
                spare[owner] = spare.get(owner, 0) + n
            broken: list[Pod] = []
            if not created and (plain > freeing or blocked_sets):
                units = hold_units(pods, spare, now, self.hold_tenure, warm_demand=demand - sum(quota.values()))
                first = max(0, plain - freeing)  # the plain jobs' pods come first
                broken = [p for unit in units[:first] for p in unit]
                if blocked_sets:  # a set is made whole or not at all: break only what lets it be made
                    room = 0 if plain else max(0, min(spec.max_count - counts.physical,
                                                      spec.max_count if headroom is None else headroom))
                    broken += breaks_for_sets(units[first:], blocked_sets, room + max(0, freeing - plain), spec,
                                              self._fleet_after_retiring)
            blocked = plain + sum(s.pods for s in blocked_sets) - freeing
            broken = [b for b in broken if b.name not in retire]
            retire += [b.name for b in broken]
            rollout = drain(spec, pods, now)
            retire += [n for n in rollout.retire if n not in retire]
            notes = []
            if orphaned:
                notes.append(f"retired {len(orphaned)} single-use pods whose job left")
            if broken:
                self.holds_broken[name] = self.holds_broken.get(name, 0) + len(broken)
                self._note_holds_broken(spec, broken, blocked)
                notes.append(f"broke {len(broken)} holds at the ceiling")
            if rollout.retire or rollout.mark:
                notes.append(f"draining {len(rollout.retire) + len(rollout.mark)} stale")
            if notes:
                p = Plan(create=p.create, retire=tuple(retire), reason="; ".join([p.reason, *notes]))
            plans[name] = p
            for pod_name in retire:
                victim = self.tracker.pods.get(pod_name)
                if victim is None:
                    continue
                if victim.state is PodState.STARTING:
                    self.retire(pod_name)
                else:
                    self.retire(pod_name, only_if_idle_since=victim.idle_since)
            for pod_name in rollout.mark:
                self.tracker.retire_at_release(pod_name)
            self._stage_standbys(spec, pods, now)
        self._open_batches.clear()  # a gang's pods of a later pass form a batch of their own
        self.last_plan = plans
        self._note_budget_full(frozenset(full))
        self._loop.tick = self._next_tick(snapshot, now)
        return plans

    def _fleet_after_retiring(self) -> Fleet:
        """The fleet as it will be once the retiring pods are gone (their room is counted free for sets)."""
        pods = [p for p in self.tracker.snapshot() if p.state is not PodState.RETIRING]
        return placing.fleet_of(self.backend.nodes(), pods, self.pools, self.avoid())

    def _note_holds_broken(self, spec: PoolSpec, broken: list[Pod], blocked: int) -> None:
        if self.events is None:
            return
        restart = restart_estimate(spec)  # the cold start the owner's next job pays instead
        for pod in broken:
            self.events.emit("hold.broken", pod.name,
                             f"pool {spec.name} at its ceiling with {blocked} queued pods blocked: the idle pod "
                             f"{pod.caller or 'nobody'} held retires so they can run",
                             restart * max(1, spec.gpus) if restart else None, pod.caller,
                             {"pool": spec.name, "blocked_pods": blocked})

    def _stage_standbys(self, spec: PoolSpec, pods: list[Pod], now: float) -> None:
        """Stage standbys into the open slots of active GPUs; retire those no card wants (broker.warmth.standby)."""
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

    def _make_sets(self, spec: PoolSpec, pods: list[Pod], singles: list[tuple[str, int]],
                   room: int) -> tuple[int, list[BlockedSet], dict[str, int]]:
        """Pods made for one job, in dispatch order: single-use and custom-image sets, then gangs confined to a
        node or domain. Each job's whole set or nothing: pods made for one job serve no other, so a part of a
        set would hold room another job could run in (two half-made sets deadlock). A confined gang's set counts
        the idle pods held for its caller that its claim takes (placing.held_beside): only the rest is made,
        beside them, and they keep their hold at the ceiling; a whole set elsewhere when there is no room beside
        them. (pods made, the sets not made, caller -> held pods counted into sets)"""
        created = 0
        blocked: list[BlockedSet] = []
        spared: dict[str, int] = {}
        for job_id, (pool, _n) in self.sets.items():
            apart = scattered(pods, job_id) if pool == spec.name and self.confined.get(job_id) == "node" else []
            if apart:  # they join the pool; the rest of the set is made beside its largest part
                log.warning("pods made for %s landed on %d nodes; %d of them join the pool", job_id,
                            len({p.node for p in apart}) + 1, len(apart))
                self.tracker.unreserve(apart)
        todo = [(job_id, n, False) for job_id, n in singles]
        todo += [(job_id, n, True) for job_id, n in wanted_sets(self.sets, spec.name, pods)]
        for job_id, n, gang in todo:
            fits = self.headroom(spec)
            where = self.confined.get(job_id, "")
            near = made_on(pods, job_id)
            owner = self.set_owners.get(job_id) if gang else None
            held = placing.held_beside(self.fleet(), pods, owner, where, near, self.clock.now())[:n] if owner else []
            if held and where:
                nodes = placing.where_set(self.fleet(), spec, n - len(held), where, near + [p.node for p in held])
                if n > len(held) and not nodes:  # no room beside them: a whole set elsewhere
                    held, nodes = [], placing.where_set(self.fleet(), spec, n, where, near)
            elif where:
                nodes = placing.where_set(self.fleet(), spec, n, where, near)
            else:
                nodes = self.where(spec, n)
            if held and owner:  # they complete the set (its claim takes them) and keep their hold at the ceiling
                (caller, _, _), _ = owner
                spared[caller] = spared.get(caller, 0) + len(held)
                n -= len(held)
                if n <= 0:
                    continue
            if room < n or (fits is not None and fits < n) or len(nodes) < n:
                blocked.append(BlockedSet(n, where, tuple(near + [p.node for p in held]) if where else ()))
                continue
            room -= n
            created += n
            image, reusable = self.images.get(job_id, ("", False))
            origin = Origin.DEMAND if gang else Origin.CUSTOM_IMAGE if image and reusable else Origin.SINGLE_USE
            size = self.sets[job_id][1] if gang else 1
            for node in nodes:  # headroom checked above
                self._create(spec, origin, reserved_for=job_id, node=node, image=image, gang=(job_id, size) if gang
                             else ("", 1))
        return created, blocked, spared

    def _next_tick(self, snapshot: list[Pod], now: float) -> float:
        """Sleep until the next keep-alive or hold expiry (or hold tenure), at most the reconcile interval."""
        soonest = self.tick
        for until in self._backoff_until.values():
            if until > now:
                soonest = min(soonest, until - now + 1e-3)
        for pod in snapshot:
            if pod.state is not PodState.IDLE:
                continue
            spec = self.pools.get(pod.pool)
            if spec is None:
                continue
            dues = [pod.hold_until, pod.created_at + self.hold_tenure] if pod.used else [pod.idle_since + spec.keep_alive]
            for due in dues:
                if due > now:
                    soonest = min(soonest, due - now + 1e-3)
        return soonest

    def _preempt_borrowed(self) -> None:
        """Give borrowed GPUs back to their owner when the published ceiling dropped, newest first."""
        assert self.borrowing is not None
        pre = self.borrowing.preempt(self.tracker.pods)
        for pod_name in pre.retire:
            self.retire(pod_name)
        for pod_name in pre.mark:
            self.tracker.retire_at_release(pod_name)
        if pre.retire or pre.mark:
            log.info("preempted %d borrowed pods (%.0f GPUs) for their owner", len(pre.retire) + len(pre.mark),
                     pre.gpus)
        if self.events is not None:
            for pod_name, busy in [(n, False) for n in pre.retire] + [(n, True) for n in pre.mark]:
                pod = self.tracker.pods.get(pod_name)
                caller = pod.caller if pod is not None else None
                if pod is not None and pod.job is not None:  # a busy pod's caller is its job's
                    caller = next((lease.caller for lease in self.tracker.leases() if lease.job_id == pod.job), caller)
                self.events.emit("capacity.reclaimed", pod_name,
                                 "the capacity owner reclaimed borrowed GPUs (newest borrowed pod first): "
                                 + ("it retires when its job ends; the job is not stopped" if busy else "it retires now"),
                                 None, caller, {"busy": busy})

    def forget_single_use(self, job_id: str) -> None:
        """A single-use job was placed: its pods are leased, nothing more to make for it."""
        self.single_use.pop(job_id, None)
        self.images.pop(job_id, None)

    def abandon_single_use(self, job_id: str) -> None:
        """A single-use job left the queue (cancelled, failed): the pods made for it retire at once,
        starting or idle, since no other job may ever take them."""
        self.single_use.pop(job_id, None)
        self.images.pop(job_id, None)
        for pod in orphans(self.tracker.snapshot(), lambda waiting: waiting != job_id):
            self.retire(pod.name, only_if_idle_since=None if pod.state is PodState.STARTING else pod.idle_since)

    def _single_use_waiting(self, job_id: str) -> bool:
        """A job pods are made for still waits: its single-use or confined set, or the dispatcher has it."""
        return job_id in self.single_use or job_id in self.sets or self.waiting(job_id)
