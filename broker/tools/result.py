"""What a tool call gives back to the model: `ToolResult`, with the message each LLM API takes."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolResult:
    """One tool call's outcome: `text` is what the model reads, `images` the PNGs it displayed."""

    text: str
    images: list[bytes] = field(default_factory=list)
    """PNG images (python_exec's displayed figures, read_file of a PNG), raw bytes."""
    is_error: bool = False
    """The call could not run: bad arguments, an unknown tool, the broker refused or failed. A command that
    ran and exited non-zero is not an error (its exit code is in the text)."""

    def openai_message(self, tool_call_id: str) -> dict[str, Any]:
        """The Chat Completions message answering tool call `tool_call_id` (text only: the API takes no
        images in a tool message)."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.text}

    def responses_item(self, call_id: str) -> dict[str, Any]:
        """The Responses API input item answering function call `call_id`."""
        return {"type": "function_call_output", "call_id": call_id, "output": self.text}

    def anthropic_block(self, tool_use_id: str) -> dict[str, Any]:
        """The Messages API `tool_result` block answering `tool_use_id`: the text, then each image."""
        content: list[dict[str, Any]] = [{"type": "text", "text": self.text or "(no output)"}]
        for png in self.images:
            content.append({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                        "data": base64.b64encode(png).decode()}})
        return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": self.is_error}
