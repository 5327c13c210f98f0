"""A job starts with its signals at their default action, whatever the agent's launcher ignored."""

from __future__ import annotations

import signal

import pytest

from tests.integration.test_agent import launch, running_agent

pytestmark = pytest.mark.integration

IGNORED_BY_LAUNCHERS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
"""`nohup` ignores SIGHUP; a script's `cmd &` ignores SIGINT and SIGQUIT (POSIX)."""


async def test_an_agent_started_ignoring_hangups_and_interrupts_starts_jobs_that_do_not() -> None:
    async with running_agent(ignoring=IGNORED_BY_LAUNCHERS) as agent:
        await agent.client.launch(launch("job-sig:0", "grep", "SigIgn", "/proc/self/status"))
        done = await agent.client.wait("job-sig:0", 10)
        assert done.exit_code == 0
        ignored = int((await agent.client.read_log("job-sig:0", "stdout")).data.split()[1], 16)
        assert not [sig.name for sig in IGNORED_BY_LAUNCHERS if ignored & (1 << (sig - 1))], hex(ignored)
