"""What a finished attempt means for its job: the verdict from the ranks' statuses, and the job row it commits.

Pure functions of the row and the statuses, so the executor's outcome write (broker.running.executing) can
recompute them against whichever version of the row the job book holds when the write is applied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.claiming.jobbook import Abort
from broker.jobs import AttemptState, ErrorClass, Job, JobState, describe_exit, transition
from broker.ports.agent import AttemptStatus

if TYPE_CHECKING:
    from broker.health.monitor import HealthMonitor

OUTCOME_RETRY_S = 0.25
OUTCOME_RETRY_MAX_S = 5.0
"""Backoff of an outcome write the store refused: from the first pause, doubling up to the last."""
PREEMPTING = "preempting: "
"""Prefix of a running attempt's message once the broker asked it to yield (broker.claiming.preempting)."""


@dataclass(frozen=True)
class Verdict:
    """What a finished attempt means for its job."""

    error: str | None
    message: str | None
    exit_code: int | None
    cancelled: bool
    final: AttemptState
    state: JobState


def judge(statuses: Sequence[AttemptStatus | None], *, never_ran: bool, cancel_requested: bool) -> Verdict:
    """Rank 0's exit decides; a lost pod makes it PodLost, another failed rank fails a clean rank 0."""
    rank0 = statuses[0]
    exit_code = rank0.exit_code if rank0 is not None else None
    cancelled = cancel_requested or bool(rank0 and rank0.cancelled)
    error: str | None
    message: str | None = None
    if never_ran:
        error, message = ErrorClass.CANCELLED, "cancelled before launch"
    elif any(s is None for s in statuses):
        error, message = ErrorClass.POD_LOST, "a pod of the attempt was lost"
    else:
        assert rank0 is not None
        error = rank0.error_class or describe_exit(
            rank0.exit_code,
            timed_out=rank0.timed_out,
            cancelled=cancelled,
            oom=rank0.oom,
            signal=rank0.signal,
        )
        message = rank0.message
        failed = next((s for s in statuses[1:] if s is not None and s.exit_code != 0), None)
        if error is None and failed is not None:
            error = failed.error_class or describe_exit(
                failed.exit_code, timed_out=failed.timed_out, oom=failed.oom, signal=failed.signal
            )
            message = "another rank failed"
    fault = next((s.hardware_fault for s in statuses if s is not None and s.hardware_fault), None)
    if fault is not None and error is not None and not cancelled:
        error, message = ErrorClass.HARDWARE_FAULT, fault  # the card's failure, not the job's (design §8)
    if cancelled:
        error = ErrorClass.CANCELLED
    lost = error == ErrorClass.POD_LOST
    final = (
        AttemptState.SUCCEEDED
        if error is None
        else AttemptState.CANCELLED
        if cancelled
        else AttemptState.LOST
        if lost
        else AttemptState.FAILED
    )
    state = JobState.SUCCEEDED if error is None else JobState.CANCELLED if cancelled else JobState.FAILED
    return Verdict(error, message, exit_code, cancelled, final, state)


def outcome_of(
    job: Job,
    aid: str,
    statuses: Sequence[AttemptStatus | None],
    *,
    now: float,
    never_ran: bool,
    may_retry: bool,
    preempted: str | None,
    handed_off_at: float | None,
    health: HealthMonitor | None,
) -> Job:
    """The job with attempt `aid` ended: terminal, or re-queued when its retry policy says so."""
    rank0 = statuses[0]
    attempt = job.current_attempt
    if job.state is not JobState.RUNNING or attempt is None or attempt.id != aid:
        raise Abort
    verdict = judge(statuses, never_ran=never_ran, cancel_requested=job.cancel_requested)
    why = preempted
    if why is None and attempt.message is not None and attempt.message.startswith(PREEMPTING):
        why = attempt.message.removeprefix(PREEMPTING)  # marked by a broker before a restart
    if why is not None and verdict.error is not None and not job.cancel_requested:
        verdict = dataclasses.replace(
            verdict,
            error=ErrorClass.PREEMPTED,
            message=why,
            cancelled=False,
            final=AttemptState.FAILED,
            state=JobState.FAILED,
        )
    changes: dict[str, object] = {
        "finished_at": now,
        "exit_code": verdict.exit_code,
        "error_class": verdict.error,
        "message": verdict.message,
    }
    times: dict[str, float] = {}
    if handed_off_at is not None and "handed_off_at" not in job.timings:  # its start was never marked
        times["handed_off_at"] = handed_off_at
    if rank0 is not None:
        changes["launched_at"] = attempt.launched_at or rank0.started_at
        changes["first_instruction_at"] = attempt.first_instruction_at or rank0.first_instruction_at
        changes["timings"] = {**attempt.timings, **rank0.timings}
        if rank0.first_instruction_at is not None:
            times["first_instruction_at"] = job.timings.get(
                "first_instruction_at", rank0.first_instruction_at
            )
    if attempt.state is AttemptState.LAUNCHING and verdict.final is not AttemptState.LOST and not never_ran:
        attempt = attempt.move(AttemptState.RUNNING)
    # One row copy: the ended attempt rides on the transition (requeues_free reads only the earlier attempts).
    attempts = job.attempts_with(attempt.move(verdict.final, **changes))
    if may_retry and health is not None and health.requeues_free(job, verdict.error):
        return transition(job, JobState.QUEUED, now, pods=(), timings=times, attempts=attempts)  # no retry spent
    if (
        verdict.error is not None
        and not verdict.cancelled
        and may_retry
        and job.retries < job.spec.max_retries
    ):
        return transition(job, JobState.QUEUED, now, retries=job.retries + 1, pods=(), timings=times,
                          attempts=attempts)
    return transition(
        job,
        verdict.state,
        now,
        exit_code=verdict.exit_code,
        error_class=verdict.error,
        error_message=verdict.message,
        timings=times,
        attempts=attempts,
    )
