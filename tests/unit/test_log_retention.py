"""Log retention: old logs and each caller's oldest past its byte budget are swept, and reading them says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.errors import LogsSwept
from broker.ports.logs import StoredLogs
from broker.running.logretention import LogRetention, to_sweep
from broker.running.logstore import FileLogStore, caller_key
from tests.unit.harness import Harness, cpu_pool

DAY = 86400.0


def stored(caller: str, job: str, size: int, at: float) -> StoredLogs:
    return StoredLogs(caller, job, size, at)


def test_logs_past_the_age_go_whoever_wrote_them() -> None:
    logs = [stored("a", "j1", 10, 0.0), stored("b", "j2", 10, 5 * DAY), stored("a", "j3", 10, 9 * DAY)]
    assert [s.job_id for s in to_sweep(logs, 10 * DAY, LogRetention(max_age_s=7 * DAY))] == ["j1"]


def test_a_callers_oldest_logs_go_past_its_bytes_and_other_callers_keep_theirs() -> None:
    logs = [stored("a", "old", 60, 1.0), stored("a", "mid", 30, 2.0), stored("a", "new", 50, 3.0),
            stored("b", "b1", 90, 0.5)]
    gone = to_sweep(logs, 4.0, LogRetention(max_age_s=None, max_bytes_per_caller=100))
    assert sorted(s.job_id for s in gone) == ["old"]  # a keeps new+mid (80 bytes); b's 90 bytes are within budget


def test_past_the_total_the_oldest_of_every_caller_go() -> None:
    logs = [stored("a", "a1", 50, 1.0), stored("b", "b1", 50, 2.0), stored("a", "a2", 50, 3.0)]
    gone = to_sweep(logs, 4.0, LogRetention(max_age_s=None, max_bytes_per_caller=None, max_bytes_total=100))
    assert [s.job_id for s in gone] == ["a1"]


def test_no_limits_sweep_nothing() -> None:
    logs = [stored("a", "j1", 1 << 40, 0.0)]
    assert to_sweep(logs, 1e9, LogRetention(max_age_s=None, max_bytes_per_caller=None)) == []


async def test_a_swept_jobs_log_read_says_it_was_swept_and_a_kept_one_reads_as_before() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        assert "log retention" in {t.get_name() for t in h.cp.tasks.tasks}  # supervised, started with the loops
        h.cp.log_sweeper.retention = LogRetention(max_age_s=None, max_bytes_per_caller=150)
        first = await h.run_job("alice", command=("echo", "a" * 40))
        await h.run_for(1.0)
        second = await h.run_job("alice", command=("echo", "b" * 40))
        other = await h.run_job("bob", command=("echo", "c" * 40))
        assert (await h.cp.read_log("alice", first.id)).data == b"a" * 40 + b"\n"
        gone = await h.cp.log_sweeper.sweep()  # alice keeps 150 bytes: her newest job's three streams of 41
        assert [s.job_id for s in gone] == [first.id]
        with pytest.raises(LogsSwept) as swept:
            await h.cp.read_log("alice", first.id)
        assert swept.value.details["reason"] == "bytes"
        assert (await h.cp.read_log("alice", second.id)).data == b"b" * 40 + b"\n"
        assert (await h.cp.read_log("bob", other.id)).data == b"c" * 40 + b"\n"
        h.cp.log_sweeper.retention = LogRetention(max_age_s=3600.0, max_bytes_per_caller=None)
        h.clock.advance(3700.0)
        await h.cp.log_sweeper.sweep()
        with pytest.raises(LogsSwept) as aged:
            await h.cp.read_log("bob", other.id)
        assert aged.value.details["reason"] == "age"
        assert h.logs.data == {}
    finally:
        await h.stop()


def test_the_file_store_weighs_removes_and_remembers_per_caller(tmp_path: Path) -> None:
    logs = FileLogStore(tmp_path)
    logs.write("alice", "j1:0", "combined", b"x" * 100)
    logs.append("alice", "j2:0", "combined", b"y" * 10, first=True)
    logs.append("alice", "j2:0", "combined", b"y" * 10, first=False)
    logs.commit("alice", "j2:0", "combined")
    logs.write("bob", "j3:0", "rank1.stdout", b"z")  # a gang's second rank
    (tmp_path / "j0").mkdir()  # a log of the old layout (before logs were kept per caller)
    (tmp_path / "j0" / "0.combined.log").write_bytes(b"legacy")
    os.utime(tmp_path / "j0" / "0.combined.log", (1000.0, 1000.0))
    assert logs.read("alice", "j2:0", "combined") == b"y" * 20
    assert logs.read("bob", "j3:0", "rank1.stdout") == b"z"
    with pytest.raises(ValueError):
        logs.read("bob", "j3:0", "../../etc")
    assert logs.read("anyone", "j0:0", "combined") == b"legacy"
    usage = {s.job_id: s for s in logs.usage()}
    assert {j: s.size for j, s in usage.items()} == {"j1": 100, "j2": 20, "j3": 1, "j0": 6}
    assert usage["j1"].caller_key == caller_key("alice") and usage["j0"].caller_key == "-"
    logs.remove(usage["j1"])
    logs.remove(usage["j0"])
    assert logs.read("alice", "j1:0", "combined") == b""
    assert logs.swept_until("alice") == usage["j1"].written_at
    assert logs.swept_until("bob") == 0.0
    assert sorted(s.job_id for s in logs.usage()) == ["j2", "j3"]


def test_a_log_being_copied_is_not_weighed(tmp_path: Path) -> None:
    logs = FileLogStore(tmp_path)
    logs.append("alice", "j1:0", "combined", b"x" * 100, first=True)
    assert logs.usage() == []
    logs.commit("alice", "j1:0", "combined")
    assert [s.size for s in logs.usage()] == [100]
