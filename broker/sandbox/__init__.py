"""A session's sandbox driven over the broker's REST API and Jupyter gateway: the engine the SDK's `Sandbox`,
`broker.tools` and the MCP server share (jobs or live-kernel subprocesses, the file helper, a live kernel)."""
