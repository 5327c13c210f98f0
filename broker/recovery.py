"""Restart recovery: rebuild the tracker and the queue before the first dispatch.

The store is authoritative for jobs, the pod records (annotations) for ownership. For each job the
store says is RUNNING, the pods' agents are asked about its attempt: a live attempt is re-attached, one
that finished during the outage is finalised without a retry, and one whose pods are gone, that no
agent knows (never launched) or whose agent stays unreachable is re-queued under a new attempt id, its
pods deleted or reset. Every other pod is reset with proof before it is trusted again.

Identity epochs (design R5, broker.health.epochs) come first: a pod whose agent answers with another
epoch than the one recorded is not the pod work was bound to, so its job is re-queued, its hold dropped
and the pod deleted; a pod with no recorded epoch (first contact) keeps nothing bound to it either.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from broker.claiming.dispatching import Dispatcher
from broker.claiming.jobbook import Abort, JobBook
from broker.claiming.tracker import Tracker
from broker.claiming.tracking import Lease
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.events import EventLog
from broker.health.decisions import EPOCH_INVALIDATED, decided
from broker.health.epochs import Verdict, judge, recorded_epoch, reported_epoch
from broker.health.monitor import HealthMonitor
from broker.jobs import AttemptState, ErrorClass, Job, JobState, transition
from broker.pods import Pod, PodState, restore_owner
from broker.pools import Catalog
from broker.ports.agent import AgentHealth, AttemptStatus, ResetRequest
from broker.ports.backend import Backend, PodInfo
from broker.running.executing import Executor
from broker.running.returning import reset_request
from broker.tasks import Supervisor

log = logging.getLogger("firepool.recovery")


class Recoverable(Protocol):
    """What recovery needs of the control plane (broker.control.ControlPlane is one): the control plane runs
    `recover` at start, so this module names only the parts it rebuilds and never imports the control plane."""

    @property
    def clock(self) -> Clock: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def book(self) -> JobBook: ...
    @property
    def tracker(self) -> Tracker: ...
    @property
    def dispatcher(self) -> Dispatcher: ...
    @property
    def executor(self) -> Executor: ...
    @property
    def tasks(self) -> Supervisor: ...
    @property
    def events(self) -> EventLog: ...
    @property
    def health(self) -> HealthMonitor: ...

PROBE_TRIES = 3


@dataclass
class RecoveryReport:
    pods_adopted: int = 0
    pods_deleted: int = 0
    reattached: list[str] = field(default_factory=list)
    finalised: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    queued: int = 0
    holds_restored: int = 0
    untrusted: dict[str, str] = field(default_factory=dict)
    """Pods whose identity epoch was changed or unknown, and which."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds each step of recovery took (pods listed, running jobs settled, idle pods reset, queue read)."""


def process_started_at() -> float | None:
    """When this process was created (epoch seconds, to the kernel's 10 ms tick), from /proc; None elsewhere.

    Measured as an age against /proc/uptime: /proc/stat's boot time is whole seconds, too coarse here.
    """
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22: starttime, after "pid (comm)"
        return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def log_ready(report: RecoveryReport, started_at: float, dispatching_at: float) -> None:
    """One line a crash test reads: how soon after process start this broker dispatched, and what it recovered."""
    born = process_started_at()
    since_process = f"{dispatching_at - born:.3f}" if born is not None else "?"
    log.info("dispatching at %.6f: %s s after process start, %.3f s after control-plane start; pods adopted %d, "
             "deleted %d; jobs re-attached %d, finalised %d, re-queued %d, queued %d; holds restored %d; phases %s",
             dispatching_at, since_process, dispatching_at - started_at, report.pods_adopted, report.pods_deleted,
             len(report.reattached), len(report.finalised), len(report.requeued), report.queued,
             report.holds_restored, " ".join(f"{k} {v:.3f}" for k, v in report.phases.items()))


async def _probe(backend: Backend, pod: str, aid: str) -> tuple[bool, AttemptStatus | None]:
    """(reachable, status) of an attempt on a pod, with bounded retries."""
    for attempt in range(PROBE_TRIES):
        try:
            return True, await backend.agent(pod).status(aid)
        except FirepoolError as exc:
            log.warning("recovery: asking pod %s about %s failed (try %d of %d): %s", pod, aid, attempt + 1,
                        PROBE_TRIES, exc)
            await asyncio.sleep(0.2 * (attempt + 1))
    return False, None


async def _all_jobs(book: JobBook, *states: JobState) -> list[Job]:
    jobs: list[Job] = []
    before: str | None = None
    while True:
        page = await book.io(lambda b=before: book.store.list_jobs(states=list(states), limit=1000, before=b))
        jobs.extend(page)
        if len(page) < 1000:
            return jobs
        before = page[-1].id


