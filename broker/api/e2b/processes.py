"""envd's `process.Process` service: each sandbox's processes, run beside its holding job by the pod agent.

`Start` opens an exec stream (broker.running.execstream.open_exec) and the process joins the sandbox's
registry: a reader task reads its output for as long as it runs and hands every event to each attached
stream (Start's, later Connect's), so an E2B client that drops its stream leaves the process running (the
SDK's `disconnect()`; a background command nobody reads). Only a bounded tail is kept for nobody. Signals go
to the process group; SIGKILL ends a `bash -l -c` and its children alike.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.api.e2b.connect import RpcError, end_stream, envelope, selector_pid
from broker.api.e2b.connect import field as get
from broker.api.e2b.ptys import PtyProcess
from broker.api.e2b.sandboxes import Sandbox
from broker.errors import FirepoolError
from broker.running.execstream import ExecProcess

log = logging.getLogger("firepool.e2b")

KEEPALIVE_S = 50.0
QUEUE_EVENTS = 4096
"""Events queued for one attached stream; a stream that falls that far behind is cut (its process runs on)."""



class Running(Protocol):
    """A process of the registry: exec'd (`ExecProcess`) or on a PTY (`broker.api.e2b.ptys.PtyProcess`)."""

    pid: int

    def events(self) -> AsyncIterator[tuple[str, Any]]: ...

    async def write_stdin(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    async def signal(self, sig: int | str) -> None: ...

    async def close(self) -> None: ...


Opener = Callable[[Sandbox, list[str], dict[str, str], str | None, bool], Awaitable[ExecProcess]]
PtyOpener = Callable[[Sandbox, list[str], dict[str, str], str | None, int, int], Awaitable[PtyProcess]]


@dataclass
class Proc:
    pid: int
    config: dict[str, Any]
    tag: str | None
    exec: Running
    listeners: set[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=set)
    end: dict[str, Any] | None = None
    reader: asyncio.Task[None] | None = None

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "config": self.config}
        if self.tag is not None:
            out["tag"] = self.tag
        return out

    def attach(self) -> asyncio.Queue[dict[str, Any] | None]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(QUEUE_EVENTS)
        self.listeners.add(queue)
        return queue

    def publish(self, event: dict[str, Any] | None) -> None:
        for queue in list(self.listeners):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # a stream that stopped reading: cut it, keep the process
                self.listeners.discard(queue)


