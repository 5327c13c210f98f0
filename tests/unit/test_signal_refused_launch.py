"""Signalling a job whose attempt the agent does not know is a 409 Conflict, not a 502 from the agent."""

from __future__ import annotations

import pytest

from broker.errors import Conflict
from tests.unit.harness import Harness, cpu_pool


async def test_a_signal_to_an_attempt_the_agent_never_ran_is_a_conflict() -> None:
    h = await Harness([cpu_pool()]).start()
    try:
        job = await h.submit(command=("sleep", "100"))
        await h.until(lambda: bool(h.cp.executor.launched.get(job.id)))
        for agent in h.backend.agents.values():
            agent.runs.clear()  # the agent refused the launch, or forgot the attempt
        with pytest.raises(Conflict, match="no running attempt"):
            await h.cp.signal("alice", job.id, "INT")
    finally:
        await h.stop()
