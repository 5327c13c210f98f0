"""The agent's `/v1/tunnel`: a byte stream to a server a job of the sandbox runs, and only such a server.

The agent here is unisolated (it shares this host's network), which is the case the listener check exists
for: a server of this test process on the same 127.0.0.1 is not the sandbox's and must stay unreachable."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from broker.errors import AgentError
from tests.integration.conftest import free_port
from tests.integration.test_agent import PY, RunningAgent, agent, launch  # noqa: F401 - `agent` is a fixture

pytestmark = pytest.mark.integration

ECHO = ("import socket, sys\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(1); print('listening', flush=True)\n"
        "c, _ = s.accept()\n"
        "while data := c.recv(65536):\n"
        "    c.sendall(data.upper())\n"
        "c.sendall(b'BYE'); c.close()\n")


async def until_listening(running: RunningAgent, attempt: str) -> None:
    for _ in range(200):
        if b"listening" in (await running.client.read_log(attempt)).data:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the job's server never listened")


@pytest.fixture
async def host_listener() -> AsyncIterator[int]:
    """A server of this test process (not of the sandbox) on this host's loopback."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def test_the_tunnel_splices_bytes_both_ways_and_passes_a_half_close_on(agent: RunningAgent) -> None:  # noqa: F811
    port = free_port()
    await agent.client.launch(launch("echo:0", PY, "-S", "-c", ECHO, str(port)))
    await until_listening(agent, "echo:0")
    reader, writer = await agent.client.upgrade("/v1/tunnel", {"port": port}, "firepool-tcp")
    writer.write(b"hello ")
    assert await reader.readexactly(6) == b"HELLO "
    writer.write(b"x" * 1_000_000)
    assert await reader.readexactly(1_000_000) == b"X" * 1_000_000
    writer.write_eof()  # the server reads its EOF, answers, and closes: the tunnel ends both ways
    assert await asyncio.wait_for(reader.read(), 10) == b"BYE"
    writer.close()
    done = await agent.client.wait("echo:0", 10)
    assert done.exit_code == 0


async def test_a_port_no_process_of_the_sandbox_listens_on_is_refused(agent: RunningAgent,  # noqa: F811
                                                                     host_listener: int) -> None:
    for port in (host_listener, free_port()):  # this host's own server, and nothing at all
        with pytest.raises(AgentError) as info:
            await agent.client.upgrade("/v1/tunnel", {"port": port}, "firepool-tcp")
        assert info.value.details["status"] == 502
    with socket.create_connection(("127.0.0.1", host_listener)):
        pass  # it does listen: the agent refused it for not being the sandbox's
