"""A python_exec call's result as MCP content: text first, then each rich output in order.

Images (PNG, JPEG) become image content; markdown (DataFrames render as markdown tables in the kernel),
HTML and plain text become text; an error becomes its name, message and the last frames of its
traceback, without terminal colours.
"""

from __future__ import annotations

import re
from typing import Any

from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent
from pydantic import BaseModel, Field

from broker.sandbox.kernel_io import Execution, Started

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
TRACE_FRAMES = 3
"""Traceback frames kept (the last ones: where it failed)."""
TRACE_CHARS = 3000
TAIL_CHARS = 8 * 1024
TEXT_CHARS = 20_000
"""A rich text output longer than this is cut (the model reads every character)."""
MAX_IMAGES = 5
IMAGE_TYPES = ("image/png", "image/jpeg")
TEXT_TYPES = ("text/markdown", "text/html", "text/plain")


class KernelNote(BaseModel):
    restarted: bool = Field(description="This call started a new kernel in place of one that had ended.")
    reason: str | None = None
    restored: list[str] = Field(default_factory=list, description="Names brought back from the saved namespace.")
    lost: list[str] = Field(default_factory=list, description="Names that could not be saved or restored.")


class PythonError(BaseModel):
    ename: str
    evalue: str
    traceback: str = Field(description="The last frames, without terminal colours.")


class PythonResult(BaseModel):
    session: str = Field(description="Pass this back as `session` on later calls.")
    status: str = Field(description="ok | error | interrupted | timed_out")
    execution_count: int | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    result: str | None = Field(default=None, description="The final expression's value as text.")
    error: PythonError | None = None
    timed_out: bool = False
    duration_s: float
    kernel_job_id: str = Field(description="The session's live kernel (a broker job).")
    acquisition: str | None = Field(default=None, description="How the kernel's sandbox was obtained.")
    kernel: KernelNote | None = Field(default=None, description="Set when this call started the kernel.")
    outputs: list[str] = Field(default_factory=list, description="MIME type of each rich output, in order.")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def short_traceback(frames: list[str] | None) -> str:
    """The header and the last TRACE_FRAMES frames of an IPython traceback, colourless."""
    parts = [strip_ansi(f).strip("\n") for f in frames or []]
    if len(parts) > TRACE_FRAMES + 2:
        parts = [parts[0], f"... ({len(parts) - TRACE_FRAMES - 2} frames omitted)", *parts[-TRACE_FRAMES - 1:]]
    text = "\n".join(p for p in parts if p)
    return text if len(text) <= TRACE_CHARS else "..." + text[-TRACE_CHARS:]


def _cut(text: str, limit: int = TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


def blocks_of(outputs: list[dict[str, Any]]) -> tuple[list[ContentBlock], list[str], str | None]:
    """Content blocks of the rich outputs, their MIME types, and the final expression's text (if any)."""
    blocks: list[ContentBlock] = []
    kinds: list[str] = []
    result: str | None = None
    images = 0
    for out in outputs:
        data: dict[str, Any] = out["data"]
        image = next((m for m in IMAGE_TYPES if m in data), None)
        if image is not None and images < MAX_IMAGES:
            images += 1
            blocks.append(ImageContent(type="image", data=str(data[image]).strip(), mime_type=image))
            kinds.append(image)
            continue
        mime = next((m for m in TEXT_TYPES if m in data), None)
        if mime is None:
            continue
        text = str(data[mime])
        if out["kind"] == "execute_result" and mime == "text/plain":
            result = text  # a plain value: reported as the result, not as a separate block
            continue
        if out["kind"] == "execute_result":
            result = str(data.get("text/plain", ""))
        blocks.append(TextContent(type="text", text=_cut(text)))
        kinds.append(mime)
    return blocks, kinds, result


def render(session: str, job_id: str, acquisition: str | None, ex: Execution,
           started: Started | None) -> CallToolResult:
    blocks, kinds, value = blocks_of(ex.outputs)
    status = "timed_out" if ex.timed_out else "interrupted" if ex.interrupted else \
        "error" if ex.error is not None else "ok"
    error = None
    if ex.error is not None:
        error = PythonError(ename=str(ex.error.get("ename") or ""), evalue=strip_ansi(str(ex.error.get("evalue") or "")),
                            traceback=short_traceback(ex.error.get("traceback")))
    note = None
    if started is not None:
        note = KernelNote(restarted=started.restarted, reason=started.reason, restored=started.restored,
                          lost=started.lost)
    result = PythonResult(session=session, status=status, execution_count=ex.execution_count,
                          stdout_tail=ex.stdout[-TAIL_CHARS:], stderr_tail=ex.stderr[-TAIL_CHARS:], result=value,
                          error=error, timed_out=ex.timed_out, duration_s=round(ex.duration_s, 4),
                          kernel_job_id=job_id, acquisition=acquisition, kernel=note, outputs=kinds)
    lines = [f"session {session} · [{ex.execution_count if ex.execution_count is not None else '-'}] {status}"
             f" · {ex.duration_s:.3f}s"]
    if note is not None and note.restarted:
        lines.append(f"kernel restarted ({note.reason}); restored: {', '.join(note.restored) or 'nothing'}; "
                     f"lost: {', '.join(note.lost) or 'nothing'}")
    elif note is not None:
        lines.append(f"new kernel ({acquisition or '-'} sandbox)")
    if result.stdout_tail:
        lines.append(result.stdout_tail.rstrip("\n"))
    if result.stderr_tail:
        lines.append("--- stderr ---\n" + result.stderr_tail.rstrip("\n"))
    if value is not None:
        lines.append(_cut(value))
    if error is not None:
        lines.append(f"{error.ename}: {error.evalue}\n{error.traceback}")
    return CallToolResult(content=[TextContent(type="text", text="\n".join(lines)), *blocks],
                          structured_content=result.model_dump(mode="json"), is_error=False)
