"""The MCP resources: a job's full log and the session's workspace files (what result links point at)."""

from __future__ import annotations

import base64

from mcp.server.mcpserver.exceptions import ResourceError

from broker.errors import FirepoolError
from mcp_server import sandbox_code
from mcp_server.protocol import FirepoolMCP
from mcp_server.sessions import Sessions

MAX_FILE_BYTES = 16 << 20


def add_resources(mcp: FirepoolMCP, sessions: Sessions) -> None:
    @mcp.resource("sandbox://{session}/jobs/{job_id}/log", name="job log", mime_type="text/plain",
                  description="The full combined output of a job of the session.")
    async def job_log(session: str, job_id: str) -> str:
        _, c = sessions.calls()
        try:
            job = await c.client.get(job_id)
            if job.raw.get("lease_tag") != session:
                raise ResourceError(f"job {job_id} is not a job of session {session}")
            text = (await c.client.read_log(job_id, "combined")).decode(errors="replace")
            return sandbox_code.split_artifacts(text)[0]
        except FirepoolError as exc:
            raise ResourceError(f"{exc.error_class}: {exc.message}") from exc

    # Its contents carry the file's own MIME type (FirepoolMCP.read_resource), not the template's.
    @mcp.resource("sandbox://{session}/files/{+path}", name="workspace file", mime_type="application/octet-stream",
                  description="A file of the session's workspace (e.g. an artifact in outputs/).")
    async def workspace_file(session: str, path: str) -> bytes:
        _, c = sessions.calls()
        try:
            answer, _ = await c.helper("read", {"files": [{"path": path, "max_bytes": MAX_FILE_BYTES}]}, session)
        except FirepoolError as exc:
            raise ResourceError(f"{exc.error_class}: {exc.message}") from exc
        if "error" in answer:
            raise ResourceError(f"{answer['error']}: {answer.get('message', '')}")
        return base64.b64decode(answer["files"][0]["base64"])
