"""Supervised background work: every task starts here, named, and its failure is logged, never lost.

A failing *critical* task (the dispatch loop, the pool controller) stops the broker: `failed` is set and
the server shuts down cleanly instead of limping on without a dispatcher. Per-job tasks are not
critical; their owners handle expected errors, and anything unexpected is logged with the task name.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from broker.clock import Clock

log = logging.getLogger("firepool.tasks")


class Supervisor:
    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any], *, critical: bool = False) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, critical))
        return task

    def _done(self, task: asyncio.Task[Any], critical: bool) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        log.error("task %s failed", task.get_name(), exc_info=exc)
        if critical and self.failure is None:
            self.failure = exc
            self.failed.set()

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel every task and wait (bounded) for them to finish."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def idle(self) -> None:
        """Wait until no task is left (tests use it to drain per-job work)."""
        while self.tasks:
            await asyncio.wait(list(self.tasks))


class Wakeable:
    """A pass that runs as soon as something wakes it, and every `tick` seconds at the latest; with `min_gap`,
    passes woken in quick succession run at most once per `min_gap` (the wakes in between share one). A `nudge`
    is a wake that can wait: it runs the pass no sooner than `lazy_gap` after the last one, unless a `wake`
    comes meanwhile."""

    def __init__(self, clock: Clock, tick: float, step: Callable[[], object], min_gap: float = 0.0,
                 lazy_gap: float = 0.0) -> None:
        self.clock = clock
        self.tick = tick
        self.step = step
        self.min_gap = min_gap
        self.lazy_gap = max(lazy_gap, min_gap)
        self._event = asyncio.Event()
        self._urgent = asyncio.Event()
        self._last = -math.inf

    def wake(self) -> None:
        self._urgent.set()
        self._event.set()

    def nudge(self) -> None:
        self._event.set()

    async def run(self) -> None:
        while True:
            await self.clock.wait(self._event, self.tick)
            if self._event.is_set() and not self._urgent.is_set() \
                    and (left := self._last + self.lazy_gap - self.clock.now()) > 0:
                await self.clock.wait(self._urgent, left)
            if (gap := self._last + self.min_gap - self.clock.now()) > 0:
                await self.clock.sleep(gap)
            self._event.clear()
            self._urgent.clear()
            self._last = self.clock.now()
            self.step()
