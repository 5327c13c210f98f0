"""The control plane: tracker, job book, dispatcher, executor and pool controller wired over three ports.

This is what the REST API (and the simulator) calls. It knows callers only as verified names: a job of
another caller is "not found". Nothing here imports a web framework, a database driver or a cluster
client; `broker.server` builds the adapters and hands them in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from broker.claiming.dispatching import Dispatcher
from broker.claiming.jobbook import Abort, JobBook
from broker.claiming.preempting import Preempter
from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.errors import Conflict, FirepoolError, InvalidRequest, NotFound
from broker.events import Event, EventLog
from broker.fleet.quotas import QuotasSpec, QuotaTree
from broker.health.monitor import HealthMonitor
from broker.health.quarantine import Quarantine
from broker.intake import Intake, Watch
from broker.jobs import SIGNALS, ErrorClass, Job, JobSpec, JobState, transition
from broker.pods import PodState
from broker.pools import Catalog
from broker.ports.agent import LogChunk
from broker.ports.backend import Backend
from broker.ports.capacity import CapacitySource
from broker.ports.logs import STREAMS, LogStore
from broker.ports.quarantine import MemoryQuarantineStore, QuarantineStore
from broker.ports.store import JobStore
from broker.recovery import RecoveryReport, log_ready, recover
from broker.running.delivering import PackageDelivery
from broker.running.executing import Executor
from broker.running.heartbeat import EVERY_S, Heartbeat
from broker.running.kernelconns import KernelConnections
from broker.running.kernelwarm import KernelWarmth
from broker.running.logretention import LogRetention, LogSweeper
from broker.running.packages import PackageStore
from broker.running.sessionstreams import SessionStreams
from broker.stats import Stats
from broker.tasks import Supervisor
from broker.warmth.borrowing import Borrowing
from broker.warmth.fleetview import fleet_view, placeable_view
from broker.warmth.pooling import MIN_GAP_S, PoolController, count
from broker.warmth.poolview import pool_view

log = logging.getLogger("firepool.control")


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Timings of the control loops; defaults are production values."""

    dispatch_tick_s: float = 3.0
    """Fallback dispatch pass when no event woke the dispatcher."""
    reconcile_tick_s: float = 30.0
    """Pool controller pass at the latest; demand changes and keep-alive/hold expiries wake it sooner."""
    reconcile_min_gap_s: float = MIN_GAP_S
    """Pool controller passes woken in quick succession run at most this often (broker.warmth.pooling)."""
    capacity_poll_s: float = 10.0
    """How often a borrowed-capacity source is read."""
    kill_grace_s: float = 5.0
    """TERM -> KILL grace when a caller cancels a running job."""
    node_check_s: float = 10.0
    """How often the nodes' boot epochs are read and judged (R5: a rebooted node voids its pods)."""
    agent_heartbeat_s: float = EVERY_S
    """How often every pod's agent, idle ones included, hears from the leader (well within its orphan bound);
    0: never (a simulation, whose pods have no agents that could orphan themselves)."""


