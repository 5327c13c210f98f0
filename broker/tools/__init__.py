"""Tools for any LLM API: the sandbox tools' definitions in each API's format, and a dispatcher that runs the
calls the model makes in the conversation's sandbox (docs/llm-tools.md).

    from broker import tools
    from broker.client import Client
    defs = tools.definitions("openai")          # or "openai-responses", "anthropic", "json"
    with Client() as fp:
        res = tools.handle(name, arguments, session="conv-1", client=fp)   # res.text, res.images, res.is_error
        messages.append(res.openai_message(tool_call_id))

The same tools, with the same parameters, are what the MCP server serves (mcp_server/server.py).
"""

from broker.tools.dispatch import aclose, aend, ahandle, close, end, handle, parse
from broker.tools.result import ToolResult
from broker.tools.specs import FORMATS, SPECS, definitions

__all__ = ["FORMATS", "SPECS", "ToolResult", "aclose", "aend", "ahandle", "close", "definitions", "end", "handle",
           "parse"]
