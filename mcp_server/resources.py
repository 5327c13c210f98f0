"""The MCP resources: a job's full log and the session's workspace files (what result links point at).

A resource that does not exist for the calling caller (another caller's job, a session the caller has no
sandbox for, a file that is not there, a path outside the workspace) is the resource-not-found error of
MCP 2025-11-25 (JSON-RPC -32002, `data.uri`), never a sandbox started to look. A text file comes back as
`text`, anything else as `blob`.
"""

from __future__ import annotations

import base64
import mimetypes

from mcp.server.mcpserver.exceptions import ResourceError
from mcp.shared.exceptions import MCPError

from broker.errors import FirepoolError, NotFound
from broker.sandbox import wrappers
from broker.sandbox.calls import Calls
from broker.sandbox.paths import OutsideWorkspace, inside_workspace
from mcp_server.protocol import RESOURCE_NOT_FOUND, FirepoolMCP
from mcp_server.sessions import Sessions

MAX_FILE_BYTES = 16 << 20
BINARY_KINDS = ("image/", "audio/", "video/", "font/")
"""MIME types read as `blob` even when their bytes happen to decode as UTF-8."""


def not_found(uri: str, why: str) -> MCPError:
    return MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {why}", {"uri": uri})


def as_contents(path: str, data: bytes) -> str | bytes:
    """`text` for a file whose bytes are UTF-8 (and not an image or other media), else `blob`."""
    kind = mimetypes.guess_type(path)[0] or ""
    if kind.startswith(BINARY_KINDS):
        return data
    try:
        return data.decode()
    except UnicodeDecodeError:
        return data


async def has_sandbox(c: Calls, session: str) -> bool:
    """The caller has a sandbox for `session` now: a live kernel, or a pod (busy or held) with its tag."""
    if c.kernels is not None and c.kernels.live(c.caller, session) is not None:
        return True
    pods = await c.client.pods(await c.pool_name())
    mine = [p for p in pods if p.get("lease_tag") == session and p.get("queue") == c.queue]
    if not mine or (c.caller and all(p.get("caller") == c.caller for p in mine)):
        return bool(mine)
    me = await c.client.whoami()  # over stdio the caller's name is the broker's; an admin sees every caller's pods
    return any(p.get("caller") == me for p in mine)


def add_resources(mcp: FirepoolMCP, sessions: Sessions) -> None:
    @mcp.resource("sandbox://{session}/jobs/{job_id}/log", name="job log", mime_type="text/plain",
                  description="The full combined output of a job of the session.")
    async def job_log(session: str, job_id: str) -> str:
        _, c = sessions.calls()
        uri = f"sandbox://{session}/jobs/{job_id}/log"
        try:
            job = await c.client.get(job_id)
            if job.raw.get("lease_tag") != session:
                raise not_found(uri, f"session {session} has no job {job_id}")
            text = (await c.client.read_log(job_id, "combined")).decode(errors="replace")
            return wrappers.split_artifacts(text)[0]
        except NotFound as exc:  # another caller's job is "not found" to this one, as in the REST API
            raise not_found(uri, f"session {session} has no job {job_id}") from exc
        except FirepoolError as exc:
            raise ResourceError(f"{exc.error_class}: {exc.message}") from exc

    # Its contents carry the file's own MIME type (FirepoolMCP.read_resource), not the template's.
    @mcp.resource("sandbox://{session}/files/{+path}", name="workspace file", mime_type="application/octet-stream",
                  description="A file of the session's workspace (e.g. an artifact in outputs/).")
    async def workspace_file(session: str, path: str) -> str | bytes:
        _, c = sessions.calls()
        uri = f"sandbox://{session}/files/{path}"
        try:
            inside_workspace(path)
        except OutsideWorkspace as exc:
            raise not_found(uri, str(exc)) from None
        try:
            if not await has_sandbox(c, session):
                raise not_found(uri, f"no sandbox of session {session}")
            answer, _ = await c.helper("read", {"files": [{"path": path, "max_bytes": MAX_FILE_BYTES}]}, session)
        except FirepoolError as exc:
            raise ResourceError(f"{exc.error_class}: {exc.message}") from exc
        if answer.get("error") in ("FileNotFound", "OutsideWorkspace"):
            raise not_found(uri, str(answer.get("message", "")))
        if "error" in answer:
            raise ResourceError(f"{answer['error']}: {answer.get('message', '')}")
        return as_contents(path, base64.b64decode(answer["files"][0]["base64"]))
