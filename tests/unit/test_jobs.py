"""Job and attempt rows are copied by a slot copier that must equal `dataclasses.replace`, refusals included."""

from __future__ import annotations

import dataclasses

import pytest

from broker.jobs import Attempt, AttemptState, Job, JobSpec, JobState, transition


def a_job() -> Job:
    attempt = Attempt(id="j1:0", job_id="j1", n=0, pods=("cpu-1",))
    return Job(id="j1", caller="alice", spec=JobSpec(pool="cpu", command=("true",)), state=JobState.QUEUED,
               attempts=(attempt,), timings={"submitted_at": 1.0})


def test_a_transition_changes_what_dataclasses_replace_would_and_keeps_the_rest() -> None:
    job = a_job()
    moved = transition(job, JobState.RUNNING, 2.0, pods=("cpu-1",))
    assert moved == dataclasses.replace(job, state=JobState.RUNNING, version=1, pods=("cpu-1",),
                                        timings={"submitted_at": 1.0})
    assert job.state is JobState.QUEUED and job.version == 0  # the original is untouched


def test_an_attempt_move_equals_replace_and_an_unknown_field_is_refused_like_replace() -> None:
    attempt = a_job().attempts[0]
    assert attempt.move(AttemptState.RUNNING, launched_at=2.0) == dataclasses.replace(
        attempt, state=AttemptState.RUNNING, launched_at=2.0)
    with pytest.raises(TypeError, match="no_such_field"):
        attempt.move(AttemptState.RUNNING, no_such_field=1)
    with pytest.raises(TypeError):
        dataclasses.replace(attempt, no_such_field=1)  # type: ignore[call-arg]
