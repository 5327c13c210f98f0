"""What the MCP tools return and how they take arguments: the result models (their JSON schemas are the
tools' output schemas), the server class that refuses undeclared arguments, and the resource URIs."""

from __future__ import annotations

import dataclasses
import mimetypes
import re
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel, Field, ValidationError

from broker.sandbox.kernels import Kernels

RESOURCE_NOT_FOUND = -32002
"""MCP 2025-11-25's "Resource not found" (the SDK answers -32602, as the 2026-07-28 draft has it: SEP-2164)."""


class Artifact(BaseModel):
    path: str = Field(description="Path under the workspace (outputs/...).")
    size: int
    mime_type: str
    uri: str = Field(description="sandbox:// resource with the file's bytes.")


class RunResult(BaseModel):
    session: str = Field(description="Pass this back as `session` on later calls.")
    job_id: str
    state: str = Field(description="QUEUED | RUNNING | SUCCEEDED | FAILED | CANCELLED")
    exit_code: int | None = None
    error_class: str | None = None
    timed_out: bool = False
    duration_s: float
    acquisition: str | None = Field(default=None, description="How the sandbox was obtained: warm, recycled, "
                                                              "standby, new.")
    acquisition_reason: str | None = Field(default=None, description="Why a warmer sandbox was not used, e.g. "
                                                                     "that another session took this one's at "
                                                                     "the pool ceiling (its files are gone).")
    stdout_tail: str = ""
    stderr_tail: str = ""
    truncated: bool = Field(default=False, description="Output was longer than the tails: read log_uri or "
                                                      "job_status for all of it.")
    via: str = Field(default="job", description="job: a job of its own; kernel: run beside the session's live "
                                                "Python kernel (job_id is the kernel's; no separate log).")
    log_uri: str | None = None
    artifacts: list[Artifact] = []


class JobStatus(BaseModel):
    job_id: str
    session: str
    state: str
    exit_code: int | None = None
    error_class: str | None = None
    timed_out: bool = False
    acquisition: str | None = None
    output: str = Field(description="Combined output from byte offset `since`.")
    next_offset: int = Field(description="Pass as `since` to continue reading.")
    output_complete: bool = Field(description="The job ended and all of its output has been returned.")
    log_uri: str


class WriteResult(BaseModel):
    session: str
    written: list[dict[str, Any]]


class ReadResult(BaseModel):
    session: str
    path: str
    size: int
    offset: int
    bytes: int
    eof: bool
    text: str | None = Field(default=None, description="The bytes as UTF-8 text, when they decode.")
    base64: str | None = Field(default=None, description="The bytes base64-encoded, when they are not text.")


class ListResult(BaseModel):
    session: str
    path: str
    entries: list[dict[str, Any]]
    truncated: bool


class InstallResult(BaseModel):
    session: str
    installed: list[str]
    already_present: list[dict[str, Any]]
    failed: list[str]
    pip_exit_code: int
    output_tail: str


class EndResult(BaseModel):
    session: str
    retired_pods: list[str]
    retiring_at_release: list[str]
    cancelled_jobs: list[str]


class FirepoolMCP(MCPServer[Any]):
    """MCPServer that also rejects arguments a tool does not declare (the SDK would drop them silently),
    words argument errors for the model (field and problem, no class names or documentation URLs), answers
    an unknown tool with the JSON-RPC error the spec asks for, answers a resource no template matches with
    the resource-not-found error (-32002), and labels a workspace file with its own MIME type when it is
    read as a resource."""

    kernels: Kernels

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            # A protocol error, not a tool result (spec 2025-11-25, tools: error handling): the SDK would
            # answer a result with isError, which clients show to the model as if the tool had run.
            known = ", ".join(t.name for t in self._tool_manager.list_tools())
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {name} (tools: {known})")
        known_args = set(tool.parameters.get("properties", {}))
        unknown = sorted(set(arguments) - known_args)
        if unknown:
            raise ToolError(f"{name}: unknown argument(s) {', '.join(map(repr, unknown))}; "
                            f"accepted: {', '.join(sorted(known_args))}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(argument_errors(name, exc.__cause__)) from None
            raise

    async def read_resource(self, uri: Any, context: Any = None) -> Any:
        try:
            contents = await super().read_resource(uri, context)
        except ResourceNotFoundError as exc:  # no template matches (e.g. a path the client normalised away)
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {exc}", {"uri": str(uri)}) from None
        path = file_path_of(str(uri))
        if path is None or not isinstance(contents, Iterable):
            return contents
        return [dataclasses.replace(c, mime_type=mime_of(path, text=isinstance(c.content, str)))
                if isinstance(c, ReadResourceContents) else c for c in contents]


def argument_errors(tool: str, exc: ValidationError) -> str:
    """`tool: invalid argument(s): files[0].body: not an accepted field; timeout_s: must be > 0`."""
    problems = []
    for err in exc.errors(include_url=False):
        where = ""
        for part in err["loc"]:
            where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
        message = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if err["type"] == "extra_forbidden":
            message = "not an accepted field"
        elif err["type"] == "missing":
            message = "required"
        elif err["type"] == "string_pattern_mismatch" and err["loc"][:1] == ("packages",):
            message = "a requirement specifier or wheel path, not a pip option (no leading '-' or space)"
        problems.append(f"{where or 'arguments'}: {message[:200]}")
    return f"{tool}: invalid argument(s): " + "; ".join(dict.fromkeys(problems))


def package_version() -> str:
    try:
        return version("firepool")
    except PackageNotFoundError:
        return "0+unknown"


def mime_of(path: str, text: bool = False) -> str:
    """The file's MIME type by its name; an unknown one is `text/plain` when it is read as text."""
    return mimetypes.guess_type(path)[0] or ("text/plain" if text else "application/octet-stream")


def log_uri(session: str, job_id: str) -> str:
    return f"sandbox://{session}/jobs/{job_id}/log"


def file_uri(session: str, path: str) -> str:
    return f"sandbox://{session}/files/{path}"


_FILE_URI = re.compile(r"sandbox://[^/]+/files/(.+)\Z")


def file_path_of(uri: str) -> str | None:
    """The workspace path a `file_uri` names; None for any other URI."""
    m = _FILE_URI.match(uri)
    return m.group(1) if m else None
