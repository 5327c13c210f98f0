"""envd's directory watches (`files.watch_dir`): a small polling watcher runs in the sandbox beside the holding
job (a process the pod agent starts) and prints one JSON line per change; the broker turns them into
`FilesystemEvent`s. The sync SDK polls them (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`), the async
SDK streams them (`WatchDir`). Polling (every 100 ms) sees what changed between two looks: a file created
and written in one interval is one CREATE, and `include_entry` is not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from broker.api.e2b.connect import RpcError, end_stream, envelope
from broker.api.e2b.connect import field as get
from broker.api.e2b.processes import KEEPALIVE_S, Running
from broker.api.e2b.sandboxes import Sandbox
from broker.errors import FirepoolError

MAX_PENDING = 10_000
"""Events a sync watcher keeps between two `GetWatcherEvents`; older ones are dropped."""

WATCHER = r'''
import json, os, sys, time
root, recursive = os.path.abspath(os.path.expanduser(sys.argv[1])), sys.argv[2] == "1"
def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
if not os.path.isdir(root):
    say({"error": "not_found" if not os.path.exists(root) else "invalid_argument",
         "message": f"{sys.argv[1]}: not a directory"}); sys.exit(0)
def look():
    seen = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            seen[os.path.relpath(p, root)] = (st.st_mtime_ns, st.st_size, st.st_mode)
        if not recursive:
            break
    return seen
before = look()
say({"ready": True})
while True:
    time.sleep(0.1)
    now = look()
    for n in sorted(now.keys() - before.keys()):
        say({"name": n, "type": "EVENT_TYPE_CREATE"})
    for n in sorted(before.keys() - now.keys()):
        say({"name": n, "type": "EVENT_TYPE_REMOVE"})
    for n in sorted(now.keys() & before.keys()):
        if now[n][:2] != before[n][:2]:
            say({"name": n, "type": "EVENT_TYPE_WRITE"})
        elif now[n][2] != before[n][2]:
            say({"name": n, "type": "EVENT_TYPE_CHMOD"})
    before = now
'''

Opener = Callable[[Sandbox, list[str]], Awaitable[Running]]


@dataclass
class Watcher:
    id: str
    proc: Running
    events: list[dict[str, Any]] = field(default_factory=list)
    queue: asyncio.Queue[dict[str, Any] | None] | None = None
    reader: asyncio.Task[None] | None = None


class Watches:
    def __init__(self, opener: Opener) -> None:
        self.opener = opener

    @staticmethod
    def of(sbx: Sandbox) -> dict[str, Watcher]:
        found: dict[str, Watcher] = sbx.extras.setdefault("watchers", {})
        return found

    async def _start(self, sbx: Sandbox, req: dict[str, Any], streaming: bool) -> Watcher:
        path = get(req, "path")
        if not isinstance(path, str) or not path:
            raise RpcError("invalid_argument", "path is required")
        if get(req, "includeEntry"):
            raise RpcError("unimplemented", "watch_dir(include_entry=True) is not supported by Firepool")
        try:
            proc = await self.opener(sbx, ["python3", "-I", "-S", "-u", "-c", WATCHER, path,
                                           "1" if get(req, "recursive") else "0"])
        except FirepoolError as exc:
            raise RpcError("unavailable", exc.message) from None
        w = Watcher("w-" + secrets.token_hex(8), proc, queue=asyncio.Queue() if streaming else None)
        lines = _lines(proc)
        try:
            first = await anext(lines, None)
        except FirepoolError as exc:
            first = {"error": "unavailable", "message": exc.message}
        if first is None or "error" in first:
            with contextlib.suppress(Exception):
                await proc.close()
            raise RpcError(str((first or {}).get("error", "internal")), str((first or {}).get("message", "")))
        w.reader = asyncio.get_running_loop().create_task(self._read(w, lines))
        self.of(sbx)[w.id] = w
        return w

    async def _read(self, w: Watcher, lines: AsyncGenerator[dict[str, Any], None]) -> None:
        with contextlib.suppress(FirepoolError):
            async for event in lines:
                if w.queue is not None:
                    w.queue.put_nowait(event)
                else:
                    w.events.append(event)
                    del w.events[:-MAX_PENDING]
        if w.queue is not None:
            w.queue.put_nowait(None)

    async def create(self, sbx: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
        return {"watcherId": (await self._start(sbx, req, streaming=False)).id}

    def events(self, sbx: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
        w = self.of(sbx).get(str(get(req, "watcherId")))
        if w is None:
            raise RpcError("not_found", f"watcher {str(get(req, 'watcherId'))[:40]} not found")
        found, w.events = w.events, []
        return {"events": found}

    async def remove(self, sbx: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
        w = self.of(sbx).pop(str(get(req, "watcherId")), None)
        if w is None:
            raise RpcError("not_found", f"watcher {str(get(req, 'watcherId'))[:40]} not found")
        await _stop(w)
        return {}

    async def stream(self, sbx: Sandbox, req: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        """`WatchDir`: started (errors answered before the stream), then a generator of its envelopes."""
        w = await self._start(sbx, req, streaming=True)
        return self._envelopes(sbx, w)

    async def _envelopes(self, sbx: Sandbox, w: Watcher) -> AsyncGenerator[bytes, None]:
        assert w.queue is not None
        try:
            yield envelope({"start": {}})
            while True:
                try:
                    event = await asyncio.wait_for(w.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield envelope({"keepalive": {}})
                    continue
                if event is None:
                    yield end_stream()
                    return
                yield envelope({"filesystem": event})
        finally:
            self.of(sbx).pop(w.id, None)
            await _stop(w)

    async def close(self, sbx: Sandbox) -> None:
        for w in list(self.of(sbx).values()):
            await _stop(w)
        self.of(sbx).clear()


async def _stop(w: Watcher) -> None:
    if w.reader is not None:
        w.reader.cancel()
    with contextlib.suppress(Exception):
        await w.proc.close()


async def _lines(proc: Running) -> AsyncGenerator[dict[str, Any], None]:
    """The watcher's JSON lines as they come (stderr ignored)."""
    buf = b""
    async for kind, data in proc.events():
        if kind == "exit":
            return
        if kind != "stdout":
            continue
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    yield value
