"""A finished attempt's logs, from its pods' agents into the broker's log store.

A short attempt's logs came inline with its final status (no request per stream); a longer one's are read
from the agent in chunks. A rank whose agent is lost has no logs to copy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from broker.errors import FirepoolError
from broker.pods import Pod
from broker.ports.agent import AttemptStatus
from broker.ports.backend import Backend
from broker.ports.logs import STREAMS, LogStore

log = logging.getLogger("firepool.executing")

CHUNK = 8 << 20
"""Bytes per log read from an agent."""


async def copy_logs(
    backend: Backend, logs: LogStore, aid: str, pods: Sequence[Pod], statuses: Sequence[AttemptStatus | None]
) -> None:
    """Store every stream of every rank that did not get lost (rank 0 under the stream's name)."""

    async def copy(rank: int, pod: Pod, stream: str) -> None:
        inline = statuses[rank]
        if inline is not None and inline.logs is not None and stream in inline.logs:
            await _write(logs, aid, rank, stream, inline.logs[stream])
            return
        agent = backend.agent(pod.name)
        chunks, offset = [], 0
        try:
            while True:
                chunk = await agent.read_log(aid, stream, offset, CHUNK)
                chunks.append(chunk.data)
                offset = chunk.next_offset
                if chunk.complete or not chunk.data:
                    break
        except FirepoolError as exc:
            log.warning("copying the %s log of %s from %s failed: %s", stream, aid, pod.name, exc)
        await _write(logs, aid, rank, stream, b"".join(chunks))

    await asyncio.gather(
        *(
            copy(rank, pod, stream)
            for rank, pod in enumerate(pods)
            if statuses[rank] is not None
            for stream in STREAMS
        )
    )


async def _write(logs: LogStore, aid: str, rank: int, stream: str, data: bytes) -> None:
    name = stream if rank == 0 else f"rank{rank}.{stream}"
    if logs.blocking and data:  # an empty log writes nothing worth a worker thread
        await asyncio.to_thread(logs.write, aid, name, data)
    else:
        logs.write(aid, name, data)
