"""RealClock.wait: the event or the timeout, whichever comes first, without a task of its own per call."""

from __future__ import annotations

import asyncio

import pytest

from broker.clock import RealClock


async def test_real_wait_returns_true_when_the_event_is_set_before_the_timeout() -> None:
    event = asyncio.Event()
    asyncio.get_running_loop().call_soon(event.set)
    assert await RealClock().wait(event, 5.0) is True


async def test_real_wait_returns_false_when_the_timeout_passes_first() -> None:
    assert await RealClock().wait(asyncio.Event(), 0.01) is False
    assert await RealClock().wait(asyncio.Event(), -1.0) is False  # a deadline already past: no wait


async def test_real_wait_on_a_set_event_returns_at_once() -> None:
    event = asyncio.Event()
    event.set()
    assert await RealClock().wait(event, 0.0) is True


async def test_real_wait_creates_no_task_of_its_own() -> None:
    before = len(asyncio.all_tasks())
    seen: list[int] = []
    event = asyncio.Event()

    def look() -> None:
        seen.append(len(asyncio.all_tasks()))
        event.set()

    asyncio.get_running_loop().call_soon(look)
    assert await RealClock().wait(event, 5.0) is True
    assert seen == [before]  # asyncio.wait_for would have wrapped event.wait() in one more task


async def test_cancelling_a_real_wait_cancels_its_task_rather_than_timing_it_out() -> None:
    task = asyncio.get_running_loop().create_task(RealClock().wait(asyncio.Event(), 5.0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_real_wait_that_timed_out_leaves_its_task_uncancelled() -> None:
    assert await RealClock().wait(asyncio.Event(), 0.0) is False
    current = asyncio.current_task()
    assert (
        current is not None and current.cancelling() == 0
    )  # a later await is not cancelled by a stale timer
    await asyncio.sleep(0.02)
