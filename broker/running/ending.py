"""The last resort when finishing an attempt raised inside the broker: end it alone, so no job stays RUNNING.

The executor's finish (broker.running.executing) copies logs, asks the health monitor, commits the outcome and
resets the pods. A bug anywhere on that path (not an agent or store error: those are handled there) would leave
the job RUNNING with nobody watching it and its pods assigned for ever. `end_alone` is the fallback every
finishing site shares — the launch path, the watch, a cancel before launch, a timeout, and recovery's
re-attached and finalised attempts: it commits the outcome by itself, as the outcome path does
(broker.running.outcome), from the ranks' statuses when they are known, else (or if even that raises) as a
`LaunchError`; then it retires the pods still leased to the job, since no reset proved them clean (deleting a
pod ends whatever of the attempt still runs there).

It never retries the job: the attempt ended through a path that raised, and a retry would go through it again,
retiring a pod each time. An outcome that was committed before the raise stands: a retry committed QUEUED whose
hand-off to the queue raised (or whose commit the raise orphaned) is left QUEUED here, and the dispatcher's sweep
adopts it (broker.claiming.dispatching), so it runs again exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from broker.claiming.jobbook import JobBook
from broker.claiming.tracker import Tracker
from broker.clock import Clock
from broker.errors import FirepoolError
from broker.jobs import ErrorClass, Job
from broker.ports.agent import AttemptStatus
from broker.running.kernelwarm import KernelWarmth
from broker.running.outcome import OUTCOME_RETRY_MAX_S, OUTCOME_RETRY_S, outcome_of
from broker.stats import Stats
from broker.warmth.pooling import PoolController

log = logging.getLogger("firepool.executing")


class Ender(Protocol):
    """What ending an attempt alone needs of the executor (broker.running.executing.Executor is one): the
    executor calls `end_alone`, so this module names only this face of it and never imports it back."""

    @property
    def clock(self) -> Clock: ...
    @property
    def book(self) -> JobBook: ...
    @property
    def tracker(self) -> Tracker: ...
    @property
    def controller(self) -> PoolController: ...
    @property
    def stats(self) -> Stats: ...
    @property
    def kernels(self) -> KernelWarmth | None: ...
    @property
    def launched(self) -> dict[str, str]:
        """job id -> the attempt id running now."""
        ...
    @property
    def preempting(self) -> dict[str, str]:
        """job id -> why it is being preempted."""
        ...
    @property
    def handed_off(self) -> dict[str, float]:
        """job id -> when its pods were handed off."""
        ...

    def gate_opened(self) -> None:
        """Wake the launches waiting at the per-GPU gate."""
        ...


async def end_alone(
    ex: Ender,
    job_id: str,
    aid: str,
    n_pods: int,
    statuses: Sequence[AttemptStatus | None] | None,
    failure: BaseException,
    *,
    never_ran: bool = False,
) -> None:
    """End attempt `aid` of `job_id` without the finish path that raised with `failure` (see the module doc)."""
    ex.launched.pop(job_id, None)
    preempted = ex.preempting.pop(job_id, None)
    ex.handed_off.pop(job_id, None)
    now = ex.clock.now()
    broken: list[AttemptStatus | None] = [
        AttemptStatus(
            aid,
            running=False,
            error_class=ErrorClass.LAUNCH_ERROR,
            message=f"the broker failed while ending this attempt: {failure!r}",
        )
    ] * max(n_pods, 1)
    tries: list[tuple[Sequence[AttemptStatus | None], bool]] = [(broken, False)]
    if statuses is not None and len(statuses) > 0:
        tries.insert(0, (statuses, never_ran))
    for ended, unlaunched in tries:
        if await _commit(ex, job_id, aid, ended, now, unlaunched, preempted):
            break
    try:
        if ex.kernels is not None:
            ex.kernels.ended(job_id)
        job = ex.book.live.get(job_id)
        key = (job.caller, job.spec.queue, job.spec.lease_tag) if job is not None else ("", "", "")
        for pod in ex.tracker.begin_reset(job_id, key):
            ex.tracker.finish_reset(pod.name, False, now, 0.0)  # -> RETIRING: never proven clean
            ex.controller.delete_retiring(pod.name)
    except Exception:
        log.exception("retiring the pods of %s failed inside the broker", aid)
    ex.gate_opened()


async def _commit(
    ex: Ender,
    job_id: str,
    aid: str,
    ended: Sequence[AttemptStatus | None],
    now: float,
    never_ran: bool,
    preempted: str | None,
) -> bool:
    """Commit the attempt's outcome from `ended` without a retry; False when that raised inside the broker."""

    def outcome(current: Job) -> Job:
        return outcome_of(
            current,
            aid,
            ended,
            now=now,
            never_ran=never_ran,
            may_retry=False,
            preempted=preempted,
            handed_off_at=None,
            health=None,
        )

    pause = OUTCOME_RETRY_S
    while True:
        try:
            committed = await ex.book.write(job_id, outcome)
            break
        except FirepoolError as exc:  # the store is down: keep trying, as the outcome path does
            log.error("recording the outcome of %s failed, trying again in %.1f s: %s", aid, pause, exc)
            await ex.clock.sleep(pause)
            pause = min(pause * 2, OUTCOME_RETRY_MAX_S)
        except Exception:
            log.exception("committing the outcome of %s failed inside the broker", aid)
            return False
    if committed is not None and committed.terminal:
        ex.stats.jobs_finished[(committed.spec.pool, str(committed.state))] += 1
    return True
