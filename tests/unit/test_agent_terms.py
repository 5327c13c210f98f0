"""The agent's term rules (a deposed leader changes nothing in a pod), the one-attempt-per-job rule, the
orphan bound, and the leader's heartbeat that keeps every idle pod within it."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest

from broker.jobs import attempt_id
from broker.pods import PodState
from firepool_agent.attempt import LaunchSpec
from firepool_agent.attempts import Attempts, busy_message, job_of
from firepool_agent.config import AgentConfig, parse_args
from firepool_agent.orphan import OrphanWatch
from firepool_agent.reaping import Reaper
from firepool_agent.resetting import ResetOutcome, ResetSpec
from firepool_agent.server import Agent
from firepool_agent.terms import StaleTerm, Terms, changes, parse
from tests.unit.harness import Harness, cpu_pool


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_newer_term_on_any_request_becomes_the_newest() -> None:
    terms = Terms()
    terms.check(3, changing=False, what="GET health")
    assert terms.newest == 3
    terms.check(5, changing=True, what="POST attempts")
    assert terms.newest == 5 and terms.refused == 0


def test_a_change_under_an_older_term_is_refused_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    terms = Terms()
    terms.check(7, changing=False, what="GET health")
    with caplog.at_level(logging.WARNING), pytest.raises(StaleTerm) as refused:
        terms.check(6, changing=True, what="POST v1/attempts")
    assert refused.value.newest == 7 and refused.value.sent == 6
    assert terms.refused == 1 and terms.newest == 7
    assert any(r.getMessage().startswith("stale term refused: POST v1/attempts") for r in caplog.records)


def test_reads_under_an_older_term_are_answered() -> None:
    terms = Terms()
    terms.check(2, changing=False, what="GET health")
    terms.check(1, changing=False, what="GET attempts/j:0")
    assert terms.refused == 0 and terms.newest == 2


def test_no_header_is_term_zero_and_old_tools_work_until_a_term_is_known() -> None:
    terms = Terms()
    terms.check(parse(None), changing=True, what="POST reset")
    terms.check(1, changing=False, what="GET health")
    with pytest.raises(StaleTerm):
        terms.check(parse(None), changing=True, what="POST reset")


@pytest.mark.parametrize("value", ["x", "-1", "1.5"])
def test_a_malformed_term_header_is_rejected(value: str) -> None:
    with pytest.raises(ValueError):
        parse(value)


def test_every_post_and_put_and_the_stream_opening_gets_change_the_pod() -> None:
    assert changes("POST", "attempts") and changes("POST", "reset") and changes("POST", "kernels")
    assert changes("PUT", "packages")
    assert changes("GET", "terminal") and changes("GET", "exec") and changes("GET", "tunnel")
    assert not changes("GET", "health") and not changes("GET", "attempts")


def test_the_newest_term_survives_an_agent_restart_in_its_state_dir(tmp_path: Path) -> None:
    Terms(str(tmp_path)).check(9, changing=False, what="GET health")
    again = Terms(str(tmp_path))
    assert again.newest == 9
    with pytest.raises(StaleTerm):
        again.check(8, changing=True, what="POST attempts")


def test_only_requests_of_a_current_term_count_as_broker_contact() -> None:
    clock = Clock()
    terms = Terms(clock=clock)
    terms.check(4, changing=False, what="GET health")
    clock.now += 50
    terms.check(3, changing=False, what="GET attempts/j:0")  # a deposed broker's poll keeps nothing alive
    assert terms.silent_for() == 50
    terms.check(4, changing=False, what="GET health")
    assert terms.silent_for() == 0


def test_an_agent_past_its_orphan_bound_ends_and_zero_never_does() -> None:
    clock = Clock()
    terms = Terms(clock=clock)
    watch = OrphanWatch(terms, 300.0)
    clock.now += 299
    assert watch.due() is None
    clock.now += 2
    assert watch.due() == 301
    never = OrphanWatch(terms, 0.0)
    clock.now += 10_000
    assert never.due() is None and never.start() is None


def test_the_orphan_bound_comes_from_the_flag_or_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    base = ["--listen", "unix:/tmp/x.sock", "--workspace", "w", "--package-dir", "p", "--run-dir", "r",
            "--tmp-dir", "t"]
    secret.write_text("s" * 32)
    assert parse_args([*base, "--secret-file", str(secret)])[0].orphan_after_s == 300.0
    monkeypatch.setenv("FIREPOOL_AGENT_ORPHAN_AFTER_S", "7")
    secret.write_text("s" * 32)
    assert parse_args([*base, "--secret-file", str(secret)])[0].orphan_after_s == 7.0
    secret.write_text("s" * 32)
    assert parse_args([*base, "--secret-file", str(secret), "--orphan-after-s", "0"])[0].orphan_after_s == 0.0


def test_a_later_attempt_of_a_running_job_is_told_why_it_waits() -> None:
    first, second = attempt_id("job-7", 0), attempt_id("job-7", 1)
    assert job_of(first) == job_of(second) == "job-7"
    assert "of the same job is still running" in busy_message(first, second)
    assert busy_message(attempt_id("job-8", 0), second) == "attempt job-8:0 is running"


async def test_the_leader_calls_every_idle_pods_agent_within_its_heartbeat() -> None:
    h = await Harness([cpu_pool(min_count=2)]).start()
    try:
        await h.run_for(2.0)
        idle = [p.name for p in h.cp.tracker.snapshot() if p.state is PodState.IDLE]
        assert len(idle) == 2
        calls: list[str] = []
        for name in idle:
            agent = h.backend.agents[name]
            real = agent.health

            async def counted(real=real, name=name):  # type: ignore[no-untyped-def]
                calls.append(name)
                return await real()

            agent.health = counted  # type: ignore[method-assign]
        await h.run_for(h.cp.tuning.agent_heartbeat_s + 1.0, step=0.5)
        assert sorted(set(calls)) == sorted(idle)
    finally:
        await h.stop()


def test_a_launch_that_waited_for_the_lock_is_judged_against_the_newest_term(tmp_path: Path) -> None:
    config = AgentConfig(pod="p", listen="unix:/x", workspace=str(tmp_path / "w"), package_dir=str(tmp_path / "p"),
                         run_dir=str(tmp_path / "r"), tmp_dir=str(tmp_path / "t"))
    attempts = Attempts(config, Reaper())
    terms = Terms()
    terms.check(4, changing=True, what="POST v1/attempts")  # the old leader's launch passed at its arrival
    terms.check(5, changing=False, what="GET v1/health")  # the new leader's probe came in while it waited
    with pytest.raises(StaleTerm):
        attempts.launch(LaunchSpec("job-1:0", ["true"], {}, "s1"), partial(terms.check, 4, True, "POST v1/attempts"))
    assert attempts.get("job-1:0") is None and attempts.current is None and not attempts.launch_lock.locked()


def test_a_reset_after_a_launch_that_raises_reads_as_unclean_and_leaves_the_pod_not_clean(tmp_path: Path) -> None:
    config = AgentConfig(pod="p", listen="unix:/x", workspace=str(tmp_path / "w"), package_dir=str(tmp_path / "p"),
                         run_dir=str(tmp_path / "r"), tmp_dir=str(tmp_path / "t"))
    agent = Agent(config, b"secret", Attempts(config, Reaper()), Terms())
    agent.changes += 1  # the launch it follows

    def broken(spec: ResetSpec) -> ResetOutcome:
        raise OSError("a bug in the wipe")

    agent.resetter.reset = broken  # type: ignore[method-assign]
    outcome = agent.reset_after(ResetSpec(), "job-1:0")
    assert not outcome.clean and "a bug in the wipe" in outcome.problems[0]
    assert agent.still_clean() is None  # a broker taking over resets it (or deletes it) before any reuse
