"""The partitioning proxy of the HA tests, against a real echo server: a cut keeps sockets open and silent."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.integration.partition_proxy import PartitionProxy

pytestmark = pytest.mark.integration


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _round_trip(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def test_a_cut_silences_open_and_new_connections_without_closing_them(echo_port: int) -> None:
    with PartitionProxy("127.0.0.1", echo_port) as proxy:
        before = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)
        assert _round_trip(before, b"ping") == b"ping"
        proxy.cut()
        with pytest.raises(TimeoutError):  # no answer, and no EOF either: the socket stays open
            _round_trip(before, b"lost")
        during = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)  # accepted, then silence
        with pytest.raises(TimeoutError):
            _round_trip(during, b"lost too")
        assert proxy.bytes_after_cut == len(b"lost") + len(b"lost too")
        proxy.heal()
        after = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        assert _round_trip(after, b"again") == b"again"
        for s in (before, during, after):
            s.close()
