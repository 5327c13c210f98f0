"""Running a tool call the model made: its arguments checked against the tool's definition, then run in the
conversation's sandbox, and its outcome written as the text (and images) the model reads next.

One sandbox per (client, session), kept between calls (`keep=True`: python_exec's variables survive, and the
sandbox stays warm when the process ends); `end` ends one. A sync `Client`'s calls run on a private event loop
in a daemon thread, through an `AsyncClient` of the same broker and token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from broker.aclient import AsyncClient
from broker.errors import FirepoolError
from broker.kernel_blocking import BackgroundLoop
from broker.sandbox.handle import AsyncSandbox
from broker.sandbox.kernel_io import KernelDied, KernelGone, KernelStartFailed
from broker.sandbox.paths import OutsideWorkspace, inside_workspace
from broker.tools import render
from broker.tools.result import ToolResult
from broker.tools.specs import SPECS, ListArgs, PythonArgs, ReadArgs, RunArgs, WriteArgs, check_files

if TYPE_CHECKING:
    from broker.client import Client

SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")
LIST_LIMIT = 1000
LEAVE_S = 10.0
"""How long leaving a sandbox (saving its kernel's namespace) may take when its client is gone."""

_sandboxes: weakref.WeakKeyDictionary[AsyncClient, dict[str, AsyncSandbox]] = weakref.WeakKeyDictionary()


class _Blocking:
    """A sync client's way to the async engine: an event loop thread and an AsyncClient acting as it."""

    def __init__(self, fp: Client) -> None:
        self.loop = BackgroundLoop()
        self.client = AsyncClient(fp.urls, fp.found.token, retry=fp.retry)

    @staticmethod
    def close(loop: BackgroundLoop, client: AsyncClient) -> None:
        """When the sync client is gone: each sandbox left as `Sandbox(keep=True)` leaves it (its kernel's
        namespace saved, the sandbox warm), then the connections close and the loop stops."""
        try:
            loop.run(_leave(client))
        finally:
            loop.stop()


async def _leave(client: AsyncClient) -> None:
    await aclose(client=client)
    await client.close()


_blocking: weakref.WeakKeyDictionary[Client, _Blocking] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
"""Threads sharing a sync client make its engine, and each session's sandbox, once."""


def _of(fp: Client) -> _Blocking:
    with _lock:
        state = _blocking.get(fp)
        if state is None:
            state = _blocking[fp] = _Blocking(fp)
            weakref.finalize(fp, _Blocking.close, state.loop, state.client)
        return state


def parse(name: str, arguments: Mapping[str, Any] | str | None) -> BaseModel | ToolResult:
    """The call's arguments checked against tool `name`'s definition, or the error result that says what to fix."""
    spec = SPECS.get(name)
    if spec is None:
        return ToolResult(f"unknown tool {name!r}: the tools are {', '.join(SPECS)}", is_error=True)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolResult(f"{name}: the arguments are not valid JSON ({exc.msg} at character {exc.pos}); "
                              "send a JSON object", is_error=True)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        return ToolResult(f"{name}: the arguments must be a JSON object, not {type(arguments).__name__}",
                          is_error=True)
    try:
        return spec.args.model_validate(dict(arguments))
    except ValidationError as exc:
        fields = ", ".join(spec.args.model_fields)
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"]) or "arguments"
            if e["type"] == "extra_forbidden":
                problems.append(f"unknown argument {where!r} (the arguments are {fields})")
            elif e["type"] == "missing":
                problems.append(f"{where} is required")
            else:
                problems.append(f"{where}: {e['msg']}")
        return ToolResult(f"{name}: bad arguments: {'; '.join(problems)}", is_error=True)


def _check_session(session: str) -> None:
    if not isinstance(session, str) or not SESSION.match(session):
        raise ValueError(f"session {session!r} is not a valid session name: use 1-128 letters, digits and "
                         ". _ : @ - (starting with a letter or digit)")


def sandbox_of(client: AsyncClient, session: str, *, pool: str = "cpu", queue: str = "default") -> AsyncSandbox:
    """The sandbox the tools of `session` run in (made on first use; the first call's pool and queue stay)."""
    _check_session(session)
    boxes = _sandboxes.setdefault(client, {})
    sb = boxes.get(session)
    if sb is None:
        sb = boxes[session] = AsyncSandbox(client, session, pool=pool, queue=queue, keep=True)
    return sb


async def ahandle(name: str, arguments: Mapping[str, Any] | str | None, *, session: str, client: AsyncClient,
                  pool: str = "cpu", queue: str = "default") -> ToolResult:
    """Run tool call `name(arguments)` (a dict, or the JSON string the API gave) in `session`'s sandbox.
    Never raises for the model's mistakes or the broker's failures: they are `is_error` results."""
    args = parse(name, arguments)
    if isinstance(args, ToolResult):
        return args
    return await _dispatch(name, args, sandbox_of(client, session, pool=pool, queue=queue))


def handle(name: str, arguments: Mapping[str, Any] | str | None, *, session: str, client: Client,
           pool: str = "cpu", queue: str = "default") -> ToolResult:
    """`ahandle` for a sync `Client` (blocks until the tool is done)."""
    args = parse(name, arguments)
    if isinstance(args, ToolResult):
        return args
    _check_session(session)
    state = _of(client)
    with _lock:
        sb = sandbox_of(state.client, session, pool=pool, queue=queue)
    return state.loop.run(_dispatch(name, args, sb))


async def _dispatch(name: str, args: BaseModel, sb: AsyncSandbox) -> ToolResult:
    try:
        return await _run(sb, args)
    except OutsideWorkspace as exc:
        return ToolResult(f"{name}: {exc}", is_error=True)
    except ValueError as exc:  # what check_files or the file helper refuses
        return ToolResult(f"{name}: {exc}", is_error=True)
    except FirepoolError as exc:
        return ToolResult(f"{name} failed: {exc.error_class}: {exc.message}", is_error=True)
    except KernelDied as exc:
        return ToolResult(f"python_exec failed: the kernel died ({exc}); the next call starts a new one",
                          is_error=True)
    except (KernelGone, KernelStartFailed) as exc:
        return ToolResult(f"python_exec failed: {type(exc).__name__}: {exc}; try again", is_error=True)


async def aend(session: str, *, client: AsyncClient) -> None:
    """End `session`'s sandbox (its kernel, pod and workspace) and forget it; a later call starts afresh."""
    _check_session(session)
    sb = _sandboxes.get(client, {}).pop(session, None) or AsyncSandbox(client, session)
    await sb.end()


def end(session: str, *, client: Client) -> None:
    """`aend` for a sync `Client`."""
    state = _of(client)
    state.loop.run(aend(session, client=state.client))


async def aclose(*, client: AsyncClient) -> None:
    """Leave every sandbox the tools made for `client` as `Sandbox(keep=True)` leaves it: each kernel's namespace
    saved and the kernel stopped, the sandbox warm; a later call of a session (from any client of the caller)
    restores the variables. An AsyncClient's owner calls this before closing it; a sync Client's sandboxes are
    left when it is collected (or by `close`)."""
    boxes = list(_sandboxes.pop(client, {}).values())
    # Best effort, all at once: the broker may be gone (the sandboxes then end by its keep-alive rules).
    await asyncio.gather(*(asyncio.wait_for(sb.close(), LEAVE_S) for sb in boxes), return_exceptions=True)


def close(*, client: Client) -> None:
    """`aclose` for a sync `Client`, now rather than when it is collected."""
    with _lock:
        state = _blocking.get(client)
    if state is not None:
        state.loop.run(aclose(client=state.client))


async def _run(sb: AsyncSandbox, args: BaseModel) -> ToolResult:
    if isinstance(args, RunArgs):
        cwd = inside_workspace(args.cwd, "cwd") if args.cwd else None
        return render.command(await sb.run(args.command, cwd=cwd, env=args.env, timeout=args.timeout_s))
    if isinstance(args, PythonArgs):
        return render.code(await sb.run_code(args.code, timeout=args.timeout_s))
    if isinstance(args, WriteArgs):
        check_files(args.files)
        written = await sb.files.write_files({f.path: f.data() for f in args.files})
        return ToolResult(f"wrote {written} bytes to {', '.join(f.path for f in args.files)}")
    if isinstance(args, ReadArgs):
        path = inside_workspace(args.path, "path")
        answer = await _helper(sb, "read", {"files": [{"path": path, "offset": args.offset,
                                                       "max_bytes": args.max_bytes}]})
        item = answer["files"][0]
        return render.read(path, args.offset, int(item["size"]), base64.b64decode(item["base64"]))
    assert isinstance(args, ListArgs)
    path = inside_workspace(args.path, "path")
    answer = await _helper(sb, "list", {"path": path, "depth": args.depth, "limit": LIST_LIMIT})
    return render.listing(path, answer["entries"], bool(answer.get("truncated")))


async def _helper(sb: AsyncSandbox, op: str, args: dict[str, Any]) -> dict[str, Any]:
    answer, _ = await sb.calls.helper(op, args, sb.tag)
    if "error" in answer:
        raise _FileRefused(f"{answer['error']}: {answer.get('message', '')}")
    return answer


class _FileRefused(ValueError):
    """The file helper refused (no such file, a directory, ...): the model's to fix."""
