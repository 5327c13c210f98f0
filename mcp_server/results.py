"""How command and file results come back to the client: a text block for the model, images inline, other
`outputs/` files as resource links, and the structured result (the tool's outputSchema) beside them."""

from __future__ import annotations

from mcp_types import CallToolResult, ContentBlock, ImageContent, ResourceLink, TextContent

from broker.client import JobInfo
from broker.sandbox import wrappers
from broker.sandbox.calls import CallOutcome, Calls
from mcp_server.protocol import Artifact, ReadResult, RunResult, file_uri, log_uri, mime_of

MAX_IMAGES = 3
MAX_IMAGE_BYTES = 4 << 20
IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
TAKEN = "'s pod was taken by your session "
"""In an acquisition reason: the broker gave this session's pod to another at the pool ceiling (docs/security.md)."""


async def artifacts_of(c: Calls, session: str, outcome: CallOutcome) -> tuple[list[Artifact], list[ContentBlock]]:
    """The call's `outputs/` files: up to MAX_IMAGES images inline, the rest as resource links."""
    artifacts = [Artifact(path=f"{wrappers.OUTPUTS}/{p}", size=size, mime_type=mime_of(p),
                          uri=file_uri(session, f"{wrappers.OUTPUTS}/{p}")) for size, p in outcome.artifacts]
    images = [a for a in artifacts if a.mime_type in IMAGE_TYPES and a.size <= MAX_IMAGE_BYTES][:MAX_IMAGES]
    blocks: list[ContentBlock] = []
    if images:
        answer, _ = await c.helper("read", {"files": [{"path": a.path, "max_bytes": MAX_IMAGE_BYTES}
                                                      for a in images]}, session)
        for item in answer.get("files", []):
            blocks.append(ImageContent(type="image", data=item["base64"], mime_type=mime_of(item["path"])))
    inline = {a.path for a in images} if blocks else set()
    for a in artifacts:
        if a.path not in inline:
            blocks.append(ResourceLink(type="resource_link", uri=a.uri, name=a.path, mime_type=a.mime_type,
                                       size=a.size))
    return artifacts, blocks


async def run_result(c: Calls, session: str, outcome: CallOutcome) -> CallToolResult:
    """A finished command: a one-line summary and the output tails as text, then its artifacts."""
    artifacts, blocks = await artifacts_of(c, session, outcome)
    in_kernel = outcome.via == "kernel"
    result = RunResult(session=session, job_id=outcome.job_id, state=outcome.state, exit_code=outcome.exit_code,
                       error_class=outcome.error_class, timed_out=outcome.timed_out,
                       duration_s=round(outcome.duration_s, 4), acquisition=outcome.acquisition,
                       acquisition_reason=outcome.reason, stdout_tail=outcome.stdout.text, stderr_tail=outcome.stderr.text,
                       truncated=outcome.stdout.truncated or outcome.stderr.truncated, via=outcome.via,
                       log_uri=None if in_kernel else log_uri(session, outcome.job_id), artifacts=artifacts)
    text = (f"session {session} · " + ("beside the live kernel" if in_kernel else f"job {outcome.job_id}")
            + f" · {outcome.state}"
            + (f" · exit {outcome.exit_code}" if outcome.exit_code is not None else "")
            + (" · TIMED OUT" if outcome.timed_out else "")
            + f" · {outcome.acquisition or '-'} sandbox · {outcome.duration_s:.2f}s")
    if outcome.reason and TAKEN in outcome.reason:  # the model must know its earlier files are gone
        text += f"\n({outcome.reason.split('; ')[0]}: its workspace was emptied)"
    if result.stdout_tail:
        text += "\n--- stdout ---\n" + result.stdout_tail
    if result.stderr_tail:
        text += "\n--- stderr ---\n" + result.stderr_tail
    if result.truncated:
        text += (f"\n(output truncated; full log: {result.log_uri})" if result.log_uri
                 else "\n(output truncated to its tails)")
    return CallToolResult(content=[TextContent(type="text", text=text), *blocks],
                          structured_content=result.model_dump(mode="json"))


def background_result(session: str, job: JobInfo) -> CallToolResult:
    """A command started in the background: its job, to follow with job_status."""
    result = RunResult(session=session, job_id=job.id, state=job.state, exit_code=job.exit_code,
                       error_class=job.error_class, duration_s=0.0, acquisition=job.path,
                       log_uri=log_uri(session, job.id))
    text = f"session {session} · job {job.id} started in the background ({job.state}); follow it with job_status."
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=result.model_dump(mode="json"))


def read_result(result: ReadResult, data_base64: str) -> CallToolResult:
    """A file read: its text (or a note that it is binary), and the image itself when it is a whole image."""
    text = result.text if result.text is not None else (
        f"{result.path}: {result.bytes} bytes of binary data (base64 in the structured result)")
    blocks: list[ContentBlock] = [TextContent(type="text", text=text)]
    mime = mime_of(result.path)
    if mime in IMAGE_TYPES and result.offset == 0 and result.eof:
        blocks.append(ImageContent(type="image", data=data_base64, mime_type=mime))
    return CallToolResult(content=blocks, structured_content=result.model_dump(mode="json"))
