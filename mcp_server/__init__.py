"""MCP server: a warm Firepool sandbox per conversation for LLM and IDE agents."""
