"""The MCP server: tools that run in a warm Firepool sandbox per conversation (session).

Every tool takes an optional `session`, which becomes the jobs' `lease_tag`: the same caller and
session reuse the warm sandbox, whose workspace, installed packages and Python state survive between
calls; another session (or another caller naming the same session) gets a sandbox of its own; how a call's
session is chosen is in sessions.py. Every result echoes `session`. Results are rendered in results.py,
the resources are in resources.py, the result models and the server class in protocol.py.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from broker.errors import FirepoolError
from broker.sandbox import wrappers
from broker.sandbox.kernel_io import KernelDied, KernelGone, KernelStartFailed
from broker.sandbox.kernels import Kernels
from broker.sandbox.paths import OutsideWorkspace, inside_workspace
from broker.sdk_protocols import AsyncCalls
from broker.tools import specs
from mcp_server import pyresult
from mcp_server.identity import Broker
from mcp_server.protocol import (
    EndResult,
    FirepoolMCP,
    InstallResult,
    JobStatus,
    ListResult,
    ReadResult,
    RunResult,
    WriteResult,
    log_uri,
    package_version,
)
from mcp_server.resources import add_resources
from mcp_server.results import background_result, read_result, run_result
from mcp_server.sessions import SessionArg, Sessions, progress_of

__all__ = ["FirepoolMCP", "build_server"]

INSTRUCTIONS = """Firepool runs your commands in an isolated sandbox (a warm GPU/CPU pod) that stays warm
for the whole conversation. Every tool takes an optional `session` and echoes it in its result: pass
that value back on every later call so the same sandbox (files, installed packages, Python variables)
is reused. Use a new session name for an unrelated task; call end_session when done. Files written to
`outputs/` come back from the call (images inline)."""


def _inside(path: str, what: str) -> str:
    """A workspace path argument, or the tool error that says why it is refused (before any job runs)."""
    try:
        return inside_workspace(path, what)
    except OutsideWorkspace as exc:
        raise ToolError(str(exc)) from None


def _described(name: str, mcp_note: str = "") -> str:
    """A shared tool's description (broker.tools.specs, what the LLM definitions say too), and what only the
    MCP form of the tool adds."""
    return f"{specs.SPECS[name].description} {mcp_note}".strip()


def _tool(title: str, **hints: bool) -> dict[str, Any]:
    """A tool's display title (top-level `title`, which newer clients show, and the annotations' one, which
    older ones read) and its behaviour hints."""
    return {"title": title, "annotations": ToolAnnotations(title=title, **hints)}


def build_server(broker: Broker, *, pool: str | None = None, queue: str = "default", name: str = "firepool",
                 **server_kw: Any) -> FirepoolMCP:
    """The MCP server over `broker`; `server_kw` goes to MCPServer (auth settings for HTTP)."""
    server_kw.setdefault("log_level", "WARNING")
    server_kw.setdefault("version", package_version())
    mcp = FirepoolMCP(name, instructions=INSTRUCTIONS, **server_kw)
    kernels = mcp.kernels = Kernels()
    sessions = Sessions(broker, kernels, pool=pool, queue=queue)
    calls, session_of, helper = sessions.calls, sessions.of, sessions.helper

    @mcp.tool(**_tool("Run a shell command in the sandbox", read_only_hint=False,
                      destructive_hint=True, idempotent_hint=False, open_world_hint=True),
              description=_described("run_in_sandbox", "Files written to outputs/ come back (images inline). "
                                                       "Pass the result's `session` back on later calls."))
    async def run_in_sandbox(
        command: specs.Command,
        session: SessionArg = None,
        cwd: specs.Cwd = None,
        env: specs.Env = None,
        timeout_s: specs.CommandTimeout = specs.DEFAULT_TIMEOUT_S,
        background: Annotated[bool, Field(description="Return at once with job_id; follow with "
                                                      "job_status.")] = False,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, RunResult]:
        sid = session_of(session, ctx)
        _, c = calls()
        argv = wrappers.shell(command, _inside(cwd, "cwd") if cwd else "")
        try:
            if background:
                # A background job needs the pod the live kernel holds: the kernel saves and ends first.
                await kernels.end(c.caller, sid, "a background job needed the sandbox")
                job = await c.submit(argv, sid, timeout_s=timeout_s, env=env)
                return background_result(sid, job)
            outcome = await c.run(argv, sid, timeout_s=timeout_s, env=env, progress=progress_of(ctx))
            return await run_result(c, sid, outcome)
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc

    @mcp.tool(**_tool("Run Python in a live kernel (state kept across calls)",
                      read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                      open_world_hint=True), description=_described("python_exec"))
    async def python_exec(
        code: specs.Code,
        session: SessionArg = None,
        timeout_s: specs.CodeTimeout = specs.DEFAULT_TIMEOUT_S,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, pyresult.PythonResult]:
        sid = session_of(session, ctx)
        caller, c = calls()
        try:
            for attempt in range(2):
                k = await kernels.ensure(c, caller, sid)
                started, k.started = k.started, None
                try:
                    ex = await kernels.execute(k, code, timeout_s=timeout_s, progress=progress_of(ctx))
                    break
                except KernelGone:
                    if attempt:  # ended twice before the code reached it: say so rather than loop
                        raise ToolError("KernelGone: the session's kernel kept ending; try again") from None
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc
        except KernelDied as exc:
            raise ToolError(f"KernelDied: {exc}; the next call starts a new kernel") from exc
        except KernelStartFailed as exc:
            raise ToolError(f"KernelStartFailed: {exc}") from exc
        return pyresult.render(sid, k.job.id, k.job.path, ex, started)

    @mcp.tool(**_tool("Status and output of a job", read_only_hint=True,
                      open_world_hint=False))
    async def job_status(
        job_id: Annotated[str, Field(min_length=1, max_length=64)],
        since: Annotated[int, Field(ge=0, description="Byte offset into the combined output.")] = 0,
        wait_s: Annotated[float, Field(ge=0, le=300, description="Wait up to this long for the job "
                                                                 "to end.")] = 0,
        max_bytes: Annotated[int, Field(ge=1, le=1 << 20)] = 64 * 1024,
    ) -> JobStatus:
        """A job's state and its output from byte offset `since` (for background or long jobs)."""
        _, c = calls()
        try:
            job = await (c.client.wait(job_id, timeout=wait_s) if wait_s > 0 else c.client.get(job_id))
            data = await c.client.read_log(job_id, "combined", since)
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc
        chunk = data[:max_bytes]
        session = str(job.raw.get("lease_tag", ""))
        return JobStatus(job_id=job.id, session=session, state=job.state, exit_code=job.exit_code,
                         error_class=job.error_class, timed_out=job.error_class == "Timeout",
                         acquisition=job.path, output=chunk.decode(errors="replace"),
                         next_offset=since + len(chunk), output_complete=job.terminal and len(chunk) == len(data),
                         log_uri=log_uri(session, job.id))

    @mcp.tool(**_tool("Cancel a job", read_only_hint=False, destructive_hint=True,
                      idempotent_hint=True, open_world_hint=False))
    async def job_cancel(job_id: Annotated[str, Field(min_length=1, max_length=64)]) -> dict[str, Any]:
        """Cancel a queued or running job (its processes are killed)."""
        _, c = calls()
        try:
            job = await c.client.cancel(job_id)
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc
        return {"job_id": job.id, "session": job.raw.get("lease_tag", ""), "state": job.state,
                "cancel_requested": bool(job.raw.get("cancel_requested"))}

    @mcp.tool(**_tool("Write files into the workspace", read_only_hint=False,
                      destructive_hint=True, idempotent_hint=True, open_world_hint=False),
              description=_described("write_files"))
    async def write_files(
        files: specs.Files,
        session: SessionArg = None,
        ctx: Context | None = None,
    ) -> WriteResult:
        sid = session_of(session, ctx)
        try:
            specs.check_files(files)
        except ValueError as exc:  # OutsideWorkspace among them
            raise ToolError(str(exc)) from None
        _, c = calls()
        answer, _ = await helper(c, "write", {"files": [f.model_dump(exclude_none=True) for f in files]}, sid, ctx)
        return WriteResult(session=sid, written=answer["written"])

    @mcp.tool(**_tool("Read a file from the workspace", read_only_hint=True,
                      open_world_hint=False), description=_described("read_file"))
    async def read_file(
        path: specs.FilePath,
        session: SessionArg = None,
        offset: specs.Offset = 0,
        max_bytes: specs.MaxBytes = specs.DEFAULT_READ_BYTES,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, ReadResult]:
        _inside(path, "path")
        sid = session_of(session, ctx)
        _, c = calls()
        answer, _ = await helper(c, "read", {"files": [{"path": path, "offset": offset, "max_bytes": max_bytes}]},
                                 sid, ctx)
        item = answer["files"][0]
        data = base64.b64decode(item["base64"])
        try:
            text: str | None = data.decode()
            b64: str | None = None
        except UnicodeDecodeError:
            text, b64 = None, item["base64"]
        result = ReadResult(session=sid, path=path, size=item["size"], offset=offset, bytes=len(data),
                            eof=offset + len(data) >= item["size"], text=text, base64=b64)
        return read_result(result, item["base64"])

    @mcp.tool(**_tool("List workspace files", read_only_hint=True,
                      open_world_hint=False), description=_described("list_files"))
    async def list_files(
        path: specs.DirPath = ".",
        session: SessionArg = None,
        depth: specs.Depth = specs.DEFAULT_LIST_DEPTH,
        ctx: Context | None = None,
    ) -> ListResult:
        _inside(path, "path")
        sid = session_of(session, ctx)
        _, c = calls()
        answer, _ = await helper(c, "list", {"path": path, "depth": depth}, sid, ctx)
        return ListResult(session=sid, path=path, entries=answer["entries"], truncated=answer["truncated"])

    @mcp.tool(**_tool("Install Python packages in the sandbox", read_only_hint=False,
                      destructive_hint=False, idempotent_hint=True, open_world_hint=True))
    async def install_packages(
        packages: Annotated[list[Annotated[str, Field(min_length=1, max_length=300, pattern=r"^[^-\s]")]],
                            Field(min_length=1, max_length=50, description="pip requirement specifiers or "
                                                                           "workspace paths of wheels.")],
        session: SessionArg = None,
        timeout_s: Annotated[float, Field(gt=0, le=3600)] = 600,
        ctx: Context | None = None,
    ) -> InstallResult:
        """pip-install packages into the session's sandbox (kept for its later calls; already satisfied
        requirements are skipped)."""
        sid = session_of(session, ctx)
        _, c = calls()
        answer, outcome = await helper(c, "install", {"packages": packages}, sid, ctx, timeout_s=timeout_s)
        if "error" in answer:
            raise ToolError(f"{answer['error']}: {answer.get('message', '')}")
        return InstallResult(session=sid, installed=answer["installed"], already_present=answer["already_present"],
                             failed=answer["failed"], pip_exit_code=answer["pip_exit_code"],
                             output_tail=outcome.stderr.text[-4000:])

    @mcp.tool(**_tool("Describe the sandbox", read_only_hint=True,
                      open_world_hint=False))
    async def sandbox_info(session: SessionArg = None, ctx: Context | None = None) -> dict[str, Any]:
        """The session's sandbox: pool, GPUs (model, memory, driver/CUDA when present), disk, CPUs,
        and how it was acquired (warm, recycled, standby, new)."""
        sid = session_of(session, ctx)
        _, c = calls()
        answer, outcome = await helper(c, "info", {}, sid, ctx)
        name = await c.pool_name()
        spec = next((p for p in await _pools(c.client) if p.get("name") == name), {})
        return {"session": sid, "pool": name, "accelerator": spec.get("accelerator"),
                "gpus_per_pod": spec.get("gpus"), "acquisition": outcome.acquisition, "pod": outcome.pod,
                "live_kernel": outcome.via == "kernel", **answer}

    @mcp.tool(**_tool("Expose a port of the sandbox", read_only_hint=True, open_world_hint=False))
    async def expose_port(port: Annotated[int, Field(ge=1, le=65535, description="The port a server started in "
                                                     "the sandbox listens on (127.0.0.1 or 0.0.0.0).")],
                          session: SessionArg = None, ctx: Context | None = None) -> dict[str, Any]:
        """A URL for a server you started in the sandbox (in the background, e.g. `python -m http.server
        8000 &` or a dev server, TensorBoard, Gradio): `url` is a short-lived signed link the user opens in a
        browser, `port_url` the same server for clients that send the caller's token. The sandbox must be
        running (start the server first); the link works for this caller only."""
        sid = session_of(session, ctx)
        _, c = calls()
        try:
            link = await c.client.port_link(sid, port)
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc
        return {"session": sid, "port": port, "url": link["url"], "expires_at": link["expires_at"],
                "port_url": link["port_url"], "host_url": link.get("host_url")}

    @mcp.tool(**_tool("End the session and retire its sandbox", read_only_hint=False,
                      destructive_hint=True, idempotent_hint=True, open_world_hint=False))
    async def end_session(session: SessionArg = None, ctx: Context | None = None) -> EndResult:
        """Retire the session's sandbox now: running jobs of it are cancelled, its files and Python state
        are gone. A later call with the same session starts a fresh sandbox."""
        sid = session_of(session, ctx)
        _, c = calls()
        await kernels.end(c.caller, sid, "the session ended", save=False)
        kernels.forget(c.caller, sid)
        try:
            ended = await c.client.end_session(sid, queue=c.queue)
        except FirepoolError as exc:
            raise ToolError(f"{exc.error_class}: {exc.message}") from exc
        return EndResult(session=sid, retired_pods=ended["retired_pods"],
                         retiring_at_release=ended["retiring_at_release"], cancelled_jobs=ended["cancelled_jobs"])

    add_resources(mcp, sessions)
    return mcp


async def _pools(client: AsyncCalls) -> list[dict[str, Any]]:
    try:
        return await client.pools()
    except FirepoolError:
        return []