async def recover(cp: Recoverable) -> RecoveryReport:
    """Rebuild tracker, queue and attempt watchers from the backend and the store."""
    report = RecoveryReport()
    now = cp.clock.now()
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        report.phases[name] = time.perf_counter() - mark
        mark = time.perf_counter()

    infos: dict[str, PodInfo] = {}
    # The pods, the jobs (both states in one query) and the quarantine at once: a take-over waits on this. The
    # quarantine is loaded before any pod comes back (a quarantined card gets none).
    listed, unfinished, _ = await asyncio.gather(cp.backend.list_pods(),
                                                 _all_jobs(cp.book, JobState.RUNNING, JobState.QUEUED),
                                                 cp.health.quarantine.load())
    running = [j for j in unfinished if j.state is JobState.RUNNING]
    queued = [j for j in unfinished if j.state is JobState.QUEUED]
    for info in listed:
        if info.pool not in cp.catalog.pools:
            await _delete(cp, info.name, report)
            continue
        infos[info.name] = info
    phase("list")
    # Every agent's health and every running attempt's status in one round: a take-over waits on them.
    probing = [(j, a) for j in running if (a := j.current_attempt) is not None and all(n in infos for n in j.pods)]
    healths, probed = await asyncio.gather(_healths(cp, infos.values()), asyncio.gather(
        *(asyncio.gather(*(_probe(cp.backend, n, a.id) for n in j.pods)) for j, a in probing)))
    probes_of = dict(zip((j.id for j, _ in probing), probed, strict=True))
    epochs = {name: _verdict(infos[name], health) for name, health in healths.items()}
    phase("health")

    for job in running:
        cp.book.adopt(job)
        attempt = job.current_attempt
        untrusted = [n for n in job.pods if n in infos and epochs[n][0] is not Verdict.TRUSTED]
        if untrusted and attempt is not None:
            verdict = epochs[untrusted[0]][0]
            await _requeue(cp, job, f"pod {untrusted[0]}'s identity epoch is {verdict.value}: the attempt "
                           "bound to it is not trusted", report)
            _announce(cp, report, untrusted[0], verdict, epochs[untrusted[0]][1], {"job": job.id, "attempt": attempt.id},
                      job.caller)
            for name in job.pods:
                if name in infos and epochs[name][0] is Verdict.CHANGED:
                    infos.pop(name)
                    await _delete(cp, name, report)
            continue  # an unknown-epoch pod is reset below like any unbound pod (its hold is not restored)
        pods_here = [infos[n] for n in job.pods if n in infos]
        if attempt is None or len(pods_here) != len(job.pods):
            await _requeue(cp, job, "its pods are gone", report)
            for info in pods_here:
                infos.pop(info.name)
                await _delete(cp, info.name, report)
            continue
        probes = probes_of[job.id]
        if not all(reachable for reachable, _ in probes):
            await _requeue(cp, job, "an agent of its pods stayed unreachable", report)
            for name in job.pods:
                infos.pop(name)
                await _delete(cp, name, report)
            continue
        statuses = [status for _, status in probes]
        if all(s is None for s in statuses):
            await _requeue(cp, job, "no agent ever started it", report)
            continue  # its pods are reset below like any unbound pod
        pods = [_adopt_pod(cp, infos.pop(n), report, epochs[n][1]) for n in job.pods]
        cp.tracker.adopt_running(job.id, job.pods, job.caller)
        if any(s is not None and s.running for s in statuses):
            cp.executor.launched[job.id] = attempt.id
            cp.tasks.spawn(f"watch {attempt.id}", _watch(cp, job, attempt.id, pods))
            report.reattached.append(job.id)
        else:
            cp.executor.launched[job.id] = attempt.id
            cp.tasks.spawn(f"finish {attempt.id}", _finish(cp, job, attempt.id, pods, statuses))
            report.finalised.append(job.id)

    phase("running")

    for name in [n for n in infos if epochs[n][0] is Verdict.CHANGED]:
        _announce(cp, report, name, Verdict.CHANGED, epochs[name][1], {}, infos[name].annotations.get("firepool.dev/caller"))
        infos.pop(name)
        await _delete(cp, name, report)  # never reused: it is not the pod its hold was for

    async def settle(info: PodInfo) -> None:
        spec = cp.catalog.pools[info.pool]
        request = reset_request(spec)
        health = healths[info.name]
        if health is not None and still_clean(health, request):
            clean = True  # its last reset was this one and nothing changed the pod since (the agent counts)
        else:
            try:
                clean = (await cp.backend.agent(info.name).reset(request)).clean
            except FirepoolError:
                clean = False
        if not clean:
            await _delete(cp, info.name, report)
            return
        verdict, epoch = epochs[info.name]
        pod = _adopt_pod(cp, info, report, epoch, trust_owner=verdict is Verdict.TRUSTED)
        if verdict is not Verdict.TRUSTED and info.annotations.get("firepool.dev/caller"):
            _announce(cp, report, info.name, verdict, epoch, {"hold_dropped": True}, info.annotations.get("firepool.dev/caller"))
        if pod.held(now):
            report.holds_restored += 1

    await asyncio.gather(*(settle(info) for info in infos.values()))
    phase("reset")

    for job in queued:
        cp.book.adopt(job)
        cp.dispatcher.enqueue(job)
        report.queued += 1
    for job_id in report.requeued:  # read as RUNNING above, QUEUED since
        requeued = await cp.book.get(job_id)
        if requeued is not None and requeued.state is JobState.QUEUED:
            cp.dispatcher.enqueue(requeued)
            report.queued += 1
    phase("queue")
    return report


