"""What a job costs the broker besides its commits: pod record writes, result reads, empty logs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from broker.clock import VirtualClock
from broker.jobs import JobState
from broker.pods import ANNOTATION_PREFIX, Origin, Pod, PodState, owner_annotations
from broker.ports.backend import FakeBackend
from broker.running.logstore import FileLogStore
from broker.running.returning import AGEING_DEFER_S, owner_identity
from tests.unit.harness import Harness, cpu_pool


class RecordingBackend(FakeBackend):
    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.writes: list[dict[str, str]] = []

    async def annotate(self, name: str, annotations: Mapping[str, str]) -> None:
        self.writes.append(dict(annotations))
        await super().annotate(name, annotations)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    clock = VirtualClock()
    harness = await Harness([cpu_pool(max_count=1, caller_hold_seconds=60.0)], clock=clock,
                            backend=RecordingBackend(clock)).start()
    yield harness
    await harness.stop()


async def test_a_pods_record_is_written_at_once_when_its_owner_changes_and_once_a_second_when_it_only_ages(
        h: Harness) -> None:
    backend = h.backend
    assert isinstance(backend, RecordingBackend)
    t0 = h.clock.now()
    await h.run_job("alice", command=("exit", "0"))
    written = len(backend.writes)
    assert backend.writes[-1][ANNOTATION_PREFIX + "caller"] == "alice"  # the new owner, at once
    for _ in range(5):
        await h.run_job("alice", command=("exit", "0"))  # same owner: neither start nor reset writes now
    assert h.clock.now() - t0 < AGEING_DEFER_S
    assert len(backend.writes) == written
    await h.run_for(AGEING_DEFER_S)
    assert len(backend.writes) == written + 1  # one write for the six holds, the latest values winning
    pod = next(iter(h.cp.tracker.pods.values()))
    assert backend.writes[-1][ANNOTATION_PREFIX + "caller"] == "alice"
    assert backend.writes[-1][ANNOTATION_PREFIX + "job"] == ""  # idle and held
    assert backend.writes[-1][ANNOTATION_PREFIX + "hold-until"] == repr(pod.hold_until)
    await h.run_job("bob", command=("exit", "0"))
    assert backend.writes[-1][ANNOTATION_PREFIX + "caller"] == "bob"  # a new owner is written at once


async def test_a_clean_stop_writes_the_hold_that_waited(h: Harness) -> None:
    backend = h.backend
    assert isinstance(backend, RecordingBackend)
    await h.run_job("alice", command=("exit", "0"))
    written = len(backend.writes)
    await h.run_job("alice", command=("exit", "0"))
    assert len(backend.writes) == written
    pod = next(iter(h.cp.tracker.pods.values()))
    await h.stop()
    assert len(backend.writes) == written + 1
    assert backend.writes[-1][ANNOTATION_PREFIX + "hold-until"] == repr(pod.hold_until)


async def test_a_finished_job_is_read_from_the_book_not_the_store(h: Harness) -> None:
    job = await h.run_job("alice")
    reads: list[str] = []
    store_get = h.store.get
    h.store.get = lambda job_id: reads.append(job_id) or store_get(job_id)  # type: ignore[method-assign]
    got = await h.cp.wait("alice", job.id, 5.0)
    assert got.state is JobState.SUCCEEDED and got == job
    assert reads == []


def test_an_empty_log_writes_no_file_and_reads_empty(tmp_path: Path) -> None:
    logs = FileLogStore(tmp_path)
    logs.write("alice", "j1:0", "stdout", b"")
    assert list(tmp_path.iterdir()) == []
    assert logs.read("alice", "j1:0", "stdout") == b""
    logs.write("alice", "j1:0", "stderr", b"oops")
    assert logs.read("alice", "j1:0", "stderr") == b"oops"


def test_a_jobs_row_carries_its_current_spec_even_when_the_spec_object_changes() -> None:
    import dataclasses
    import json

    from broker.jobs import Job, JobSpec
    from broker.store.rows import job_row

    job = Job(id="j-spec", caller="alice", spec=JobSpec(pool="cpu", command=("true",)))
    first = job_row(job, 1.0)["spec"]
    assert job_row(dataclasses.replace(job, version=1), 2.0)["spec"] == first  # same spec object
    changed = dataclasses.replace(job, spec=dataclasses.replace(job.spec, priority=7))
    assert json.loads(job_row(changed, 3.0)["spec"])["priority"] == 7


def test_the_identity_a_reset_compares_changes_exactly_when_a_non_ageing_annotation_does() -> None:
    ageing = {ANNOTATION_PREFIX + k for k in ("job", "hold-until", "idle-since")}

    def lasting(pod: Pod) -> dict[str, str]:
        return {k: v for k, v in owner_annotations(pod).items() if k not in ageing}

    changes: list[tuple[str, object]] = [
        ("caller", "bob"), ("key", ("bob", "batch", "t")), ("used", True), ("origin", Origin.DEMAND),
        ("standby", True), ("image", "img:2"), ("epoch", "e2"), ("job", "j-2"), ("hold_until", 99.0),
        ("idle_since", 98.0)]
    for field, value in changes:
        pod = Pod("p", "cpu", state=PodState.IDLE, origin=Origin.WARM)
        before, identity = lasting(pod), owner_identity(pod)
        setattr(pod, field, value)
        assert (lasting(pod) != before) == (owner_identity(pod) != identity), field
