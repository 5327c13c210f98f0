"""The pod cache: a list, then a watch from its resourceVersion; on 410 Gone a re-list that forgets nothing.

`PodCache` is pure state (events in, changes out) so unit tests drive it with a fake event stream.
`Watcher` runs list+watch forever: a dropped stream resumes from the last resourceVersion seen (bookmarks
keep it fresh), a 410 re-lists, and the re-list's diff turns pods that vanished meanwhile into deletions.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("firepool.k8s.watch")


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410 or an ERROR event with code 410)."""


@dataclass(frozen=True)
class Change:
    kind: str
    """`added`, `modified` or `deleted`."""
    pod: Mapping[str, Any]


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class PodCache:
    """Pods by name as last seen, and the resourceVersion to watch from."""

    def __init__(self) -> None:
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.resource_version = ""
        self.listed = False

    def replace(self, items: list[dict[str, Any]], resource_version: str) -> list[Change]:
        """A (re-)list: the new truth. Pods no longer there come out as deletions, new ones as additions."""
        fresh: dict[str, Mapping[str, Any]] = {_name(p): p for p in items}
        changes = [Change("deleted", old) for name, old in self.pods.items() if name not in fresh]
        for name, pod in fresh.items():
            old = self.pods.get(name)
            if old is None:
                changes.append(Change("added", pod))
            elif _rv(old) != _rv(pod):
                changes.append(Change("modified", pod))
        self.pods = fresh
        self.resource_version = resource_version
        self.listed = True
        return changes

    def apply(self, event: Mapping[str, Any]) -> Change | None:
        """One watch event; raises Gone on a 410 ERROR event."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message", "resourceVersion too old")))
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        rv = _rv(obj)
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return None
        name = _name(obj)
        if kind == "DELETED":
            self.pods.pop(name, None)
            return Change("deleted", obj)
        if kind in ("ADDED", "MODIFIED"):
            old = self.pods.get(name)
            self.pods[name] = obj
            return Change("added" if old is None else "modified", obj)
        log.warning("ignoring watch event of type %r", kind)
        return None


Lister = Callable[[], Awaitable[tuple[list[dict[str, Any]], str]]]
Streamer = Callable[[str], AsyncIterator[Mapping[str, Any]]]


class Watcher:
    """List+watch loop feeding `on_change`; `synced` is set once the first list is in the cache."""

    def __init__(self, cache: PodCache, lister: Lister, streamer: Streamer,
                 on_change: Callable[[Change], None], pause_s: float = 0.5) -> None:
        self.cache = cache
        self.lister = lister
        self.streamer = streamer
        self.on_change = on_change
        self.pause_s = pause_s
        self.synced = asyncio.Event()
        self.relists = 0
        self.resumes = 0

    async def relist(self) -> None:
        items, rv = await self.lister()
        for change in self.cache.replace(items, rv):
            self.on_change(change)
        self.relists += 1
        self.synced.set()

    async def run(self) -> None:
        while True:
            try:
                if not self.cache.listed:
                    await self.relist()
                async for event in self.streamer(self.cache.resource_version):
                    change = self.cache.apply(event)
                    if change is not None:
                        self.on_change(change)
                self.resumes += 1  # the server ended the stream (timeout): resume from the last version
            except Gone as exc:
                log.info("watch expired (%s): re-listing", exc)
                self.cache.listed = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any stream failure: pause, resume, never give up
                log.warning("pod watch failed, resuming in %.1f s: %r", self.pause_s, exc)
                await asyncio.sleep(self.pause_s)