class ControlPlane:
    def __init__(self, *, clock: Clock, store: JobStore, backend: Backend, logs: LogStore, catalog: Catalog,
                 tuning: Tuning = Tuning(), capacity: CapacitySource | None = None,
                 packages: PackageStore | None = None, quarantine: QuarantineStore | None = None,
                 log_retention: LogRetention = LogRetention()) -> None:
        self.clock = clock
        self.store = store
        self.backend = backend
        self.logs = logs
        self.catalog = catalog
        self.packages = packages
        self.stats = Stats()
        self.tasks = Supervisor()
        self.log_sweeper = LogSweeper(clock, logs, log_retention)
        self.tracker = Tracker(catalog.pools, catalog.caller_limits, catalog.quotas)
        self.events = EventLog(store, clock)
        self.quota_tree: QuotaTree | None = None
        self.book = JobBook(store, clock)
        self.controller = PoolController(clock=clock, backend=backend, tracker=self.tracker, pools=catalog.pools,
                                         tasks=self.tasks, stats=self.stats, on_ready=self._pod_ready,
                                         tick=tuning.reconcile_tick_s, min_gap=tuning.reconcile_min_gap_s,
                                         budgets=catalog.budgets,
                                         borrowing=Borrowing(capacity, clock, tuning.capacity_poll_s)
                                         if capacity is not None else None)
        self.kernels = KernelWarmth(clock=clock, tracker=self.tracker, backend=backend)
        self.health = HealthMonitor(Quarantine(catalog.quarantine, quarantine or MemoryQuarantineStore(), clock),
                                    self.tracker, self.controller, reader=getattr(backend, "gpu_health", None))
        self.dispatcher = Dispatcher(clock=clock, book=self.book, tracker=self.tracker, controller=self.controller,
                                     tasks=self.tasks, stats=self.stats, tick=tuning.dispatch_tick_s)
        self.executor = Executor(clock=clock, book=self.book, tracker=self.tracker, backend=backend,
                                 controller=self.controller, logs=logs, tasks=self.tasks, stats=self.stats,
                                 wake_dispatcher=self.dispatcher.wake, requeue=self.dispatcher.enqueue,
                                 kill_grace_s=tuning.kill_grace_s,
                                 delivery=PackageDelivery(packages) if packages is not None else None,
                                 kernels=self.kernels, health=self.health)
        self.dispatcher.executor = self.executor
        self.book.writer.settled = self.executor.settled
        self.intake = Intake(clock=clock, catalog=catalog, book=self.book, queue=self.dispatcher,
                             ceilings=self.controller, quota_tree=lambda: self.quota_tree,
                             runs_images=bool(getattr(backend, "runs_images", False)), packages=packages)
        self.connections = KernelConnections(clock=clock, jobs=self.book, launched=self.executor.launched,
                                             leases=self.tracker, agents=backend)
        self.heartbeat = Heartbeat(clock, self.tracker, backend, tuning.agent_heartbeat_s)
        """Keeps every pod's agent from orphaning itself while this broker leads (`broker.running.heartbeat`)."""
        self.streams = SessionStreams(self.tracker, backend, self.book.live)
        """Kernel jobs' connection info, fetched from their agents for their owners (`broker.api.access`)."""
        self.controller.events = self.events
        self.health.quarantine.events = self.events
        self.dispatcher.events = self.events
        self._reload_quotas(catalog.quotas)
        self.tuning = tuning
        self.recovery: RecoveryReport | None = None
        self.started_at: float | None = None
        self.dispatching_at: float | None = None

    def _pod_ready(self) -> None:
        self.dispatcher.wake()
        self.kernels.wake()  # a new pod of a pool that serves kernels keeps one from its start

    # ---------------------------------------------------------------- lifecycle

    async def start(self, *, loops: bool = True) -> None:
        """Recover, then start the dispatch and reconcile loops (tests may drive them by hand)."""
        self.started_at = self.clock.now()
        self.recovery = await recover(self)  # it loads the quarantine first: a quarantined card gets no pod back
        self.health.check_nodes(self.backend.nodes())  # after recovery: the pods it kept are judged as they stand
        self.health.drain()
        await self.health.prime([d.key for d in self.backend.devices()])
        if loops:
            self.tasks.spawn("dispatcher", self.dispatcher.run(), critical=True)
            self.tasks.spawn("pool controller", self.controller.run(), critical=True)
            self.tasks.spawn("kernel warmth", self.kernels.run())
            self.tasks.spawn("event log", self.events.run())
            self.tasks.spawn("node epochs", self._watch_nodes())
            self.tasks.spawn("log retention", self.log_sweeper.run())
            if self.tuning.agent_heartbeat_s > 0:
                self.tasks.spawn("agent heartbeat", self.heartbeat.run())
            if self.controller.borrowing is not None:
                self.tasks.spawn("capacity source", self.controller.borrowing.run(self.controller.wake), critical=True)
        elif self.controller.borrowing is not None:
            self.controller.borrowing.refresh()
        self.dispatching_at = self.clock.now()
        self.dispatcher.wake()
        self.controller.wake()
        log_ready(self.recovery, self.started_at, self.dispatching_at)

    async def _watch_nodes(self) -> None:
        """Read the nodes (a backend that lists them anew: a cluster) and judge their boot epochs, forever."""
        refresh = getattr(self.backend, "refresh_nodes", None)
        while True:
            await self.clock.sleep(self.tuning.node_check_s)
            if refresh is not None:
                await refresh()
            self.health.check_nodes(self.backend.nodes())

    async def stop(self, *, delete_idle_pods: bool = False) -> None:
        """Stop the loops. Busy pods keep running so a restarted broker re-attaches to their jobs;
        idle pods are deleted too when asked (a local broker shutting down for good)."""
        await self.tasks.stop()
        try:
            await self.events.flush()
        except FirepoolError as exc:
            log.warning("writing the last events failed: %s", exc)
        await self.book.close()
        if delete_idle_pods:
            idle = [p.name for p in self.tracker.snapshot() if p.state in (PodState.IDLE, PodState.STARTING)]
            await asyncio.gather(*(self.backend.delete(name) for name in idle), return_exceptions=True)
        await self.backend.close()

    # ---------------------------------------------------------------- jobs

    async def submit(self, caller: str, spec: JobSpec) -> tuple[Job, bool]:
        """Admit and store a job; (job, created). The same idempotency key returns the first job."""
        return await self.intake.submit(caller, spec)

    async def submit_many(self, caller: str, specs: Sequence[JobSpec]) -> list[tuple[Job, bool]]:
        """A batch: every item admitted, then all stored in one transaction (broker.intake)."""
        return await self.intake.submit_many(caller, specs)

    async def watch(self, caller: str, ids: Sequence[str]) -> Watch:
        """Follow a set of the caller's jobs as they end (broker.intake.Watch)."""
        return await self.intake.watch(caller, ids)

    async def get(self, caller: str, job_id: str) -> Job:
        return await self.intake.owned(caller, job_id)

    async def wait(self, caller: str, job_id: str, wait_s: float) -> Job:
        """The job once terminal, or as it stands after `wait_s` seconds."""
        deadline = self.clock.now() + max(0.0, wait_s)
        job = await self.get(caller, job_id)
        while not job.terminal and (left := deadline - self.clock.now()) > 0:
            await self.book.wait_change(job_id, left)
            job = await self.get(caller, job_id)
        return job

    async def list_jobs(self, caller: str, *, states: Iterable[JobState] | None = None, limit: int = 100,
                        before: str | None = None) -> list[Job]:
        states = list(states) if states is not None else None
        return await self.book.io(lambda: self.store.list_jobs(caller=caller, states=states, limit=limit,
                                                               before=before))

    async def cancel(self, caller: str, job_id: str) -> Job:
        """Cancel a queued job at once, or kill a running one (it ends CANCELLED)."""
        await self.get(caller, job_id)
        now = self.clock.now()

        def cancel(job: Job) -> Job:
            if job.state in (JobState.PENDING, JobState.QUEUED):
                if job.id in self.dispatcher.binding:
                    return dataclasses.replace(job, cancel_requested=True, version=job.version + 1)
                return transition(job, JobState.CANCELLED, now, error_class=ErrorClass.CANCELLED,
                                  error_message="cancelled while queued")
            if job.state is JobState.RUNNING and not job.cancel_requested:
                return dataclasses.replace(job, cancel_requested=True, version=job.version + 1)
            raise Abort

        job = await self.book.write(job_id, cancel)
        if job is None:
            return await self.get(caller, job_id)
        if job.state is JobState.CANCELLED:
            self.dispatcher.drop(job_id)
        elif job.state is JobState.RUNNING:
            await self.executor.cancel(job_id)
        return job

    async def end_session(self, caller: str, tag: str, queue: str = "default") -> dict[str, Any]:
        """End a caller's session now: cancel its live jobs, retire its idle pods, retire busy ones at release.

        Owner-scoped: only the caller's own (caller, queue, tag) session is touched.
        """
        if not tag:
            raise InvalidRequest("a session tag is required (the untagged session cannot be ended)", {"field": "tag"})
        live = [j for j in self.book.live.values()
                if j.caller == caller and j.spec.lease_tag == tag and j.spec.queue == queue and not j.terminal]
        cancelled = []
        for job in live:
            try:
                await self.cancel(caller, job.id)
                cancelled.append(job.id)
            except NotFound:
                pass  # finished meanwhile
        retired, at_release = self.tracker.end_session((caller, queue, tag), {j.id for j in live})
        for name in retired:
            self.controller.delete_retiring(name)
        return {"tag": tag, "queue": queue, "cancelled_jobs": cancelled, "retired_pods": retired,
                "retiring_at_release": at_release}

    async def signal(self, caller: str, job_id: str, name: str) -> Job:
        """Send a signal to a running job's attempt (a kernel's interrupt, terminate or kill)."""
        signal = name.upper().removeprefix("SIG")
        if signal not in SIGNALS:
            raise InvalidRequest(f"signal must be one of {', '.join(SIGNALS)}", {"field": "signal"})
        job = await self.get(caller, job_id)
        if job.state is not JobState.RUNNING or not await self.executor.signal(job_id, signal):
            raise Conflict(f"job {job_id} has no running attempt to signal", {"job": job_id, "state": str(job.state)})
        return job

    async def list_events(self, caller: str | None, *, after_id: int | None = None, since: float | None = None,
                          limit: int = 100) -> list[Event]:
        """Events oldest first; `caller` None is an operator's view (all of them)."""
        await self.events.flush()
        return await self.book.io(lambda: self.store.list_events(after_id=after_id, since=since, caller=caller,
                                                                 limit=limit))

    def waiting_reason(self, job_id: str) -> str | None:
        return self.dispatcher.waiting_reason.get(job_id)

    async def read_log(self, caller: str, job_id: str, *, stream: str = "combined", offset: int = 0,
                       max_bytes: int = 1 << 20, wait_s: float = 0.0, attempt: int | None = None,
                       known: Job | None = None) -> LogChunk:
        """Output of an attempt (the latest by default): live from the agent while it runs, stored after.
        `known`: the ended job as this caller just read it (spares reading it again)."""
        if stream not in STREAMS:
            raise InvalidRequest(f"stream must be one of {STREAMS}", {"field": "stream"})
        job = known if known is not None and known.terminal and known.id == job_id else await self.get(caller, job_id)
        if not job.attempts:
            return LogChunk(b"", offset, job.terminal)
        chosen = job.attempts[-1] if attempt is None else next((a for a in job.attempts if a.n == attempt), None)
        if chosen is None:
            raise NotFound(f"job {job_id} has no attempt {attempt}")
        if self.executor.launched.get(job_id) == chosen.id:
            pods = self.tracker.pods_of(job_id)
            if pods:
                try:
                    return await self.backend.agent(pods[0].name).read_log(chosen.id, stream, offset, max_bytes, wait_s)
                except FirepoolError:
                    pass  # reset already took the agent's copy: the stored one is complete
        if self.logs.blocking:
            data = await asyncio.to_thread(self.logs.read, job.caller, chosen.id, stream, offset, max_bytes)
        else:
            data = self.logs.read(job.caller, chosen.id, stream, offset, max_bytes)
        if not data and offset == 0:
            self.log_sweeper.check(job.caller, job.id, chosen.launched_at, chosen.finished_at)
        done = job.terminal or chosen.finished_at is not None
        return LogChunk(data, offset + len(data), done and len(data) < max_bytes)

    # ---------------------------------------------------------------- views

    def reload_catalog(self, catalog: Catalog) -> None:
        """Apply a changed catalog: new knobs at once; pods of a changed template turn stale and drain."""
        self.catalog = dataclasses.replace(self.catalog, pools={**self.catalog.pools, **catalog.pools},
                                           caller_limits=catalog.caller_limits, budgets=catalog.budgets,
                                           create_rate=catalog.create_rate,
                                           topology_domain_labels=catalog.topology_domain_labels,
                                           quotas=catalog.quotas)
        self._reload_quotas(catalog.quotas)
        pace = getattr(self.backend, "set_create_rate", None)  # a backend that paces creates (a cluster's)
        if pace is not None:
            pace(catalog.create_rate.qps, catalog.create_rate.burst)
        relabel = getattr(self.backend, "set_domain_labels", None)  # a backend that reads node labels (a cluster's)
        if relabel is not None:
            relabel(catalog.topology_domain_labels)
        self.tracker.update_pools(self.catalog.pools)
        for accelerator in set(self.controller.ledger.view()) | set(catalog.budgets):
            self.controller.ledger.set_limit(accelerator, catalog.budgets.get(accelerator))
        self.controller.update_pools(self.catalog.pools)
        self.dispatcher.wake()

    def _reload_quotas(self, quotas: QuotasSpec | None) -> None:
        """Swap the team quota tree (docs/quotas.md): admission, the tracker's accounting and the preempter at
        once. Running jobs keep what they hold, recounted under the new tree; a removed team's jobs fall back
        to no guarantee. The preempter keeps its budget's trailing hour (only the tiers change)."""
        active = quotas if quotas is not None and quotas.orgs else None
        self.quota_tree = QuotaTree(active) if active is not None else None
        self.tracker.set_quotas(active)
        preempter = self.dispatcher.preempter
        if active is None:
            self.dispatcher.preempter = None
        elif preempter is None:
            self.dispatcher.preempter = Preempter(clock=self.clock, tracker=self.tracker, quotas=active,
                                                  events=self.events, tasks=self.tasks, preempt=self.executor.preempt)
        else:
            preempter.quotas = active
            preempter.budget.warn_pct = active.preemption_budget.warn_pct
            preempter.budget.limit_pct = active.preemption_budget.limit_pct

    def pools_view(self) -> list[dict[str, Any]]:
        now = self.clock.now()
        by_pool: dict[str, list[Any]] = {name: [] for name in self.catalog.pools}
        for pod in self.tracker.snapshot():
            by_pool.setdefault(pod.pool, []).append(pod)
        queued: dict[str, int] = {}
        for job in self.dispatcher.queued.values():
            queued[job.spec.pool] = queued.get(job.spec.pool, 0) + job.spec.pods
        fleet = self.controller.fleet()
        views = [{**pool_view(spec, count(by_pool[name], spec, now, self.controller.queued_by.get(name, {})),
                              queued.get(name, 0), self.controller.last_plan.get(name),
                              self.controller.borrowed(by_pool[name]), self.controller.holds_broken.get(name, 0),
                              self.controller.ledger), **placeable_view(fleet, spec)}
                 for name, spec in self.catalog.pools.items()]
        for view in views:  # fleet scheduling (docs/quotas.md): gang reservations, their capacity alerts
            view["reservations"] = [
                {"job": r.job_id, "caller": r.caller, "pods": r.pods, "held": held, "waiting_s": round(now - r.made_at, 3),
                 "aged": r.aged, "alert": r.alerted} for r, held in self.tracker.reservations(view["name"])]
            view["capacity_alerts"] = [r for r in view["reservations"] if r["alert"]]
            view["budget_throttled"] = view["name"] in self.controller.throttled
        return views

    def fleet_view(self) -> dict[str, Any]:
        """The nodes and, per accelerator (GPU model), what could still be placed (docs/fleet.md)."""
        return fleet_view(self.controller.fleet())

    def pods_view(self, pool: str | None = None) -> list[dict[str, Any]]:
        now = self.clock.now()
        out = []
        # A backend that records how its pods came up (a cluster's: scheduled, pulled, started, answered).
        ready_record = getattr(self.backend, "ready_record", None)
        for pod in self.tracker.snapshot():
            if pool is not None and pod.pool != pool:
                continue
            view = pod.snapshot()
            if view["caller"] is None and pod.job is not None and (job := self.book.live.get(pod.job)) is not None:
                # A pod takes its session's key at release: while it runs a job, the job says whose it is.
                view.update(caller=job.caller, lease_tag=job.spec.lease_tag or None, queue=job.spec.queue)
            view["held"] = pod.held(now)
            view["isolated"] = self.backend_isolated
            if ready_record is not None and (ready := ready_record(pod.name)) is not None:
                view["ready"] = ready
            out.append(view)
        return sorted(out, key=lambda v: str(v["name"]))

    @property
    def backend_isolated(self) -> bool:
        return bool(getattr(self.backend, "isolated", True))

    @property
    def backend_limits(self) -> dict[str, Any] | None:
        """How the backend enforces pod limits (cgroup version or off, and why), for /healthz."""
        info = getattr(self.backend, "limits_info", None)
        return dict(info) if info is not None else None
