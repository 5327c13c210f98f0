"""The injected clock: every control-plane module reads time and sleeps through one of these.

`RealClock` is the wall clock; `VirtualClock` only moves when a test or the simulator advances it,
waking the sleepers whose deadlines it passes, so control-plane code runs unchanged in virtual time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for `seconds` of this clock's time."""
        ...

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait until `event` is set or `timeout` passes; True when the event was set."""
        ...


class RealClock:
    """Wall-clock time; the production clock."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        # asyncio.timeout cancels this task from a timer; wait_for (Python 3.11) would wrap event.wait()
        # in a task of its own, one more task and future per call on every launch and job-change wait.
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await event.wait()
        except TimeoutError:
            return False
        return True


class VirtualClock:
    """Time that moves only through `advance`; sleepers wake in deadline order."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), next(self._seq), fut))
        await fut

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        sleeper = asyncio.ensure_future(self.sleep(timeout))
        waiter = asyncio.ensure_future(event.wait())
        done, pending = await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return waiter in done

    def advance_to(self, when: float) -> None:
        """Move time forward to `when`, waking every sleeper whose deadline is reached."""
        while self._sleepers and self._sleepers[0][0] <= when:
            deadline, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not fut.done():
                fut.set_result(None)
        self._now = max(self._now, when)

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`."""
        self.advance_to(self._now + seconds)

    def next_deadline(self) -> float | None:
        """The earliest pending sleeper's deadline, if any (for event-driven simulation)."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None
