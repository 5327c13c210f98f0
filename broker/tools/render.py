"""A tool's outcome as the text the model reads: short, within a budget per stream (the end of the output,
where errors are), saying what was cut and how to read the rest."""

from __future__ import annotations

from typing import Any

from broker.sandbox.results import CodeResult, CommandResult
from broker.tools.result import ToolResult

TAIL_BYTES = 8 * 1024
"""Output kept per stream (its end), as the MCP server's tools keep."""
TEXT_CHARS = 20_000
"""A rich text output (a DataFrame's markdown) longer than this is cut."""
TRACE_CHARS = 3000
MAX_IMAGES = 5
PNG = b"\x89PNG\r\n\x1a\n"


def tail(text: str, what: str) -> str:
    """The end of `text` within TAIL_BYTES, saying how much was left out."""
    raw = text.encode()
    if len(raw) <= TAIL_BYTES:
        return text
    kept = raw[-TAIL_BYTES:].decode(errors="ignore")
    return f"({what}: the first {len(raw) - len(kept.encode())} bytes left out)\n{kept}"


def _cut(text: str, limit: int = TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)"


def command(r: CommandResult) -> ToolResult:
    """run_in_sandbox: the exit code (or why there is none), then the output's tails. A command that failed
    is a result, not an error; one the sandbox could not run to its end is an error."""
    if r.exit_code is not None:
        head = f"exit code {r.exit_code}"
    elif r.timed_out:
        head = "TIMED OUT: the command was killed (raise timeout_s, or run it in the background with '&' and "\
               "poll)"
    else:
        head = f"the command did not finish: {r.state} ({r.error_class or 'no exit code'})"
    parts = [f"{head} · {r.duration_s:.2f}s"]
    if r.stdout:
        parts.append("--- stdout ---\n" + tail(r.stdout, "stdout").rstrip("\n"))
    if r.stderr:
        parts.append("--- stderr ---\n" + tail(r.stderr, "stderr").rstrip("\n"))
    if not r.stdout and not r.stderr:
        parts.append("(no output)")
    return ToolResult("\n".join(parts), is_error=r.exit_code is None and not r.timed_out)


def code(r: CodeResult) -> ToolResult:
    """python_exec: printed output, rich text outputs, the value, and an exception with its traceback's end;
    the PNGs displayed come as images. An exception in the code is a result (the model reads it)."""
    status = "timed out (interrupted; the kernel and its variables stay)" if r.timed_out else \
        "error" if r.error is not None else "ok"
    lines = [f"[{r.execution_count if r.execution_count is not None else '-'}] {status}"]
    if r.stdout:
        lines.append(tail(r.stdout, "stdout").rstrip("\n"))
    if r.stderr:
        lines.append("--- stderr ---\n" + tail(r.stderr, "stderr").rstrip("\n"))
    for bundle in r.results:  # displayed outputs, in order; images go as images
        if bundle.get("_kind") == "execute_result" or isinstance(bundle.get("image/png"), str):
            continue
        text = next((bundle[m] for m in ("text/markdown", "text/plain") if isinstance(bundle.get(m), str)), None)
        if text is not None:
            lines.append(_cut(text))
    value = r.data.get("text/markdown") if isinstance(r.data.get("text/markdown"), str) else r.text
    if value is not None:
        lines.append(_cut(value))
    if r.error is not None:
        trace = r.error.traceback if len(r.error.traceback) <= TRACE_CHARS else "..." + r.error.traceback[-TRACE_CHARS:]
        lines.append(f"{r.error.name}: {r.error.value}\n{trace}".rstrip("\n"))
    pngs = r.images[:MAX_IMAGES]
    if pngs:
        lines.append(f"({len(pngs)} image{'s' if len(pngs) > 1 else ''} displayed"
                     + (f", {len(r.images) - len(pngs)} more left out" if len(r.images) > len(pngs) else "") + ")")
    return ToolResult("\n".join(lines), images=pngs)


def read(path: str, offset: int, size: int, data: bytes) -> ToolResult:
    """read_file: the text read (or a note that it is binary), where it ends, and a whole PNG as an image."""
    end = offset + len(data)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = f"{path}: {len(data)} bytes of binary data"
    if offset or end < size:
        more = f"; read on with offset={end}" if end < size else ""
        text += f"\n(bytes {offset}-{end} of {size}{more})"
    images = [data] if offset == 0 and end >= size and data.startswith(PNG) else []
    return ToolResult(text, images=images)


def listing(path: str, entries: list[dict[str, Any]], truncated: bool) -> ToolResult:
    """list_files: one line per entry (directories end in '/', files show their size)."""
    lines = [f"{e['path']}/" if e.get("type") == "dir" else f"{e['path']}  ({e.get('size', 0)} bytes)"
             for e in entries]
    if not lines:
        lines.append(f"{path}: empty")
    if truncated:
        lines.append(f"(listing cut at {len(entries)} entries: list a subdirectory or a smaller depth)")
    return ToolResult("\n".join(lines))
