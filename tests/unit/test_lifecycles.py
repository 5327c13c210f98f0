"""Every state and every edge of the job, attempt and pod transition tables."""

from __future__ import annotations

import pytest

from broker.jobs import (
    ATTEMPT_TRANSITIONS,
    JOB_TRANSITIONS,
    TERMINAL,
    Attempt,
    AttemptState,
    IllegalTransition,
    Job,
    JobSpec,
    JobState,
    job_sort_key,
    new_job_id,
    transition,
)
from broker.pods import POD_TRANSITIONS, IllegalPodTransition, Pod, PodState


def _job(state: JobState) -> Job:
    return Job(id="j1", caller="alice", spec=JobSpec(pool="cpu", command=("true",)), state=state, version=3)


@pytest.mark.parametrize("src", list(JobState))
@pytest.mark.parametrize("dst", list(JobState))
def test_job_transition_table_is_enforced_on_every_pair(src: JobState, dst: JobState) -> None:
    job = _job(src)
    if dst in JOB_TRANSITIONS[src]:
        moved = transition(job, dst, 100.0)
        assert moved.state is dst and moved.version == job.version + 1
        if dst is JobState.QUEUED:
            assert moved.timings["queued_at"] == 100.0
        if dst in TERMINAL:
            assert moved.timings["finished_at"] == 100.0
    else:
        with pytest.raises(IllegalTransition):
            transition(job, dst, 100.0)


def test_terminal_states_are_derived_from_the_table() -> None:
    assert {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED} == TERMINAL
    assert all(JOB_TRANSITIONS[s] for s in JobState if s not in TERMINAL)


@pytest.mark.parametrize("src", list(AttemptState))
@pytest.mark.parametrize("dst", list(AttemptState))
def test_attempt_transition_table_is_enforced_on_every_pair(src: AttemptState, dst: AttemptState) -> None:
    attempt = Attempt(id="j1:0", job_id="j1", n=0, pods=("p",), state=src)
    if dst in ATTEMPT_TRANSITIONS[src]:
        assert attempt.move(dst).state is dst
    else:
        with pytest.raises(IllegalTransition):
            attempt.move(dst)


@pytest.mark.parametrize("src", list(PodState))
@pytest.mark.parametrize("dst", list(PodState))
def test_pod_transition_table_is_enforced_on_every_pair(src: PodState, dst: PodState) -> None:
    pod = Pod("p", "cpu", state=src)
    if dst in POD_TRANSITIONS[src]:
        pod.move(dst)
        assert pod.state is dst
    else:
        with pytest.raises(IllegalPodTransition):
            pod.move(dst)
        assert pod.state is src


def test_every_pod_state_can_reach_gone() -> None:
    reach = {PodState.GONE}
    changed = True
    while changed:
        changed = False
        for state, nexts in POD_TRANSITIONS.items():
            if state not in reach and nexts & reach:
                reach.add(state)
                changed = True
    assert reach == set(PodState)


def test_job_ids_sort_by_time_and_are_unique() -> None:
    ids = [new_job_id(1_800_000_000.0 + i) for i in range(100)]
    assert ids == sorted(ids) and len(set(ids)) == 100
    assert all(i.isalnum() and len(i) == 19 for i in ids)


def test_dispatch_order_is_priority_then_submit_time_then_id() -> None:
    def job(i: str, prio: int, t: float) -> Job:
        return Job(id=i, caller="c", spec=JobSpec(pool="cpu", command=("x",), priority=prio), timings={"submitted_at": t})
    jobs = [job("b", 0, 1.0), job("a", 0, 1.0), job("c", 5, 9.0), job("d", 0, 0.5)]
    assert [j.id for j in sorted(jobs, key=job_sort_key)] == ["c", "d", "a", "b"]


def test_a_transition_given_attempts_with_a_new_attempt_equals_with_attempt_then_transition() -> None:
    spec = JobSpec(pool="cpu", command=("true",))
    queued = Job(id="j-1", caller="alice", spec=spec, state=JobState.QUEUED, version=3)
    for job in (queued, queued.with_attempt(Attempt(id="j-1:0", job_id="j-1", n=0, pods=("p0",)))):
        n = len(job.attempts)
        attempt = Attempt(id=f"j-1:{n}", job_id="j-1", n=n, pods=("p1",))
        one_copy = transition(job, JobState.RUNNING, 5.0, attempts=job.attempts_with(attempt), pods=("p1",))
        assert one_copy == transition(job.with_attempt(attempt), JobState.RUNNING, 5.0, pods=("p1",))
        assert one_copy.version == 4 and one_copy.attempts[-1] == attempt


def test_attempts_with_replaces_by_id_and_keeps_attempts_in_order_of_n() -> None:
    spec = JobSpec(pool="cpu", command=("true",))
    first, second = (Attempt(id=f"j-1:{n}", job_id="j-1", n=n, pods=("p",)) for n in (0, 1))
    job = Job(id="j-1", caller="alice", spec=spec, attempts=(second,))
    assert job.attempts_with(first) == (first, second)
    ended = first.move(AttemptState.LOST, finished_at=1.0)
    assert Job(id="j-1", caller="alice", spec=spec, attempts=(first, second)).attempts_with(ended) == (ended, second)