async def _watch(cp: Recoverable, job: Job, aid: str, pods: list[Pod]) -> None:
    """Watch a re-attached attempt to its end. A watcher that raises (a bug, not an agent error) ends the attempt
    `LaunchError` under the job's retry policy, as a raising bind task does (broker.claiming.dispatching): the
    supervisor would only log it, leaving the job RUNNING with nobody watching and its pods assigned. Every finish
    on the way is guarded (`Executor.end`): one that raises ends the attempt alone (broker.running.ending)."""
    try:
        await cp.executor.watch(job, aid, pods)
    except Exception as exc:
        log.exception("watching re-attached %s failed inside the broker; ending its attempt", aid)
        lease = Lease(job.id, job.caller, tuple(pods), sum(len(p.gpus) for p in pods))  # as adopt_running built it
        await cp.executor.abort(job, lease, exc)


async def _finish(cp: Recoverable, job: Job, aid: str, pods: list[Pod], statuses: list[AttemptStatus | None]) -> None:
    """Finalise an attempt that ended while the broker was down, without a retry. A finish that raises (a bug on
    the log copy, health or reset path, not an agent error) ends it alone (broker.running.ending), its outcome from
    the ranks' statuses: never RUNNING with its pods assigned."""
    await cp.executor.end(job.id, aid, pods, statuses, may_retry=False)


async def _healths(cp: Recoverable, infos: Iterable[PodInfo]) -> dict[str, AgentHealth | None]:
    """Each listed pod's agent health (None: it never answered)."""
    async def one(info: PodInfo) -> tuple[str, AgentHealth | None]:
        for attempt in range(PROBE_TRIES):  # a slow answer on a loaded host must not read as "unknown"
            try:
                return info.name, await cp.backend.agent(info.name).health()
            except FirepoolError:
                await asyncio.sleep(0.2 * (attempt + 1))
        return info.name, None

    return dict(await asyncio.gather(*(one(i) for i in infos)))


def _verdict(info: PodInfo, health: AgentHealth | None) -> tuple[Verdict, str]:
    """A listed pod's epoch verdict (R5) and the epoch it reports now."""
    reported = reported_epoch(info.details, health.incarnation if health is not None else None)
    return judge(recorded_epoch(info.details, info.annotations), reported), str(reported)


def still_clean(health: AgentHealth, request: ResetRequest) -> bool:
    """The agent's last reset was `request`'s (or it is new) and nothing changed the pod since (`clean_for`)."""
    found = health.info.get("clean_for")
    return found == "any" or found == {"wipe_workspace": request.wipe_workspace, "wipe_paths": list(request.wipe_paths),
                                       "keep_paths": list(request.keep_paths)}


def _announce(cp: Recoverable, report: RecoveryReport, pod: str, verdict: Verdict, epoch: str, detail: dict[str, object],
              caller: str | None) -> None:
    report.untrusted[pod] = verdict.value
    why = ("it answers with another identity epoch than the one recorded: a different pod or agent"
           if verdict is Verdict.CHANGED else "no identity epoch was recorded for it: first contact")
    decided(EPOCH_INVALIDATED, f"pod/{pod}", why, caller=caller or None,
            detail={"verdict": verdict.value, "epoch": epoch, **detail}, events=cp.events)


def _adopt_pod(cp: Recoverable, info: PodInfo, report: RecoveryReport, epoch: str = "", *,
               trust_owner: bool = True) -> Pod:
    pod = Pod(info.name, info.pool, info.gpus, state=PodState.IDLE, template=info.template,
              created_at=info.created_at)
    pod.node = info.node
    if trust_owner:
        restore_owner(pod, info.annotations)
    pod.epoch = epoch
    pod.job = None
    cp.health.created(pod, info)  # its node, for quarantine
    cp.tracker.add(pod)
    report.pods_adopted += 1
    return pod


async def _delete(cp: Recoverable, name: str, report: RecoveryReport) -> None:
    try:
        await cp.backend.delete(name)
        report.pods_deleted += 1
    except FirepoolError as exc:
        log.warning("recovery could not delete pod %s: %s", name, exc)


async def _requeue(cp: Recoverable, job: Job, why: str, report: RecoveryReport) -> None:
    """RUNNING -> QUEUED without consuming a retry; the next execution gets a new attempt id."""
    now = cp.clock.now()

    def requeue(current: Job) -> Job:
        attempt = current.current_attempt
        if current.state is not JobState.RUNNING or attempt is None:
            raise Abort
        lost = attempt.move(AttemptState.LOST, finished_at=now, error_class=ErrorClass.POD_LOST,
                            message=f"recovery: {why}")
        return transition(current.with_attempt(lost), JobState.QUEUED, now, pods=())

    if await cp.book.write(job.id, requeue) is not None:
        report.requeued.append(job.id)
        log.info("recovery re-queued %s: %s", job.id, why)
