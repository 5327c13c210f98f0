"""Watch streams: JSON lines from a resourceVersion, bookmarks, and the faults tests inject into them.

A watch subscribes to the store atomically with its replay (or its snapshot), so no event falls
between the two; a selector watch sees an object entering its selection as ADDED and leaving it as
DELETED, as the real API server sends them. `drop` cuts streams mid-body; `expire` ends them with
an ERROR 410 Gone after a compaction; `silence` leaves them open with nothing more sent (a connection a
NAT or load balancer dropped without a reset: only the client's read timeout ends it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass

from aiohttp import web

from k8s_emulator.objects import KINDS, ApiError, Event, Obj, Store
from k8s_emulator.selectors import Predicate

_DROP = "drop"
_EXPIRE = "expire"
_SILENCE = "silence"


@dataclass(eq=False)
class _Watch:
    queue: asyncio.Queue[Event | str]
    loop: asyncio.AbstractEventLoop
    request: web.Request


class Watches:
    def __init__(self, store: Store, bookmark_interval_s: float) -> None:
        self.store = store
        self.bookmark_interval_s = bookmark_interval_s
        self._open: set[_Watch] = set()

    @property
    def open(self) -> int:
        return len(self._open)

    def drop(self) -> int:
        return self._tell(_DROP)

    def expire(self) -> int:
        self.store.compact()
        return self._tell(_EXPIRE)

    def silence(self) -> int:
        return self._tell(_SILENCE)

    def _tell(self, what: str) -> int:
        watches = list(self._open)
        for watch in watches:
            watch.loop.call_soon_threadsafe(watch.queue.put_nowait, what)
        return len(watches)

    async def serve(self, request: web.Request, resource: str, namespace: str | None, matches: Predicate, *,
                    expire: ApiError | None = None) -> web.StreamResponse:
        """Stream events of `resource` from the request's resourceVersion ("" or "0": the objects now
        as ADDED, then changes); a too-old version or `expire` sends one ERROR event with a 410 Status."""
        q = request.query
        since = q.get("resourceVersion", "")
        if since and not since.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version: {since!r}")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout_s = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        loop = asyncio.get_running_loop()
        watch = _Watch(asyncio.Queue(), loop, request)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)

        def listener(event: Event) -> None:
            loop.call_soon_threadsafe(watch.queue.put_nowait, event)

        kind = KINDS[resource]
        unsubscribe = self.store.unsubscriber(listener)
        self._open.add(watch)
        try:
            if expire is not None:
                raise expire
            if since in ("", "0"):
                items, _ = self.store.snapshot(resource, namespace, listener)
                for item in items:
                    if matches(item):
                        await _send(response, "ADDED", item)
            else:
                self.store.replay(resource, int(since), listener)
        except ApiError as exc:
            await _send(response, "ERROR", exc.status())
            unsubscribe()
            self._open.discard(watch)
            await response.write_eof()
            return response
        deadline = loop.time() + timeout_s if timeout_s else None
        silent = False
        try:
            while True:
                if silent:  # a connection dropped silently on the way: nothing reaches the client, not even the end
                    if request.transport is None or request.transport.is_closing():
                        return response
                    with contextlib.suppress(TimeoutError):
                        if await asyncio.wait_for(watch.queue.get(), 0.05) == _DROP:
                            return response
                    continue
                wait = self.bookmark_interval_s if bookmarks else None
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    wait = min(wait, left) if wait is not None else left
                try:
                    event = await asyncio.wait_for(watch.queue.get(), wait)
                except TimeoutError:
                    if bookmarks:
                        version = str(self.store.resource_version)
                        await _send(response, "BOOKMARK", {"kind": kind, "apiVersion": "v1",
                                                           "metadata": {"resourceVersion": version}})
                    continue
                if event == _DROP:  # cut the connection without ending the chunked body
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if event == _SILENCE:
                    silent = True
                    continue
                if event == _EXPIRE:
                    await _send(response, "ERROR", ApiError(410, "Expired", "too old resource version: "
                                                            f"{self.store.compacted}").status())
                    break
                assert isinstance(event, Event)
                if event.resource != resource or (namespace and event.namespace != namespace):
                    continue
                kind_sent = as_seen(event, matches)
                if kind_sent is not None:
                    await _send(response, kind_sent, event.obj)
        except ConnectionResetError:  # the client went away (a watcher closing its response): nothing to end
            return response
        finally:
            unsubscribe()
            self._open.discard(watch)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response


def as_seen(event: Event, matches: Predicate) -> str | None:
    """The event a selector watch sees: entering the selection is ADDED, leaving it is DELETED."""
    now = event.type != "DELETED" and matches(event.obj)
    before = event.prev is not None and matches(event.prev)
    if event.type == "ADDED":
        return "ADDED" if now else None
    if event.type == "DELETED":
        return "DELETED" if before or matches(event.obj) else None
    if now:
        return "MODIFIED" if before else "ADDED"
    return "DELETED" if before else None


async def _send(response: web.StreamResponse, kind: str, obj: Obj) -> None:
    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

