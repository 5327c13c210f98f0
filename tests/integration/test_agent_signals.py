"""A job starts with its signals at their default action, whatever the agent's launcher ignored."""

from __future__ import annotations

import secrets
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from broker.running.agent_http import HttpAgentClient
from tests.integration.test_agent import launch, start_agent, wait_healthy

pytestmark = pytest.mark.integration

IGNORED_BY_LAUNCHERS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
"""`nohup` ignores SIGHUP; a script's `cmd &` ignores SIGINT and SIGQUIT (POSIX)."""


async def test_an_agent_started_ignoring_hangups_and_interrupts_starts_jobs_that_do_not() -> None:
    root = Path(tempfile.mkdtemp(prefix="fp-agent-"))
    secret = secrets.token_urlsafe(32)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in IGNORED_BY_LAUNCHERS}
    try:
        process = start_agent(root, secret)  # inherits the ignored dispositions, as an exec does
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    client = HttpAgentClient(f"unix:{root}/run/agent.sock", secret, pod="test-pod")
    try:
        await wait_healthy(client, process)
        await client.launch(launch("job-sig:0", "grep", "SigIgn", "/proc/self/status"))
        done = await client.wait("job-sig:0", 10)
        assert done.exit_code == 0
        ignored = int((await client.read_log("job-sig:0", "stdout")).data.split()[1], 16)
        assert not [sig.name for sig in IGNORED_BY_LAUNCHERS if ignored & (1 << (sig - 1))], hex(ignored)
    finally:
        await client.close()
        process.terminate()
        process.wait(10)
        subprocess.run(["rm", "-rf", str(root)], check=False)