def end_event(exit_info: dict[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    if exit_info is None:
        return {"exitCode": -1, "exited": False, "status": "error", "error": error or "the process was lost"}
    sig = exit_info.get("signal")
    code = int(exit_info.get("exit_code", -1))
    if sig:
        name = str(sig).lower().removeprefix("sig")
        return {"exitCode": -1, "exited": False, "status": f"signal: {'killed' if name in ('kill', '9') else name}"}
    return {"exitCode": code, "exited": True, "status": f"exit status {code}"}


class Processes:
    def __init__(self, opener: Opener, pty_opener: PtyOpener) -> None:
        self.opener = opener
        self.pty_opener = pty_opener

    @staticmethod
    def of(sbx: Sandbox) -> dict[int, Proc]:
        procs: dict[int, Proc] = sbx.extras.setdefault("procs", {})
        return procs

    def find(self, sbx: Sandbox, selector: int | str) -> Proc:
        procs = self.of(sbx)
        found = procs.get(selector) if isinstance(selector, int) else \
            next((p for p in procs.values() if p.tag == selector), None)
        if found is None:
            raise RpcError("not_found", f"process {selector} not found")
        return found

    async def start(self, sbx: Sandbox, req: dict[str, Any]) -> Proc:
        cfg = req.get("process")
        if not isinstance(cfg, dict) or not isinstance(cfg.get("cmd"), str) or not cfg["cmd"]:
            raise RpcError("invalid_argument", "process.cmd is required")
        pty = req.get("pty")
        size = pty.get("size") if isinstance(pty, dict) else None
        size = size if isinstance(size, dict) else {}
        args = cfg.get("args") or []
        envs = cfg.get("envs") or {}
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RpcError("invalid_argument", "process.args must be a list of strings")
        if not isinstance(envs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
            raise RpcError("invalid_argument", "process.envs must be an object of strings")
        cwd = cfg.get("cwd") or None
        tag = req.get("tag")
        try:
            proc_exec: Running
            if pty:
                proc_exec = await self.pty_opener(sbx, [cfg["cmd"], *args], {**sbx.envs, **envs}, cwd,
                                                  _int(size.get("rows")), _int(size.get("cols")))
            else:
                proc_exec = await self.opener(sbx, [cfg["cmd"], *args], {**sbx.envs, **envs}, cwd,
                                              bool(req.get("stdin")))
        except FirepoolError as exc:
            code = {400: "invalid_argument", 404: "not_found", 409: "unavailable", 429: "resource_exhausted"}
            raise RpcError(code.get(exc.status, "unavailable"), exc.message) from None
        config = {"cmd": cfg["cmd"], "args": args, "envs": envs, **({"cwd": cwd} if cwd else {})}
        proc = Proc(proc_exec.pid, config, tag if isinstance(tag, str) else None, proc_exec)
        self.of(sbx)[proc.pid] = proc
        return proc

    def run(self, sbx: Sandbox, proc: Proc) -> None:
        """Read the process's events until it exits (once the first stream is attached: nothing is missed)."""
        proc.reader = asyncio.get_running_loop().create_task(self._read(sbx, proc))

    async def _read(self, sbx: Sandbox, proc: Proc) -> None:
        exit_info: dict[str, Any] | None = None
        error: str | None = None
        try:
            async for kind, data in proc.exec.events():
                if kind == "exit":
                    exit_info = data
                    break
                proc.publish({"data": {kind: base64.b64encode(data).decode()}})
        except FirepoolError as exc:
            error = exc.message
        except asyncio.CancelledError:
            error = "the sandbox ended"
        proc.end = end_event(exit_info, error)
        proc.publish({"end": proc.end})
        proc.publish(None)
        self.of(sbx).pop(proc.pid, None)
        with contextlib.suppress(Exception):
            await proc.exec.close()

    async def stream(self, proc: Proc, queue: asyncio.Queue[dict[str, Any] | None]) -> AsyncGenerator[bytes, None]:
        """A Start/Connect answer: start first, then the events as they come, keepalives, the end-stream."""
        try:
            yield envelope({"event": {"start": {"pid": proc.pid}}})
            if proc.end is not None and queue.empty():
                yield envelope({"event": {"end": proc.end}})
                yield end_stream()
                return
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield envelope({"event": {"keepalive": {}}})
                    continue
                if event is None:
                    yield end_stream()
                    return
                yield envelope({"event": event})
        finally:
            proc.listeners.discard(queue)

    async def signal(self, sbx: Sandbox, req: dict[str, Any]) -> None:
        proc = self.find(sbx, selector_pid(req))
        sig = get(req, "signal")
        name = {"SIGNAL_SIGKILL": "KILL", "SIGNAL_SIGTERM": "TERM", 9: "KILL", 15: "TERM"}.get(sig)
        if name is None:
            raise RpcError("invalid_argument", f"signal {sig!r}: SIGNAL_SIGKILL or SIGNAL_SIGTERM")
        await self._send(proc, proc.exec.signal(name))

    async def send_input(self, sbx: Sandbox, req: dict[str, Any]) -> None:
        proc = self.find(sbx, selector_pid(req))
        data = req.get("input")
        key = "pty" if isinstance(data, dict) and "pty" in data else "stdin"
        if not isinstance(data, dict) or key not in data:
            raise RpcError("invalid_argument", "input.stdin or input.pty (base64) is required")
        await self._send(proc, proc.exec.write_stdin(_b64(data[key])))

    async def update(self, sbx: Sandbox, req: dict[str, Any]) -> None:
        """A PTY's resize (the only update there is)."""
        proc = self.find(sbx, selector_pid(req))
        pty = req.get("pty")
        size = pty.get("size") if isinstance(pty, dict) else None
        if not isinstance(proc.exec, PtyProcess) or not isinstance(size, dict):
            raise RpcError("invalid_argument", f"process {proc.pid} has no PTY to resize (pty.size is required)")
        await self._send(proc, proc.exec.resize(_int(size.get("rows")) or 24, _int(size.get("cols")) or 80))

    async def close_stdin(self, sbx: Sandbox, req: dict[str, Any]) -> None:
        proc = self.find(sbx, selector_pid(req))
        await self._send(proc, proc.exec.close_stdin())

    @staticmethod
    async def _send(proc: Proc, action: Awaitable[None]) -> None:
        try:
            await action
        except FirepoolError as exc:
            raise RpcError("not_found", f"process {proc.pid} is gone: {exc.message}") from None

    def list(self, sbx: Sandbox) -> dict[str, Any]:
        return {"processes": [p.info() for p in self.of(sbx).values() if p.end is None]}

    async def close(self, sbx: Sandbox) -> None:
        """The sandbox ends: every process's stream is dropped (the agent hangs it up; the pod is wiped)."""
        for proc in list(self.of(sbx).values()):
            if proc.reader is not None:
                proc.reader.cancel()
            with contextlib.suppress(Exception):
                await proc.exec.close()
        self.of(sbx).clear()


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        raise RpcError("invalid_argument", "pty.size rows and cols are numbers") from None


def _b64(value: Any) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise RpcError("invalid_argument", "input must be base64") from None
