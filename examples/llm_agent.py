"""A minimal agent loop on the OpenAI or Anthropic API whose tools run in a Firepool sandbox (one per
conversation): the model asks for run_in_sandbox / python_exec / the file tools, `broker.tools` runs them,
their results go back, until the model answers in text.

    python examples/llm_agent.py --api openai                        # OPENAI_API_KEY set: the real API
    python examples/llm_agent.py --api anthropic --model claude-sonnet-4-5 --prompt "..."
    python examples/llm_agent.py --api anthropic --via mcp           # the same tools through `firepool mcp`

With no API key in the environment, a local stand-in model (standin_model.py) plays a short script (a shell
command, then Python). `--via mcp` takes the tools from the MCP server over stdio with the `mcp` client SDK,
for comparison: same names, same parameters (plus MCP's `session`), same sandbox.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

from standin_model import Call, Echo, StandIn, Turn  # noqa: E402

from broker import tools  # noqa: E402
from broker.client import AsyncClient  # noqa: E402
from broker.errors import FirepoolError  # noqa: E402
from broker.tools import ToolResult  # noqa: E402

KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-sonnet-4-5"}
PROMPT = ("Use the sandbox: print 'hello from the sandbox' with a shell command, then compute 6*7 in Python. "
          "Report both results.")
SCRIPT: list[Turn] = [Call("run_in_sandbox", {"command": "echo hello from the sandbox; uname -s"}),
          Call("python_exec", {"code": "x = 6 * 7\nx"}), Echo()]
"""What the stand-in model does when no API key is set."""


class Toolbox(Protocol):
    def definitions(self, api: str) -> list[dict[str, Any]]: ...
    async def call(self, name: str, arguments: Any) -> ToolResult: ...


class Direct:
    """The tools through broker.tools: the application names the session (the conversation)."""

    def __init__(self, fp: AsyncClient, pool: str) -> None:
        self.fp, self.pool, self.session = fp, pool, f"agent-{uuid.uuid4().hex[:8]}"

    def definitions(self, api: str) -> list[dict[str, Any]]:
        return tools.definitions(api)

    async def call(self, name: str, arguments: Any) -> ToolResult:
        return await tools.ahandle(name, arguments, session=self.session, client=self.fp, pool=self.pool)


class ViaMcp:
    """The same tools from `firepool mcp` (stdio): its one process is the conversation's default session."""

    def __init__(self, client: Any, listed: list[Any]) -> None:
        self.client = client
        self.listed = [{"name": t.name, "description": t.description or "", "parameters": t.input_schema}
                       for t in listed if t.name in tools.SPECS]

    def definitions(self, api: str) -> list[dict[str, Any]]:
        if api == "openai":
            return [{"type": "function", "function": d} for d in self.listed]
        return [{"name": d["name"], "description": d["description"], "input_schema": d["parameters"]}
                for d in self.listed]

    async def call(self, name: str, arguments: Any) -> ToolResult:
        import json

        args = json.loads(arguments) if isinstance(arguments, str) else arguments
        res = await self.client.call_tool(name, args)
        text = "\n".join(b.text for b in res.content if b.type == "text")
        images = [base64.b64decode(b.data) for b in res.content if b.type == "image" and b.mime_type == "image/png"]
        return ToolResult(text, images=images, is_error=bool(res.is_error))


def show(name: str, arguments: Any, res: ToolResult) -> None:
    print(f"> {name} {arguments}")
    print("  " + res.text.replace("\n", "\n  ") + (f"\n  [{len(res.images)} image(s)]" if res.images else ""))


async def openai_loop(box: Toolbox, model: str, prompt: str, base_url: str | None, key: str) -> str:
    import openai

    llm = openai.AsyncOpenAI(base_url=base_url, api_key=key)
    messages: list[Any] = [{"role": "user", "content": prompt}]
    defs: Any = box.definitions("openai")
    for _ in range(20):
        c = await llm.chat.completions.create(model=model, messages=messages, tools=defs)
        msg = c.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content or ""
        for call in msg.tool_calls:
            fn = getattr(call, "function", None)  # a function call (not a custom tool's)
            res = await box.call(fn.name, fn.arguments) if fn else ToolResult("not a function tool", is_error=True)
            show(fn.name if fn else call.type, fn.arguments if fn else "", res)
            messages.append(res.openai_message(call.id))
    return "(stopped after 20 turns)"


async def anthropic_loop(box: Toolbox, model: str, prompt: str, base_url: str | None, key: str) -> str:
    import anthropic

    llm = anthropic.AsyncAnthropic(base_url=base_url, api_key=key)
    messages: list[Any] = [{"role": "user", "content": prompt}]
    defs: Any = box.definitions("anthropic")
    for _ in range(20):
        m = await llm.messages.create(model=model, max_tokens=2048, messages=messages, tools=defs)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        if m.stop_reason != "tool_use":
            return "".join(b.text for b in m.content if b.type == "text")
        results = []
        for b in m.content:
            if b.type == "tool_use":
                res = await box.call(b.name, b.input)
                show(b.name, b.input, res)
                results.append(res.anthropic_block(b.id))
        messages.append({"role": "user", "content": results})
    return "(stopped after 20 turns)"


async def agent(args: argparse.Namespace, fp: AsyncClient) -> str:
    key = os.environ.get(KEYS[args.api])
    loop = openai_loop if args.api == "openai" else anthropic_loop
    async with contextlib.AsyncExitStack() as stack:
        base_url = None
        if not key:
            model = stack.enter_context(StandIn(list(SCRIPT)))
            base_url, key = (model.url + "/v1" if args.api == "openai" else model.url), "stand-in"
            print(f"(no {KEYS[args.api]}: a stand-in model at {model.url} plays a short script)")
        box: Toolbox
        if args.via == "mcp":
            from mcp import Client, StdioServerParameters

            firepool = shutil.which("firepool")
            cmd, argv = (firepool, ["mcp"]) if firepool else (sys.executable, ["-m", "broker.cli", "mcp"])
            params = StdioServerParameters(command=cmd, args=[*argv, "--pool", args.pool, *(["--url", args.url] if args.url else [])], env=dict(os.environ))
            client = await stack.enter_async_context(Client(params))
            box = ViaMcp(client, (await client.list_tools()).tools)
        else:
            box = Direct(fp, args.pool)
            stack.push_async_callback(tools.aend, box.session, client=fp)  # the conversation is over
        return await loop(box, args.model or MODELS[args.api], args.prompt, base_url, key)


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--api", choices=("openai", "anthropic"), default="openai")
    p.add_argument("--via", choices=("tools", "mcp"), default="tools",
                   help="tools: broker.tools in this process; mcp: the MCP server's tools over stdio")
    p.add_argument("--model", help=f"the model (default {MODELS['openai']} / {MODELS['anthropic']})")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--pool", default="cpu")
    p.add_argument("--url", help="the broker (default: FIREPOOL_URL, or the local one)")
    args = p.parse_args()
    try:
        async with AsyncClient(args.url) as fp:
            await fp.whoami()
            print(await agent(args, fp))
    except FirepoolError as exc:
        print(f"llm_agent: the Firepool broker is unreachable or refused: {exc.error_class}: "
              f"{' '.join(exc.message.split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
