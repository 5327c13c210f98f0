"""The agent's terminal endpoint on a real agent process: only in the session the pod holds, and a shell
that another request never waits on."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker.errors import AgentError
from firepool_agent import ptyframes
from tests.integration.test_agent import RunningAgent, agent, launch

pytestmark = pytest.mark.integration
__all__ = ["agent"]


async def _output_until(reader: asyncio.StreamReader, needle: bytes, timeout: float = 30.0) -> bytes:
    decoder, seen = ptyframes.Decoder(), b""
    async with asyncio.timeout(timeout):
        while needle not in seen:
            data = await reader.read(65536)
            assert data, f"the stream ended before {needle!r}: {seen!r}"
            for kind, payload in decoder.feed(data):
                seen += payload if kind == ptyframes.DATA else b"<exit %d>" % ptyframes.parse_exit(payload)
    return seen


async def test_a_terminal_opens_only_in_the_session_the_pod_holds(agent: RunningAgent) -> None:
    with pytest.raises(AgentError) as none:
        await agent.client.upgrade("/v1/terminal", {}, ptyframes.PROTOCOL)
    assert none.value.details["status"] == 409
    status = await agent.client.launch(launch("a1", "true", session="s1"))
    assert status is not None
    with pytest.raises(AgentError) as other:
        await agent.client.upgrade("/v1/terminal", {"session": "s2"}, ptyframes.PROTOCOL)
    assert other.value.details["status"] == 409
    with pytest.raises(AgentError) as bad:
        await agent.client.upgrade("/v1/terminal", {"session": "s1", "rows": 0}, ptyframes.PROTOCOL)
    assert bad.value.details["status"] == 400


async def test_an_open_terminal_never_holds_up_the_agents_other_requests(agent: RunningAgent) -> None:
    await agent.client.launch(launch("a1", "true", session="s1"))
    reader, writer = await agent.client.upgrade("/v1/terminal", {"session": "s1", "env": '{"MINE": "x1"}'},
                                                ptyframes.PROTOCOL)
    # The SIGINT below goes once the foreground job says it runs: sent while the shell was still starting it, it
    # reached the shell's own group and the sleep ran its 30 s (seen once under a loaded full run).
    writer.write(ptyframes.frame(ptyframes.DATA, b"echo $MINE-$FIREPOOL_WORKSPACE; sh -c 'echo sleep''ing; exec sleep 30'\r"))
    assert b"x1-/" in await _output_until(reader, b"sleeping")
    began = time.perf_counter()
    await agent.client.health()
    status = await agent.client.launch(launch("a2", "sh", "-c", "echo beside", session="s1"))
    assert status is not None and time.perf_counter() - began < 5
    writer.write(ptyframes.frame(ptyframes.SIGNAL, b"INT") + ptyframes.frame(ptyframes.DATA, b"exit 9\r"))
    assert (await _output_until(reader, b"<exit")).endswith(b"<exit 9>")
    writer.close()
