"""The behaviour every `JobStore` must show, written once and run against each implementation.

`tests/unit/test_memory_store.py` runs it on `MemoryJobStore`, `tests/integration/test_store.py` on
`SqlJobStore` over SQLite, MariaDB and PostgreSQL: subclass `JobStoreContract` and provide a `store`
fixture that yields an empty store. Passing on both is what lets unit tests trust the fake.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from broker.jobs import (
    TIMING_FIELDS,
    Acquisition,
    Attempt,
    AttemptState,
    ErrorClass,
    Job,
    JobSpec,
    JobState,
    attempt_id,
    transition,
)
from broker.ports.store import JobStore

T = TypeVar("T")


def make_job(job_id: str, caller: str = "alice", *, key: str | None = None, **changes: Any) -> Job:
    spec = JobSpec(pool="h100", command=("python", "-c", "print(1)"), idempotency_key=key)
    return dataclasses.replace(Job(id=job_id, caller=caller, spec=spec, timings={"submitted_at": 1.5}),
                               **changes)


def full_job(job_id: str = "j-full") -> Job:
    """A job with every field set to a value that a lossy store would mangle."""
    spec = JobSpec(
        pool="h100-80g", command=("torchrun", "--nproc", "8", "train.py", "ünïcode ✓ 🚀"),
        env={"A": "1", "LONG": "x" * 5000, "EMPTY": "", "QUOTE": "it's \"quoted\"\n\ttab"},
        lease_tag="conv-7f3a", queue="rollouts", pods=4, single_use=True, timeout_s=0.1 + 0.2,
        max_retries=3, priority=-5, idempotency_key=f"Key-🙂-{job_id}",
        extra={"package": {"sha256": "ab" * 32, "size": 123456789012}, "list": [1, 2.5, None, True],
               "nested": {"deep": {"deeper": ["a", {"b": -1e-300}]}}},
    )
    attempts = (
        Attempt(id=attempt_id(job_id, 0), job_id=job_id, n=0, pods=("p-1", "p-2"), state=AttemptState.LOST,
                launched_at=1_712_345_678.123456, first_instruction_at=1_712_345_679.000001,
                finished_at=1_712_345_699.5, exit_code=None, error_class=ErrorClass.POD_LOST,
                message="pod p-2 vanished"),
        Attempt(id=attempt_id(job_id, 1), job_id=job_id, n=1, pods=("p-3", "p-4", "p-5", "p-6"),
                state=AttemptState.FAILED, launched_at=1_712_345_700.25, first_instruction_at=None,
                finished_at=1_712_345_800.75, exit_code=-9, error_class=ErrorClass.OOM,
                message="CUDA out of memory ✗"),
    )
    timings = {name: 1_712_345_600.0 + i * (0.1 + 0.2) + 1e-7 for i, name in enumerate(TIMING_FIELDS)}
    return Job(
        id=job_id, caller="team-rl/trainer@example.com", spec=spec, state=JobState.FAILED, version=17,
        retries=1, exit_code=-9, error_class=ErrorClass.OOM, error_message="out of memory: " + "é" * 2000,
        pods=("p-3", "p-4", "p-5", "p-6"),
        acquisition=(Acquisition("p-3", "warm"), Acquisition("p-4", "new", "no idle pod of this caller"),
                     Acquisition("p-5", "standby", None), Acquisition("p-6", "recycled", "tag changed")),
        attempts=attempts, dropped_env=({"LD_PRELOAD": "/evil.so"}, {"PYTHONPATH": "/x"}),
        cancel_requested=True, timings=timings,
    )


def race(n: int, fn: Callable[[int], T]) -> list[T]:
    """Run `fn(0..n-1)` on n threads released together; their results in index order."""
    barrier = threading.Barrier(n)

    def go(i: int) -> T:
        barrier.wait(timeout=30)
        return fn(i)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(go, range(n)))


class JobStoreContract:
    """Subclass with a `store` fixture yielding an empty store."""

    # --- round trips -------------------------------------------------------------------------------

    def test_every_field_of_job_and_attempts_round_trips(self, store: JobStore) -> None:
        job = full_job()
        assert store.insert(job) == job
        assert store.get(job.id) == job
        assert store.list_jobs() == [job]

    def test_a_job_with_only_defaults_round_trips(self, store: JobStore) -> None:
        job = Job(id="j-min", caller="bob", spec=JobSpec(pool="cpu", command=()))
        store.insert(job)
        assert store.get(job.id) == job

    def test_a_won_commit_stores_every_field_including_cleared_ones(self, store: JobStore) -> None:
        job = full_job()
        store.insert(job)
        cleared = dataclasses.replace(
            job, version=job.version + 1, state=JobState.QUEUED, exit_code=None, error_class=None,
            error_message=None, pods=(), acquisition=(), dropped_env=(), cancel_requested=False,
            timings={"submitted_at": 3.0}, retries=2,
        )
        assert store.commit([(cleared, job.version)]) == [True]
        assert store.get(job.id) == cleared

    def test_large_specs_and_messages_round_trip(self, store: JobStore) -> None:
        job = dataclasses.replace(make_job("j-big"), spec=JobSpec(
            pool="h100", command=("run",), env={"BLOB": "z" * 300_000}, extra={"lines": ["y" * 100] * 1000}))
        store.insert(job)
        assert store.get(job.id) == job
        failed = dataclasses.replace(job, version=1, error_message="Traceback ✗\n" * 20_000).with_attempt(
            Attempt(id=attempt_id(job.id, 0), job_id=job.id, n=0, pods=("p",), message="stderr ✗\n" * 20_000))
        assert store.commit([(failed, 0)]) == [True]
        assert store.get(job.id) == failed

    def test_get_of_an_unknown_id_is_none(self, store: JobStore) -> None:
        assert store.get("j-nope") is None

    def test_get_many_returns_each_existing_job_once_across_reads_and_leaves_unknown_ids_out(
            self, store: JobStore) -> None:
        jobs = [make_job(f"j-{i:04d}") for i in range(1100)]  # more ids than one IN list of the SQL store
        jobs[7] = full_job("j-0007")
        store.commit_group([], jobs)
        asked = [f"j-{i:04d}" for i in range(1200)] + ["j-0007", "j-0001"]
        found = store.get_many(asked)
        assert sorted(found, key=lambda j: j.id) == sorted(jobs, key=lambda j: j.id)
        assert store.get_many([]) == [] and store.get_many(["j-nope"]) == []

    # --- insert and idempotency --------------------------------------------------------------------

    def test_same_idempotency_key_returns_the_first_job_and_stores_no_second(self, store: JobStore) -> None:
        first = make_job("j-1", key="k1")
        assert store.insert(first) == first
        again = store.insert(make_job("j-2", key="k1"))
        assert again == first
        assert store.get("j-2") is None
        assert [j.id for j in store.list_jobs()] == ["j-1"]

    def test_idempotency_keys_are_per_caller_and_compared_exactly(self, store: JobStore) -> None:
        store.insert(make_job("j-1", "alice", key="k"))
        for job_id, caller, key in [("j-2", "bob", "k"), ("j-3", "alice", "K"), ("j-4", "alice", "k "),
                                    ("j-5", "Alice", "k")]:
            assert store.insert(make_job(job_id, caller, key=key)).id == job_id
        assert len(store.list_jobs()) == 5

    def test_jobs_without_a_key_never_collide(self, store: JobStore) -> None:
        store.insert(make_job("j-1"))
        assert store.insert(make_job("j-2")).id == "j-2"
        assert len(store.list_jobs()) == 2

    def test_a_duplicate_id_is_a_value_error(self, store: JobStore) -> None:
        store.insert(make_job("j-1"))
        try:
            store.insert(make_job("j-1", "bob"))
        except ValueError:
            pass
        else:
            raise AssertionError("a second job with the same id was accepted")
        assert store.get("j-1") == make_job("j-1")

    def test_concurrent_inserts_with_one_key_all_get_the_one_stored_job(self, store: JobStore) -> None:
        results = race(6, lambda i: store.insert(make_job(f"j-{i}", key="same")))
        stored = store.list_jobs()
        assert len(stored) == 1
        assert all(r == stored[0] for r in results)

    # --- versioned commits -------------------------------------------------------------------------

    def test_versioned_commit_wins_once_then_loses_on_the_stale_version(self, store: JobStore) -> None:
        job = store.insert(make_job("j-1"))
        queued = transition(job, JobState.QUEUED, at=10.0)
        assert store.commit([(queued, job.version)]) == [True]
        assert store.get(job.id) == queued
        cancelled = transition(job, JobState.CANCELLED, at=11.0)  # built from the stale row
        assert store.commit([(cancelled, job.version)]) == [False]
        assert store.get(job.id) == queued

    def test_a_commit_to_an_unknown_job_loses(self, store: JobStore) -> None:
        assert store.commit([(make_job("j-ghost", version=1), 0)]) == [False]
        assert store.get("j-ghost") is None

    def test_a_write_that_changes_nothing_still_wins(self, store: JobStore) -> None:
        job = store.insert(make_job("j-1"))
        assert store.commit([(job, job.version)]) == [True]
        assert store.get(job.id) == job

    def test_an_empty_batch_is_an_empty_answer(self, store: JobStore) -> None:
        assert store.commit([]) == []

    def test_two_threads_racing_one_transition_exactly_one_wins(self, store: JobStore) -> None:
        for round_ in range(10):
            job = store.insert(make_job(f"j-{round_:02d}", state=JobState.QUEUED, version=3))
            contenders = [transition(job, JobState.RUNNING, at=20.0, pods=(f"pod-{i}",)) for i in range(2)]
            won = race(2, lambda i, c=contenders, j=job: store.commit([(c[i], j.version)])[0])
            assert sorted(won) == [False, True]
            assert store.get(job.id) == contenders[won.index(True)]

    def test_concurrent_read_modify_write_loses_no_update(self, store: JobStore) -> None:
        store.insert(make_job("j-1"))
        per_thread = 15

        def bump(_: int) -> int:
            wins = losses = 0
            while wins < per_thread:
                current = store.get("j-1")
                assert current is not None
                if store.commit([(current.stamp(claimed_at=float(current.version)), current.version)])[0]:
                    wins += 1
                else:
                    losses += 1
            return losses

        race(4, bump)
        final = store.get("j-1")
        assert final is not None
        assert final.version == 4 * per_thread
        assert final.timings["claimed_at"] == float(final.version - 1)

    def test_group_commit_applies_winners_and_leaves_losers_untouched(self, store: JobStore) -> None:
        a, b, c, d = (store.insert(make_job(f"j-{x}", state=JobState.QUEUED, version=2)) for x in "abcd")
        new_attempt = {j.id: Attempt(id=attempt_id(j.id, 0), job_id=j.id, n=0, pods=("p",)) for j in (a, b, c, d)}
        running = {j.id: transition(j, JobState.RUNNING, at=30.0, pods=("p",)).with_attempt(new_attempt[j.id])
                   for j in (a, b, c, d)}
        ghost = make_job("j-ghost", version=1)
        writes = [(running["j-d"], 2), (running["j-a"], 1), (ghost, 0), (running["j-c"], 2), (running["j-b"], 7)]
        assert store.commit(writes) == [True, False, False, True, False]
        assert store.get("j-a") == a and store.get("j-b") == b
        assert store.get("j-c") == running["j-c"] and store.get("j-d") == running["j-d"]
        assert store.get("j-c").attempts == (new_attempt["j-c"],)  # type: ignore[union-attr]
        assert store.get("j-ghost") is None

    def test_inserts_ride_in_a_group_commit_beside_version_checked_writes(self, store: JobStore) -> None:
        a = store.insert(make_job("j-a", state=JobState.QUEUED, version=1))
        running = transition(a, JobState.RUNNING, at=30.0, pods=("p",))
        new = [make_job("j-new1", state=JobState.QUEUED, version=1), make_job("j-new2", "bob")]
        assert store.commit([(running, 1), (transition(a, JobState.CANCELLED, at=31.0), 1)], new) == [True, False]
        assert store.get("j-a") == running
        assert store.get("j-new1") == new[0] and store.get("j-new2") == new[1]
        assert store.commit([], [make_job("j-new3")]) == []
        assert store.get("j-new3") == make_job("j-new3")

    def test_a_duplicate_id_among_batched_inserts_fails_the_whole_batch(self, store: JobStore) -> None:
        a = store.insert(make_job("j-a", state=JobState.QUEUED, version=1))
        running = transition(a, JobState.RUNNING, at=30.0, pods=("p",))
        for inserts in ([make_job("j-a", "bob")], [make_job("j-x"), make_job("j-x", "bob")]):
            try:
                store.commit([(running, 1)], inserts)
            except ValueError:
                pass
            else:
                raise AssertionError("a batch inserting a duplicate id was accepted")
            assert store.get("j-a") == a and store.get("j-x") is None  # nothing of the batch landed

    def test_keyed_inserts_in_a_group_commit_store_each_key_once_and_repeats_get_the_first_job(
            self, store: JobStore) -> None:
        first = store.insert(make_job("j-1", key="k1"))
        a = store.insert(make_job("j-a", state=JobState.QUEUED, version=1))
        running = transition(a, JobState.RUNNING, at=30.0, pods=("p",))
        inserts = [make_job("j-2", key="k1"), make_job("j-3", key="k2"), make_job("j-4", key="k2"),
                   make_job("j-5"), make_job("j-6", "bob", key="k1"), make_job("j-7", key="K1")]
        won, stored = store.commit_group([(running, 1)], inserts)
        assert won == [True] and store.get("j-a") == running  # the rest of the group commits
        assert stored == [first, inserts[1], inserts[1], inserts[3], inserts[4], inserts[5]]
        assert store.get("j-2") is None and store.get("j-4") is None  # a repeated key stores nothing
        assert sorted(j.id for j in store.list_jobs()) == ["j-1", "j-3", "j-5", "j-6", "j-7", "j-a"]
        assert store.commit_group([], [make_job("j-8", key="k2")]) == ([], [inserts[1]])  # a later group too
        assert store.insert(make_job("j-9", key="k2")) == inserts[1]  # and the single path
        assert store.get("j-8") is None and store.get("j-9") is None

    def test_group_commits_racing_on_one_key_store_one_job_and_the_rest_of_each_group(
            self, store: JobStore) -> None:
        for round_ in range(3):
            def group(i: int, round_: int = round_) -> tuple[list[bool], list[Job]]:
                return store.commit_group([], [make_job(f"j-{round_}-{i}-a"), make_job(f"j-{round_}-{i}", key=f"same-{round_}"),
                                               make_job(f"j-{round_}-{i}-b")])
            results = race(6, group)
            keyed = [j for j in store.list_jobs(limit=1000) if j.spec.idempotency_key == f"same-{round_}"]
            assert len(keyed) == 1
            assert all(stored[1] == keyed[0] for _, stored in results)
            for i in range(6):  # every racer's unkeyed jobs landed, the loser's included
                assert store.get(f"j-{round_}-{i}-a") is not None and store.get(f"j-{round_}-{i}-b") is not None
            if store.insert(make_job(f"j-{round_}-single", key=f"same-{round_}")) != keyed[0]:
                raise AssertionError("the single path stored a second job under a key a group commit stored")

    def test_a_batch_racing_a_single_write_loses_only_the_contested_job(self, store: JobStore) -> None:
        for round_ in range(6):
            jobs = [store.insert(make_job(f"j-{round_}-{i}", state=JobState.QUEUED, version=1)) for i in range(8)]
            batch = [(transition(j, JobState.RUNNING, at=20.0, pods=("pod-b",)), j.version) for j in jobs]
            rival = transition(jobs[3], JobState.CANCELLED, at=20.0)
            batch_won, rival_won = race(2, lambda i, b=batch, r=rival, j=jobs[3]:
                                        store.commit(b) if i == 0 else store.commit([(r, j.version)]))
            assert batch_won[:3] + batch_won[4:] == [True] * 7  # the other jobs never see the race
            assert [batch_won[3], rival_won[0]].count(True) == 1
            assert store.get(jobs[3].id) == (batch[3][0] if batch_won[3] else rival)
            for (written, _), j in zip(batch, jobs, strict=True):
                if j is not jobs[3]:
                    assert store.get(j.id) == written

    def test_writes_to_one_job_in_one_batch_apply_in_order(self, store: JobStore) -> None:
        job = store.insert(make_job("j-1"))
        queued = transition(job, JobState.QUEUED, at=1.0)
        running = transition(queued, JobState.RUNNING, at=2.0).with_attempt(
            Attempt(id=attempt_id("j-1", 0), job_id="j-1", n=0, pods=("p",)))
        cancelled = transition(job, JobState.CANCELLED, at=3.0)  # stale by then
        assert store.commit([(queued, 0), (running, 1), (cancelled, 0)]) == [True, True, False]
        assert store.get("j-1") == running

    def test_attempt_updates_are_stored_with_the_winning_write(self, store: JobStore) -> None:
        job = store.insert(make_job("j-1", state=JobState.QUEUED))
        attempt = Attempt(id=attempt_id("j-1", 0), job_id="j-1", n=0, pods=("p",))
        running = transition(job, JobState.RUNNING, at=1.0).with_attempt(attempt)
        assert store.commit([(running, job.version)]) == [True]
        done = transition(running, JobState.SUCCEEDED, at=2.0, exit_code=0).with_attempt(
            attempt.move(AttemptState.RUNNING).move(AttemptState.SUCCEEDED, exit_code=0, finished_at=2.0))
        retry = Attempt(id=attempt_id("j-1", 1), job_id="j-1", n=1, pods=("q",))
        assert store.commit([(done, running.version)]) == [True]
        assert store.commit([(done.with_attempt(retry), running.version)]) == [False]
        assert store.get("j-1") == done

    # --- listing -----------------------------------------------------------------------------------

    def _fill(self, store: JobStore) -> None:
        for i in range(12):
            state = [JobState.PENDING, JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED][i % 4]
            store.insert(make_job(f"j-{i:02d}", "alice" if i % 3 else "bob", state=state))

    def test_list_is_newest_first_by_id_and_limited(self, store: JobStore) -> None:
        self._fill(store)
        assert [j.id for j in store.list_jobs(limit=3)] == ["j-11", "j-10", "j-09"]
        assert len(store.list_jobs()) == 12
        assert store.list_jobs(limit=0) == []

    def test_list_filters_by_caller_and_states(self, store: JobStore) -> None:
        self._fill(store)
        assert [j.id for j in store.list_jobs(caller="bob")] == ["j-09", "j-06", "j-03", "j-00"]
        assert [j.id for j in store.list_jobs(states=[JobState.RUNNING, JobState.SUCCEEDED])] == [
            "j-11", "j-10", "j-07", "j-06", "j-03", "j-02"]
        assert [j.id for j in store.list_jobs(caller="alice", states=iter([JobState.QUEUED]))] == [
            "j-05", "j-01"]
        assert store.list_jobs(states=[]) == []
        assert store.list_jobs(caller="carol") == []

    def test_list_filters_by_pool_and_lease_tag(self, store: JobStore) -> None:
        for i in range(6):
            spec = JobSpec(pool="a100" if i % 2 else "h100", command=("true",), lease_tag=f"t{i % 3}")
            store.insert(make_job(f"j-{i:02d}", "alice" if i < 4 else "bob", spec=spec))
        assert [j.id for j in store.list_jobs(pool="a100")] == ["j-05", "j-03", "j-01"]
        assert [j.id for j in store.list_jobs(lease_tag="t1")] == ["j-04", "j-01"]
        assert [j.id for j in store.list_jobs(pool="h100", lease_tag="t2", caller="alice")] == ["j-02"]
        assert [j.id for j in store.list_jobs(pool="a100", before="j-03")] == ["j-01"]
        assert store.list_jobs(pool="nope") == []

    def test_list_pages_by_id_with_before(self, store: JobStore) -> None:
        self._fill(store)
        seen, before = [], None
        while page := store.list_jobs(caller="alice", limit=3, before=before):
            seen += [j.id for j in page]
            before = page[-1].id
        assert seen == [f"j-{i:02d}" for i in range(11, -1, -1) if i % 3]
        assert [j.id for j in store.list_jobs(before="j-02")] == ["j-01", "j-00"]

    def test_ids_order_like_python_strings(self, store: JobStore) -> None:
        ids = ["j-B", "j-a", "j-A", "j-b", "j_a", "j-", "j-a ", "j-é", "j-z", "j0", "j-a-1", "j-A1"]
        for job_id in ids:
            store.insert(make_job(job_id))
        assert [j.id for j in store.list_jobs()] == sorted(ids, reverse=True)
        assert [j.id for j in store.list_jobs(before="j-a")] == sorted((i for i in ids if i < "j-a"), reverse=True)

    def test_attempts_come_back_in_order_in_lists(self, store: JobStore) -> None:
        jobs = [full_job("j-1"), make_job("j-2"), full_job("j-3")]
        for job in jobs:
            store.insert(job)
        assert store.list_jobs() == jobs[::-1]

    # ---------------------------------------------------------------- events (broker.events)

    def test_events_get_growing_ids_and_page_by_id_time_and_caller(self, store: JobStore) -> None:
        from broker.events import Event

        stored = store.add_events([Event(10.0, "preemption", "j-1", "borrowed, LIFO", 120.5, "alice", {"gpus": 2}),
                                   Event(11.0, "hold.broken", "pod-1", "ceiling", None, "bob"),
                                   Event(12.0, "budget.throttled", "gpu", "budget exhausted")])
        ids = [e.id for e in stored]
        assert ids == sorted(ids) and len(set(ids)) == 3 and ids[0] > 0
        assert store.list_events() == stored
        assert store.list_events(after_id=ids[0]) == stored[1:]
        assert store.list_events(since=11.0) == stored[1:]
        assert store.list_events(caller="alice") == stored[:1]
        assert store.list_events(limit=1) == stored[:1]
        assert stored[0].detail == {"gpus": 2} and stored[0].cost_gpu_s == 120.5 and stored[2].caller is None
        later = store.add_events([Event(13.0, "reservation.alert", "j-2", "cannot fill", None, "alice")])
        assert later[0].id > ids[-1]
        assert store.list_events(after_id=ids[-1]) == later
        assert store.list_events(after_id=2**53) == [] and store.list_events(since=1e300) == []
