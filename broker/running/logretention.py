"""Log retention: a supervised sweeper keeps the log store within an age and a byte budget per caller.

A job's output is capped per stream (the pool's `max_output_bytes`), but a caller running many jobs could
still fill the host's disk under the state dir. Every `sweep_every_s` the sweeper weighs the stored logs
(`LogStore.usage`), removes those older than `max_age_s`, and each caller's oldest beyond its
`max_bytes_per_caller`, and the oldest of all beyond `max_bytes_total` (when set). The store remembers per caller the newest log it removed, so reading a swept
job's log says so (410 `LogsSwept`) instead of answering an empty log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from broker.clock import Clock
from broker.errors import LogsSwept
from broker.ports.logs import LogStore, StoredLogs

log = logging.getLogger("firepool.logs")


@dataclass(frozen=True)
class LogRetention:
    """How long and how much of each caller's logs the broker keeps (`firepool serve --log-*`)."""

    max_age_s: float | None = 7 * 86400.0
    """Logs older than this are removed; None keeps them whatever their age."""
    max_bytes_per_caller: int | None = 10 << 30
    """A caller's oldest logs are removed past this many bytes; None: no byte budget."""
    max_bytes_total: int | None = None
    """Every caller's logs together: the oldest are removed past this many bytes (size it to the volume)."""
    sweep_every_s: float = 300.0
    """Seconds between sweeps (the first runs at start)."""


def to_sweep(stored: Sequence[StoredLogs], now: float, retention: LogRetention) -> list[StoredLogs]:
    """The jobs whose logs go: past the age, then each caller's oldest beyond its byte budget, then the oldest
    beyond the total."""
    gone = [s for s in stored if retention.max_age_s is not None and s.written_at < now - retention.max_age_s]
    if retention.max_bytes_per_caller is not None:
        by_caller: dict[str, list[StoredLogs]] = {}
        for s in _left(stored, gone):
            by_caller.setdefault(s.caller_key, []).append(s)
        for logs in by_caller.values():
            gone += _beyond(logs, retention.max_bytes_per_caller)
    if retention.max_bytes_total is not None:
        gone += _beyond(_left(stored, gone), retention.max_bytes_total)
    return gone


def _left(stored: Sequence[StoredLogs], gone: Sequence[StoredLogs]) -> list[StoredLogs]:
    leaving = {id(s) for s in gone}
    return [s for s in stored if id(s) not in leaving]


def _beyond(logs: Sequence[StoredLogs], budget: int) -> list[StoredLogs]:
    """The oldest of `logs` past `budget` bytes (the newest are kept first)."""
    over, kept = [], 0
    for s in sorted(logs, key=lambda s: s.written_at, reverse=True):
        kept += s.size
        if kept > budget:
            over.append(s)
    return over


class LogSweeper:
    def __init__(self, clock: Clock, logs: LogStore, retention: LogRetention) -> None:
        self.clock = clock
        self.logs = logs
        self.retention = retention

    async def run(self) -> None:
        while True:
            await self.sweep()
            await self.clock.sleep(self.retention.sweep_every_s)

    async def sweep(self) -> list[StoredLogs]:
        """One pass; the jobs whose logs were removed."""
        r = self.retention
        if r.max_age_s is None and r.max_bytes_per_caller is None and r.max_bytes_total is None:
            return []
        now = self.clock.now()
        if self.logs.blocking:
            return await asyncio.to_thread(self._sweep, now)
        return self._sweep(now)

    def _sweep(self, now: float) -> list[StoredLogs]:
        gone = to_sweep(self.logs.usage(), now, self.retention)
        for stored in sorted(gone, key=lambda s: s.written_at):  # oldest first: a crash leaves the mark right
            self.logs.remove(stored)
        if gone:
            log.info("log retention removed the logs of %d jobs (%d bytes)", len(gone), sum(s.size for s in gone))
        return gone

    def check(self, caller: str, job_id: str, launched_at: float | None, finished_at: float | None) -> None:
        """Raise LogsSwept when a finished attempt's missing log is one retention removed.

        Only a log that reads empty comes here, so the test may be generous: an attempt launched before the
        newest log removed for its caller, or finished longer ago than the age, lost its log (a quiet one had
        none, and is answered the same)."""
        if finished_at is None:
            return
        age = self.retention.max_age_s
        if age is not None and finished_at < self.clock.now() - age:
            raise LogsSwept(f"the logs of job {job_id} were removed: logs are kept for {age:g} s",
                            {"job": job_id, "reason": "age", "max_age_s": age})
        if (launched_at if launched_at is not None else finished_at) <= self.logs.swept_until(caller):
            raise LogsSwept(f"the logs of job {job_id} were removed: the stored logs passed their byte budget",
                            {"job": job_id, "reason": "bytes",
                             "max_bytes_per_caller": self.retention.max_bytes_per_caller,
                             "max_bytes_total": self.retention.max_bytes_total})
