"""The pod cache and the list+watch loop, driven by a fake API: resume, 410 re-list, bookmarks, deletions
that happened while the stream was down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from broker.backends.kubernetes.watching import Change, Gone, PodCache, Watcher


def pod(name: str, rv: int, phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv), "uid": f"uid-{name}"}, "status": {"phase": phase}}


def ev(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


class FakeApi:
    """Pods by name with a resourceVersion counter; each watch call plays the next scripted stream."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.streams: list[list[dict[str, Any]] | Exception] = []
        self.watched_from: list[str] = []
        self.lists = 0
        self.idle = asyncio.Event()

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return list(self.pods.values()), str(self.rv)

    async def watch(self, rv: str) -> AsyncIterator[Mapping[str, Any]]:
        self.watched_from.append(rv)
        if not self.streams:
            self.idle.set()
            await asyncio.Event().wait()  # a quiet, open stream
        script = self.streams.pop(0)
        if isinstance(script, Exception):
            raise script
        for event in script:
            if event["type"] == "GONE":
                raise Gone("too old resource version")
            yield event


async def run_until_idle(api: FakeApi, changes: list[Change]) -> Watcher:
    cache = PodCache()
    watcher = Watcher(cache, api.list, api.watch, changes.append, pause_s=0.0)
    task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(api.idle.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return watcher


def test_cache_applies_events_and_tracks_the_last_resource_version() -> None:
    cache = PodCache()
    cache.replace([pod("a", 1)], "5")
    assert cache.apply(ev("MODIFIED", pod("a", 6, "Running"))) == Change("modified", pod("a", 6, "Running"))
    assert cache.apply(ev("ADDED", pod("b", 7))) == Change("added", pod("b", 7))
    assert cache.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) is None
    assert cache.resource_version == "9"
    assert cache.apply(ev("DELETED", pod("a", 10))) == Change("deleted", pod("a", 10))
    assert set(cache.pods) == {"b"} and cache.resource_version == "10"


def test_error_event_410_raises_gone() -> None:
    cache = PodCache()
    with pytest.raises(Gone):
        cache.apply({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})


def test_relist_reports_pods_that_vanished_and_appeared_meanwhile() -> None:
    cache = PodCache()
    cache.replace([pod("a", 1), pod("b", 2)], "2")
    changes = cache.replace([pod("b", 2), pod("c", 3)], "3")
    assert sorted((c.kind, c.pod["metadata"]["name"]) for c in changes) == [("added", "c"), ("deleted", "a")]


async def test_dropped_stream_resumes_from_the_last_version_seen() -> None:
    api = FakeApi()
    api.pods = {"a": pod("a", 1)}
    api.rv = 1
    api.streams = [[ev("MODIFIED", pod("a", 2, "Running"))], ConnectionResetError("dropped"),
                   [ev("ADDED", pod("b", 3))]]
    changes: list[Change] = []
    watcher = await run_until_idle(api, changes)
    assert api.watched_from == ["1", "2", "2", "3"]
    assert api.lists == 1  # no re-list for a drop: resume
    assert set(watcher.cache.pods) == {"a", "b"}


async def test_410_mid_stream_relists_and_loses_no_event() -> None:
    api = FakeApi()
    api.pods = {"a": pod("a", 1), "b": pod("b", 1)}
    api.rv = 1
    # While the watch was away, `a` was deleted and `c` created; the stream then says 410.
    api.streams = [[ev("MODIFIED", pod("b", 2, "Running")), {"type": "GONE"}]]
    changes: list[Change] = []

    original_list = api.list

    async def list_after_gone() -> tuple[list[dict[str, Any]], str]:
        if api.lists == 1:
            api.pods = {"b": pod("b", 2, "Running"), "c": pod("c", 4)}
            api.rv = 4
        return await original_list()

    api.list = list_after_gone  # type: ignore[method-assign]
    watcher = await run_until_idle(api, changes)
    assert api.lists == 2 and watcher.relists == 2
    assert api.watched_from == ["1", "4"]
    kinds = [(c.kind, c.pod["metadata"]["name"]) for c in changes]
    assert ("deleted", "a") in kinds and ("added", "c") in kinds and ("modified", "b") in kinds
    assert set(watcher.cache.pods) == {"b", "c"}
