"""A TCP proxy that can partition: put it between one process and its database, then `cut()` it.

A cut stops forwarding in both directions but keeps every socket open, as a network partition does (no
FIN, no RST: the client's reads simply never return); a connection made during the cut is accepted and
held the same way. `heal()` forwards again, for new connections (the held ones stay dead). It runs its
own asyncio loop on a thread, so a synchronous test drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from types import TracebackType


class PartitionProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0
        self.bytes_after_cut = 0
        """Bytes a client sent into the cut (read, never forwarded)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="partition proxy", daemon=True)
        self._open = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> PartitionProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def cut(self) -> None:
        """From now on (once this returns) nothing passes either way."""
        self._on_loop(self._open.clear)

    def heal(self) -> None:
        self._on_loop(self._open.set)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        async def call() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):  # cancelled: the proxy closes
            await self._forward(reader, writer)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        if not self._open.is_set():  # made during the cut: accepted, then silence
            await self._drain_into_cut(reader)
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.add(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            with contextlib.suppress(Exception):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                if self._open.is_set():
                    writer.close()
                return
            if not self._open.is_set():
                self.bytes_after_cut += len(data)
                await self._drain_into_cut(reader)
                return
            writer.write(data)
            await writer.drain()

    async def _drain_into_cut(self, reader: asyncio.StreamReader) -> None:
        """Read and drop what the client sends, forever: its socket stays open and nothing answers."""
        while data := await reader.read(65536):
            self.bytes_after_cut += len(data)
        await asyncio.Event().wait()  # its peer closed: keep our side open all the same, as a partition would
