"""A finished attempt's logs, from its pods' agents into the broker's log store, a window at a time.

A short attempt's logs came inline with its final status (at most `INLINE_LOGS` bytes, no request per
stream); a longer one's are read from the agent a chunk at a time and appended to the store, so however
much a job printed, the broker holds at most `WINDOW` chunks of every copy together. Each stream is stored
up to the pool's `max_output_bytes`: the agent already stops there (firepool_agent.output), and a stream
that is longer anyway (an agent older than the cap) is cut here with the same marker line. A rank whose
agent is lost has no logs to copy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from broker.errors import FirepoolError
from broker.pods import Pod
from broker.pools import PoolSpec
from broker.ports.agent import AgentClient, AttemptStatus, LogChunk
from broker.ports.backend import Backend
from broker.ports.logs import STREAMS, LogStore
from firepool_agent.output import DEFAULT_MAX_BYTES, marker

log = logging.getLogger("firepool.executing")

CHUNK = 1 << 20
"""Bytes per log read from an agent."""
WINDOW = 8
"""Chunks read and not yet stored, over every copy at once: the broker's memory for logs in flight."""


def output_cap(pool: PoolSpec | None) -> int:
    """Bytes kept per stream of the pool's jobs."""
    return pool.max_output_bytes if pool is not None else DEFAULT_MAX_BYTES


def capped(data: bytes, cap: int) -> bytes:
    """`data` as stored under `cap`: whole when it fits, else cut with the marker line (total `cap`)."""
    if len(data) <= cap:
        return data
    end = marker(cap)
    return data[:cap - len(end)] + end


def _name(rank: int, stream: str) -> str:
    """A rank's stream as stored: rank 0's under the stream's own name."""
    return stream if rank == 0 else f"rank{rank}.{stream}"


class LogCopier:
    """Copies attempts' logs into the store; one per executor, so `WINDOW` bounds all copies together."""

    def __init__(self, backend: Backend, logs: LogStore) -> None:
        self.backend = backend
        self.logs = logs
        self.window = asyncio.Semaphore(WINDOW)

    async def copy(self, caller: str, aid: str, pods: Sequence[Pod], statuses: Sequence[AttemptStatus | None],
                   cap: int) -> None:
        """Store every stream of every rank that did not get lost (rank 0 under the stream's name).

        Streams that came inline with the status go to the store in one call, and an empty one not at all (an
        empty log is no file, and an attempt's logs are final once it ended: no earlier copy left another one);
        the others are read from the agent a chunk at a time."""
        writes: list[tuple[str, bytes]] = []
        streamed: list[tuple[int, Pod, str]] = []
        for rank, (pod, status) in enumerate(zip(pods, statuses, strict=True)):
            if status is None:
                continue
            for stream in STREAMS:
                inline = status.logs.get(stream) if status.logs is not None else None
                if inline is None:
                    streamed.append((rank, pod, stream))
                elif inline:
                    writes.append((_name(rank, stream), capped(inline, cap)))
        if writes:
            try:
                await self._io(self._write_all, caller, aid, writes)
            except OSError as exc:  # the host's disk: the attempt's outcome still counts
                log.error("storing the logs of %s failed: %s", aid, exc)
        if streamed:
            await asyncio.gather(*(self._stream(caller, aid, rank, pod, stream, cap) for rank, pod, stream in streamed))

    def _write_all(self, caller: str, aid: str, writes: Sequence[tuple[str, bytes]]) -> None:
        for name, data in writes:
            self.logs.write(caller, aid, name, data)

    async def _stream(self, caller: str, aid: str, rank: int, pod: Pod, stream: str, cap: int) -> None:
        name = _name(rank, stream)
        copied = [0]
        try:
            await self._chunks(self.backend.agent(pod.name), caller, aid, stream, name, cap, copied)
        except (FirepoolError, OSError) as exc:  # what was copied is kept: part of a log beats none
            log.warning("copying the %s log of %s from %s failed after %d bytes: %s", stream, aid, pod.name,
                        copied[0], exc)
        try:
            if copied[0]:
                await self._io(self.logs.commit, caller, aid, name)
            else:  # an empty log writes nothing worth a worker thread
                self.logs.write(caller, aid, name, b"")
        except OSError as exc:  # the host's disk: the attempt's outcome still counts
            log.error("storing the %s log of %s failed: %s", stream, aid, exc)

    async def _chunks(self, agent: AgentClient, caller: str, aid: str, stream: str, name: str, cap: int,
                      copied: list[int]) -> None:
        """Append the agent's stream to the store a chunk at a time, never past `cap`; `copied` counts the bytes
        stored so far (a failed read leaves what came before it)."""
        end = marker(cap)
        body = cap - len(end)  # bytes of output before a marker would be needed
        offset = 0
        while True:
            async with self.window:
                want = min(CHUNK, body - offset) if offset < body else len(end) + 1
                chunk = await agent.read_log(aid, stream, offset, want)
                data = chunk.data[:want]  # an agent that answers more than asked gets no further
                if offset >= body and (not chunk.complete or len(data) > len(end)):
                    # At the cap and more follows (an agent older than the cap): end the stream with the marker.
                    data, chunk = end, LogChunk(end, offset + len(end), True)
                if data:
                    await self._io(self.logs.append, caller, aid, name, data, first=offset == 0)
                offset += len(data)
                copied[0] = offset
            if chunk.complete or not chunk.data:
                return

    async def _io(self, call: Callable[..., None], *args: object, **kwargs: object) -> None:
        if self.logs.blocking:
            await asyncio.to_thread(call, *args, **kwargs)
        else:
            call(*args, **kwargs)
