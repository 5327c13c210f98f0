"""The executor: launch a committed job through its pods' agents, watch it, finish it, reset the pods.

Steps (4) and (5) of the claim path live here: pods go RUNNING through the per-GPU gate, then each
rank's agent starts the attempt. When the attempt ends the executor copies its logs, commits the result
(or a retry) version-checked, and — in parallel — has every pod reset with proof: a clean pod goes back
to the pool held for its owner once the result is handed to the store, anything else is deleted (a
single-use pod at once, with no reset). A short attempt's pod was reset by its agent as the attempt ended,
the proof coming with the launch's answer (`LaunchRequest.reset_after`). A pod
whose agent stays unreachable is lost: the attempt ends `PodLost` and the pod is deleted. What the broker
sends a running attempt (a signal, a cancel, a preemption, a kill) is broker.running.signalling's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence

from broker.claiming.jobbook import Abort, JobBook
from broker.claiming.tracker import Lease, Tracker
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.health.monitor import LAUNCH_REFUSED, HealthMonitor
from broker.jobs import AttemptState, ErrorClass, Job, JobState
from broker.pods import Origin, Pod
from broker.ports.agent import AttemptStatus, LaunchRequest, ResetResult
from broker.ports.backend import Backend
from broker.ports.logs import LogStore
from broker.running.delivering import PackageDelivery
from broker.running.ending import end_alone
from broker.running.jobenv import agent_session, memory_limits
from broker.running.kernelwarm import KernelWarmth
from broker.running.logcopy import LogCopier, output_cap
from broker.running.outcome import OUTCOME_RETRY_MAX_S, OUTCOME_RETRY_S, PREEMPTING, outcome_of
from broker.running.returning import PodReturn, reset_request
from broker.running.signalling import Signalling
from broker.running.topology import Rendezvous, topology_env
from broker.stats import Stats
from broker.tasks import Supervisor
from broker.warmth.pooling import PoolController

log = logging.getLogger("firepool.executing")

WAIT_POLL_S = 25.0
"""Long-poll length of one agent wait call."""
LAUNCH_WAIT_S = 0.25
"""How long a launch call waits for the attempt to end: a job shorter than this costs one agent round trip and
no start write (the outcome write carries its start); a longer one is marked running this much later."""
UNREACHABLE_AFTER = 3
"""Consecutive failed agent calls after which a pod counts as lost."""
OUTCOME_RACES = 3
"""Times an outcome is applied again to a row that moved under it (each a store read and a commit)."""
BACKSTOP_S = 30.0
"""How long past its timeout the broker lets the agent enforce it before killing from outside."""
__all__ = ["PREEMPTING", "Executor", "session_key"]


def session_key(job: Job) -> str:
    """The opaque session the agent compares (a `boundary` pool's; see broker.running.jobenv)."""
    return agent_session(job, None)


class Executor(Signalling):
    def __init__(self, *, clock: Clock, book: JobBook, tracker: Tracker, backend: Backend,
                 controller: PoolController, logs: LogStore, tasks: Supervisor, stats: Stats,
                 wake_dispatcher: Callable[[], None], requeue: Callable[[Job], None], kill_grace_s: float = 5.0,
                 delivery: PackageDelivery | None = None, kernels: KernelWarmth | None = None,
                 health: HealthMonitor | None = None) -> None:
        self.clock = clock
        self.book = book
        self.tracker = tracker
        self.backend = backend
        self.controller = controller
        self.logs = logs
        self.copier = LogCopier(backend, logs)
        self.tasks = tasks
        self.stats = stats
        self.wake_dispatcher = wake_dispatcher
        self.requeue = requeue
        self.kill_grace_s = kill_grace_s
        self.delivery = delivery
        self.kernels = kernels
        """Learns which pools serve kernels, so their idle pods keep a pre-started one."""
        self.health = health
        """Counts hardware faults and launch refusals toward quarantine (broker.health)."""
        self.launched: dict[str, str] = {}
        """job id -> the attempt id running now (launched and not yet finished)."""
        self.returning = 0
        """Attempts out of `launched` whose pods are not back yet: each still leads to writes (its pods' next claims)."""
        self.preempting: dict[str, str] = {}
        """job id -> why it is being preempted: its outcome is `Preempted` and it re-queues (broker.claiming.preempting)."""
        self._gate_opened = asyncio.Event()
        self.handed_off: dict[str, float] = {}
        """job id -> when its pods were handed off, for an attempt that ended within its launch call."""
        self.returns = PodReturn(clock=clock, book=book, tracker=tracker, backend=backend, controller=controller,
                                 tasks=tasks, stats=stats, health=health)
        """Resets the pods after an attempt and keeps their owner records (broker.running.returning)."""

    # ---------------------------------------------------------------- launch

    async def start(self, job: Job, lease: Lease) -> None:
        """Steps 4 and 5: through the per-GPU gate, then launch every rank."""
        promoting = any(p.standby for p in lease.pods)
        while not self.tracker.start(job.id):
            opened = self._gate_opened
            await self.clock.wait(opened, 1.0)
        if promoting:
            self.controller.wake()  # a standby was promoted: stage a fresh one into the open slot
        attempt = job.current_attempt
        assert attempt is not None
        live = self.book.live.get(job.id, job)
        if live.cancel_requested:
            await self.end(job.id, attempt.id, lease.pods, [None] * len(lease.pods), never_ran=True)
            return
        handed_off_at = self.clock.now()
        try:
            rdzv = self.backend.rendezvous(lease.pods[0].name, len(lease.pods), [p.name for p in lease.pods])
        except FirepoolError as exc:  # the ranks could not meet: the attempt fails as a whole, before any runs
            await self._fail_launch(job, attempt.id, lease.pods, ErrorClass.LAUNCH_ERROR, str(exc))
            return
        bound = await self._deliver(job, lease.pods) if job.spec.extra.get("package") is not None else {}
        if isinstance(bound, str):  # no rank starts without its code
            await self._fail_launch(job, attempt.id, lease.pods, ErrorClass.PACKAGE_ERROR, bound)
            return
        if self.kernels is not None and job.spec.extra.get("kernel"):
            self.kernels.started(job.id, job.spec.pool)
        requests = [self._request(job, attempt.id, pod, rank, len(lease.pods), rdzv)
                    for rank, pod in enumerate(lease.pods)]
        self.launched[job.id] = attempt.id  # before the launch returns: cancel and signal reach it meanwhile
        if len(requests) == 1:  # awaited inline: gather would wrap the one call in a task of its own
            results = [await self._launch(lease.pods[0], requests[0])]
        else:
            results = list(await asyncio.gather(*(self._launch(pod, req)
                                                  for pod, req in zip(lease.pods, requests, strict=True))))
        first = results[0]
        if any(r is None or (not r.running and r.error_class) for r in results):
            # A rank could not start: the attempt fails as a whole; stop the ranks that did start.
            await self._kill(attempt.id, [p for p, r in zip(lease.pods, results, strict=True) if r and r.running])
            statuses = [r if r is not None else AttemptStatus(attempt.id, running=False, error_class=ErrorClass.LAUNCH_ERROR,
                                                              message=LAUNCH_REFUSED)
                        for r in results]
            await self.end(job.id, attempt.id, lease.pods, statuses)
            return
        assert first is not None
        if bound:  # the package push's timings ride on rank 0's status
            results[0] = first = dataclasses.replace(first, timings={**first.timings, **bound})
        submitted = job.timings.get("submitted_at")
        if first.first_instruction_at is not None and submitted is not None:
            self.stats.observe_start(lease.pods[0].pool, lease.pods[0].path, first.first_instruction_at - submitted)
        ended = all(r is not None and not r.running for r in results)
        if ended:  # it ran and ended within the launch call: the outcome write records its start too
            self.handed_off[job.id] = handed_off_at
        else:
            self.tasks.spawn(f"mark {attempt.id}", self._mark_running(job.id, attempt.id, handed_off_at, first))
        for pod in lease.pods:
            self.returns.started(pod)
        if not ended and self.book.live.get(job.id, job).cancel_requested:
            await self.cancel(job.id)
        await self.watch(job, attempt.id, lease.pods, results)

    async def abort(self, job: Job, lease: Lease, exc: BaseException) -> None:
        """`start` raised (a bug, not an expected error): end the attempt `LaunchError` and follow the job's retry
        policy, unless the attempt already ended (its pods were reset: they may serve another job now)."""
        attempt = job.current_attempt
        if attempt is None or not self.tracker.pods_of(job.id):
            return
        aid = attempt.id
        if self.launched.get(job.id) == aid:  # ranks may run: stop them before the pods are reset
            try:
                await self._kill(aid, lease.pods)
            except Exception:  # noqa: BLE001 - best effort; the reset below proves the pods clean or retires them
                log.warning("stopping the ranks of %s failed", aid, exc_info=True)
        message = f"the broker failed while launching or watching this attempt: {exc!r}"
        await self._fail_launch(job, aid, lease.pods, ErrorClass.LAUNCH_ERROR, message)

    async def _deliver(self, job: Job, pods: Sequence[Pod]) -> dict[str, float] | str:
        """Push the job's package to every pod: the push timings, or why the launch must fail."""
        digest = job.spec.extra.get("package")
        if digest is None:
            return {}
        if self.delivery is None:
            return "this broker has no package store"
        try:
            agents = [self.backend.agent(p.name) for p in pods]
        except FirepoolError as exc:
            return f"a pod of the job is gone: {exc.message}"
        done = await self.delivery.deliver(job.caller, str(digest), agents)
        return done.error if done.error is not None else {"package_push_s": done.push_s}

    async def _fail_launch(self, job: Job, aid: str, pods: Sequence[Pod], error: ErrorClass, message: str) -> None:
        """End an attempt that never started a rank."""
        self.launched[job.id] = aid
        await self.end(job.id, aid, pods, [
            AttemptStatus(aid, running=False, error_class=error, message=message) for _ in pods])

    def _request(self, job: Job, aid: str, pod: Pod, rank: int, world: int, rdzv: Rendezvous) -> LaunchRequest:
        spec = job.spec
        pool = self.tracker.pool(spec.pool)
        env = {**(pool.env if pool is not None else {}), **spec.env}
        env.update({
            "FIREPOOL_CALLER": job.caller, "FIREPOOL_JOB_ID": job.id, "FIREPOOL_ATTEMPT_ID": aid,
            "FIREPOOL_POOL": spec.pool, "FIREPOOL_POD": pod.name, "FIREPOOL_LEASE_TAG": spec.lease_tag,
            "FIREPOOL_QUEUE": spec.queue, "FIREPOOL_ACQUISITION": pod.path,
        })
        if pod.gpus:
            env.update(memory_limits(pod.gpus, {d.key: d for d in self.backend.devices()}))
        env.update(topology_env(rank, world, rdzv))  # last: no caller value survives
        if rank == 0 and spec.extra.get("kernel"):
            env.update(rdzv.kernel_env)
        extra = {**spec.extra, "max_output_bytes": output_cap(pool)}  # the agent stops writing a stream there
        # A lone rank on a reusable pod is reset by its agent as it ends: the gang's other ranks may still run,
        # a single-use pod is deleted instead, and a kernel's attempt outlives any launch's wait.
        folds = world == 1 and pod.origin is not Origin.SINGLE_USE and not spec.extra.get("kernel")
        reset_after = reset_request(pool) if folds and pool is not None else None
        return LaunchRequest(attempt_id=aid, argv=spec.command, env=env, session=agent_session(job, pool),
                             timeout_s=spec.timeout_s, extra=extra, wait_s=LAUNCH_WAIT_S, reset_after=reset_after)

    async def _launch(self, pod: Pod, request: LaunchRequest) -> AttemptStatus | None:
        try:
            return await self.backend.agent(pod.name).launch(request)
        except FirepoolError as exc:
            log.warning("launch of %s on %s failed: %s", request.attempt_id, pod.name, exc)
            return None

    async def _mark_running(self, job_id: str, aid: str, handed_off_at: float, first: AttemptStatus) -> None:
        def mark(job: Job) -> Job:
            attempt = job.current_attempt
            if job.state is not JobState.RUNNING or attempt is None or attempt.id != aid \
                    or attempt.state is not AttemptState.LAUNCHING:
                raise Abort
            running = attempt.move(AttemptState.RUNNING, launched_at=first.started_at,
                                   first_instruction_at=first.first_instruction_at,
                                   timings={**attempt.timings, **first.timings})
            times = {"handed_off_at": handed_off_at}
            if first.first_instruction_at is not None:
                times["first_instruction_at"] = first.first_instruction_at
            return job.with_attempt(running).stamp(**times)

        try:
            await self.book.write(job_id, mark)
        except FirepoolError as exc:
            log.warning("recording the start of %s failed (the result write will carry it): %s", aid, exc)

    # ---------------------------------------------------------------- watch

    async def watch(self, job: Job, aid: str, pods: Sequence[Pod],
                    known: Sequence[AttemptStatus | None] | None = None) -> None:
        """Wait for every rank to end (`known`: statuses the launch returned; an ended one is not asked again)."""
        deadline = None
        if job.spec.timeout_s is not None:
            deadline = self.clock.now() + job.spec.timeout_s + BACKSTOP_S
        statuses: list[AttemptStatus | None] = [None] * len(pods)
        waits: list[asyncio.Future[AttemptStatus | None] | None] = []
        for rank, pod in enumerate(pods):
            status = known[rank] if known is not None else None
            if status is not None and not status.running:
                statuses[rank] = status
                waits.append(None)
            else:
                waits.append(asyncio.ensure_future(self._wait_rank(pod, aid, deadline)))
        pending = {w for w in waits if w is not None}
        if pending and any(s is not None and s.exit_code != 0 for s in statuses):
            await self._kill(aid, [pods[rank] for rank, w in enumerate(waits) if w is not None])  # the gang cannot finish
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                rank = waits.index(task)
                statuses[rank] = status = task.result()
                if pending and (status is None or status.exit_code != 0):
                    # One rank failed or was lost: the gang cannot finish; stop the others.
                    await self._kill(aid, [pods[waits.index(t)] for t in pending])
        await self.end(job.id, aid, pods, statuses)

    async def _wait_rank(self, pod: Pod, aid: str, deadline: float | None) -> AttemptStatus | None:
        """Long-poll one rank until it exits; None when its agent stays unreachable (pod lost)."""
        failures = 0
        while True:
            try:
                status = await self.backend.agent(pod.name).wait(aid, WAIT_POLL_S)
            except FirepoolError as exc:
                failures += 1
                if failures >= UNREACHABLE_AFTER:
                    log.warning("pod %s lost while running %s: %s", pod.name, aid, exc)
                    return None
                await self.clock.sleep(0.5 * failures)
                continue
            failures = 0
            if not status.running:
                return status
            if deadline is not None and self.clock.now() > deadline:
                await self._kill(aid, [pod])

    # ---------------------------------------------------------------- finish

    async def end(self, job_id: str, aid: str, pods: Sequence[Pod], statuses: Sequence[AttemptStatus | None],
                  never_ran: bool = False, may_retry: bool = True) -> None:
        """`finish`, guarded: every site that ends an attempt comes here. If finishing raises inside the broker
        (a bug, not an agent or store error), the attempt ends alone (broker.running.ending): never RUNNING for
        ever with nobody watching it."""
        try:
            await self.finish(job_id, aid, pods, statuses, never_ran=never_ran, may_retry=may_retry)
        except Exception as exc:
            log.exception("finishing %s failed inside the broker; ending it alone", aid)
            await end_alone(self, job_id, aid, len(pods), statuses, exc, never_ran=never_ran)

    def settled(self) -> bool:
        """No attempt runs or has its pods still to give back, so none leads to a store write soon
        (`StoreWriter.settled`). Read from the store writer's thread too: a dict's length and an int."""
        return not self.launched and not self.returning

    async def finish(self, job_id: str, aid: str, pods: Sequence[Pod], statuses: Sequence[AttemptStatus | None],
                      never_ran: bool = False, may_retry: bool = True) -> None:
        """Copy logs, then commit the outcome and reset the pods in parallel."""
        job = self.book.live.get(job_id) or await self.book.get(job_id)
        if job is not None:  # a job the store lost has no caller to keep its logs for
            await self.copier.copy(job.caller, aid, pods, statuses, output_cap(self.tracker.pool(job.spec.pool)))
        self.launched.pop(job_id, None)
        self.returning += 1  # `_reset` counts it back once its pods are back
        try:
            if self.kernels is not None:
                self.kernels.ended(job_id)
            lost = set() if never_ran else {p.name for p, s in zip(pods, statuses, strict=True) if s is None}
            if self.health is not None and not never_ran:
                job = self.book.live.get(job_id)
                statuses = await self.health.attempt_ended(job_id, job.caller if job else "", pods, statuses)
            done = {p.name: s.reset for p, s in zip(pods, statuses, strict=True) if s is not None and s.reset is not None}
            # The agents reset while the store writes; the pods go back once the outcome is handed to the store (not
            # before: a job claimed on them next must commit with it or after it, or a broker killed in between
            # would find two jobs running on one pod).
            handed = asyncio.Event()
            reset = asyncio.ensure_future(self._reset(job_id, pods, lost, done, handed))
        except BaseException:
            self.returning -= 1
            raise
        try:
            committed = await self._commit_outcome(job_id, aid, statuses, never_ran, may_retry, handed.set)
        finally:
            handed.set()
            await reset
        if committed is not None and committed.state is JobState.QUEUED:
            self.requeue(committed)

    async def _commit_outcome(self, job_id: str, aid: str, statuses: Sequence[AttemptStatus | None],
                              never_ran: bool, may_retry: bool, handed: Callable[[], None] | None = None
                              ) -> Job | None:
        now = self.clock.now()
        preempted = self.preempting.pop(job_id, None)
        handed_off_at = self.handed_off.pop(job_id, None)

        def outcome(job: Job) -> Job:
            return outcome_of(job, aid, statuses, now=now, never_ran=never_ran, may_retry=may_retry,
                              preempted=preempted, handed_off_at=handed_off_at, health=self.health)

        pause = OUTCOME_RETRY_S
        races = 0
        while True:
            try:
                committed = await self.book.write(job_id, outcome, handed)
                if committed is None and races < OUTCOME_RACES:
                    # The row moved first: an earlier write of this job landed although its answer was lost (a
                    # database restarting). The book holds the stored row now: apply the outcome to it.
                    races += 1
                    continue
                break
            except FirepoolError as exc:
                # The store is down: the outcome is known only here, so keep trying (a restarted database
                # must not leave the job RUNNING for ever). If this broker dies meanwhile, the row stays
                # RUNNING and recovery finalises it from the agent's record.
                log.error("recording the outcome of %s failed, trying again in %.1f s: %s", aid, pause, exc)
                await self.clock.sleep(pause)
                pause = min(pause * 2, OUTCOME_RETRY_MAX_S)
        if committed is not None and committed.terminal:
            self.stats.jobs_finished[(committed.spec.pool, str(committed.state))] += 1
        return committed

    async def _reset(self, job_id: str, pods: Sequence[Pod], lost: set[str], done: dict[str, ResetResult],
                     after: asyncio.Event) -> None:
        try:
            await self.returns.reset(job_id, pods, lost, done, after)
        finally:
            self.returning -= 1
        self.gate_opened()

    def gate_opened(self) -> None:
        """Pods left the per-GPU gate: wake the launches waiting at it, and the dispatcher."""
        opened, self._gate_opened = self._gate_opened, asyncio.Event()
        opened.set()
        self.wake_dispatcher()
