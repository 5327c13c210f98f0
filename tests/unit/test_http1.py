"""The agent calls' HTTP/1.1 client (broker.running.http1) against a real Unix-socket server in the test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.errors import AgentError
from broker.fencing import Term
from broker.running.agent_http import HttpAgentClient
from broker.running.http1 import AgentUnreachable, Http1Pool

Reply = Callable[[bytes], bytes]


class Server:
    """Answers each request with `reply(request head)`; counts connections; closes after a reply when told."""

    def __init__(self, path: Path, reply: Reply, close_after: bool = False) -> None:
        self.path = path
        self.reply = reply
        self.close_after = close_after
        self.connections = 0
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                self.heads.append(head + await reader.readexactly(length))
                writer.write(self.reply(head))
                await writer.drain()
                if self.close_after:
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:  # cancelled too, when the test's loop ends before the client's close reached us
            writer.close()


def ok(body: bytes = b'{"ok":true}', extra: str = "") -> Reply:
    return lambda _: (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )


async def _listen(server: Server) -> asyncio.AbstractServer:
    return await asyncio.start_unix_server(server.handle, str(server.path))


async def _closed(pool: Http1Pool) -> None:
    """Close the client and let the server's handlers see the EOF and end."""
    await pool.aclose()
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_kept_alive_connection_carries_request_after_request(tmp_path: Path) -> None:
    server = Server(tmp_path / "a.sock", ok())
    async with await _listen(server):
        pool = Http1Pool(uds=str(server.path), headers={"Authorization": "Bearer s"})
        for _ in range(3):
            reply = await pool.request("POST", "/v1/reset", b'{"x":1}', 5.0)
            assert reply.status_code == 200 and reply.json() == {"ok": True}
        assert server.connections == 1
        assert b"Authorization: Bearer s" in server.heads[0] and server.heads[0].endswith(b'{"x":1}')
        await _closed(pool)


async def test_a_connection_the_agent_closes_is_never_reused(tmp_path: Path) -> None:
    for server in (
        Server(tmp_path / "b.sock", ok(extra="Connection: close\r\n"), close_after=True),
        Server(tmp_path / "c.sock", ok(), close_after=True),
    ):  # closes without saying so
        async with await _listen(server):
            pool = Http1Pool(uds=str(server.path), headers={})
            for _ in range(3):
                await asyncio.sleep(0)  # lets the close reach our side, as idle time between jobs does
                assert (await pool.request("GET", "/v1/health", None, 5.0)).status_code == 200
            assert server.connections == 3
            await _closed(pool)


async def test_a_refusal_is_a_reply_and_a_reply_that_is_not_the_agents_dialect_is_unreachable(
    tmp_path: Path,
) -> None:
    refused = Server(tmp_path / "d.sock", lambda _: b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}")
    async with await _listen(refused):
        pool = Http1Pool(uds=str(refused.path), headers={})
        reply = await pool.request("GET", "/v1/x", None, 5.0)
        assert reply.status_code == 404 and reply.headers["content-length"] == "2"
        await _closed(pool)
    chunked = Server(
        tmp_path / "e.sock", lambda _: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    async with await _listen(chunked):
        pool = Http1Pool(uds=str(chunked.path), headers={})
        with pytest.raises(AgentUnreachable):
            await pool.request("GET", "/v1/health", None, 5.0)
        await _closed(pool)
    with pytest.raises(AgentUnreachable):  # nobody listens
        await Http1Pool(uds=str(tmp_path / "none.sock"), headers={}).request("GET", "/v1/health", None, 5.0)


async def test_a_closed_client_refuses_new_requests(tmp_path: Path) -> None:
    pool = Http1Pool(uds=str(tmp_path / "f.sock"), headers={})
    await pool.aclose()
    with pytest.raises(RuntimeError):
        await pool.request("GET", "/v1/health", None, 5.0)


async def test_every_agent_request_names_the_brokers_current_term_and_a_stale_term_deposes_it(
    tmp_path: Path,
) -> None:
    stale = b'{"error":{"class":"StaleTerm","message":"term 9 leads","retryable":false,"details":{"term":9}}}'

    def reply(head: bytes) -> bytes:
        if head.startswith(b"POST"):
            return f"HTTP/1.1 409 Conflict\r\nContent-Length: {len(stale)}\r\n\r\n".encode() + stale
        return ok(b'{"pod":"p","isolated":true}')(head)

    server = Server(tmp_path / "t.sock", reply)
    async with await _listen(server):
        deposed: list[str] = []
        term = Term(3, on_deposed=deposed.append)
        client = HttpAgentClient(f"unix:{server.path}", "s" * 32, pod="p", term=term)
        await client.health()
        term.value = 4  # the holder is read at each request: a broker that becomes leader needs no new clients
        await client.health()
        assert [b"X-Firepool-Term: 3" in h for h in server.heads] == [True, False]
        assert b"X-Firepool-Term: 4" in server.heads[1]
        assert not deposed
        with pytest.raises(AgentError) as refused:
            await client.keep_kernels(True)
        assert refused.value.details["agent_class"] == "StaleTerm" and len(deposed) == 1 and "term 9" in deposed[0]
        await client.close()
