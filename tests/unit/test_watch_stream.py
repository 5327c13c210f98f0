"""The watch stream (`POST /v1/jobs:watch`): a busy stream gathers what ends within GATHER_S into one write, the
first job after a quiet spell leaves at once, and every job leaves exactly once."""

from __future__ import annotations

import json
import time

from broker.api.batch_routes import GATHER_S, _events
from broker.jobs import Job, JobSpec, JobState


def job(n: int) -> Job:
    return Job(id=f"j{n}", caller="alice", spec=JobSpec(pool="cpu", command=("true",)), state=JobState.SUCCEEDED)


class Ending:
    """A watch whose jobs end on a script: each `ended` call hands back the next group at once."""

    def __init__(self, groups: list[list[Job]], meanwhile: list[list[Job]]) -> None:
        self.groups, self.meanwhile = groups, meanwhile
        self.pending = {j.id for g in groups + meanwhile for j in g}
        self.closed = False

    def _take(self, jobs: list[Job]) -> list[Job]:
        self.pending -= {j.id for j in jobs}
        return jobs

    async def ended(self, timeout: float) -> list[Job]:
        return self._take(self.groups.pop(0) if self.groups else [])

    def ended_now(self) -> list[Job]:
        return self._take(self.meanwhile.pop(0) if self.meanwhile else [])

    def close(self) -> None:
        self.closed = True


def ids(chunk: bytes) -> list[str]:
    return [json.loads(line[len(b"data: "):])["id"] for line in chunk.split(b"\n") if line.startswith(b"data: {\"id")]


async def test_a_busy_stream_gathers_what_ends_within_the_gap_into_one_write() -> None:
    watch = Ending([[job(1)], [job(2)]], meanwhile=[[job(3), job(4)]])
    chunks, times = [], []
    async for chunk in _events(watch, time.monotonic() + 5, time.monotonic):  # type: ignore[arg-type]
        chunks.append(chunk)
        times.append(time.monotonic())
    assert [ids(c) for c in chunks[:2]] == [["j1"], ["j2", "j3", "j4"]]
    assert times[1] - times[0] >= GATHER_S * 0.9  # the second write waited out the gap
    assert chunks[-1].startswith(b"event: end") and b'"pending":[]' in chunks[-1] and watch.closed


async def test_the_first_job_after_a_quiet_spell_leaves_without_waiting() -> None:
    watch = Ending([[job(1)]], meanwhile=[])
    started = time.monotonic()
    first = await _events(watch, started + 5, time.monotonic).__anext__()  # type: ignore[arg-type]
    assert ids(first) == ["j1"] and time.monotonic() - started < GATHER_S
