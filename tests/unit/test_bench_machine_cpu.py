"""B18's CPU split: a phase's machine CPU per job, by who spent it, from two /proc samples."""

from __future__ import annotations

import pytest

from bench.machine_cpu import Sample, process_start_ms, split


def _sample(broker: float, agents: dict[int, tuple[float, float]], bench: float, idle: float, total: float) -> Sample:
    return Sample(broker_s=broker, agents_s=agents, bench_s=bench, idle_s=idle, all_s=total)


def test_split_charges_each_process_its_cpu_per_job_and_the_idle_share_of_the_machine() -> None:
    before = _sample(10.0, {7: (1.0, 0.5), 8: (2.0, 1.0)}, 3.0, 100.0, 400.0)
    after = _sample(10.5, {7: (1.4, 0.7), 8: (2.4, 1.1)}, 3.1, 101.0, 404.0)
    phase = split(before, after, 500)
    assert phase.broker_ms == pytest.approx(1.0)
    assert phase.agents_ms == pytest.approx(1.6)  # 0.8 s over both agents
    assert phase.jobs_ms == pytest.approx(0.6)  # what they reaped
    assert phase.clients_ms == pytest.approx(0.2)
    assert phase.total_ms == pytest.approx(3.4)
    assert phase.idle == pytest.approx(0.25)


def test_an_agent_started_during_the_phase_counts_from_zero_and_a_gone_one_not_at_all() -> None:
    before = _sample(0.0, {7: (1.0, 1.0), 9: (5.0, 5.0)}, 0.0, 0.0, 1.0)
    after = _sample(0.0, {7: (1.0, 1.0), 8: (0.3, 0.1)}, 0.0, 0.0, 2.0)
    phase = split(before, after, 100)
    assert phase.agents_ms == pytest.approx(3.0)
    assert phase.jobs_ms == pytest.approx(1.0)
    assert phase.idle == 0.0


def test_the_start_cost_of_a_program_that_is_not_there_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        process_start_ms("no-such-program-anywhere", starts=1)
