"""A stand-in for an LLM API on 127.0.0.1, for tests and for `llm_agent.py` without an API key: OpenAI's
`POST /v1/chat/completions` and `POST /v1/responses` and Anthropic's `POST /v1/messages` in their documented
wire formats, playing a script of turns (call a tool with given arguments; reply with text) and recording every request body.

    with StandIn([Call("run_in_sandbox", {"command": "echo hi"}), Echo()]) as model:
        llm = openai.OpenAI(base_url=model.url + "/v1", api_key="stand-in")        # or
        llm = anthropic.Anthropic(base_url=model.url, api_key="stand-in")
        ...
        model.requests        # [(api, body), ...] with api "openai", "responses" or "anthropic": what the SDK sent, tools list and tool results included

Test support, not product code: it checks the request's shape (a malformed one is an API-style 400), not the
model's intelligence. `Echo()` replies with the last tool result it was sent, so a caller that only sees the
final text (an example run as a subprocess) can still show what came back from the tool.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Call:
    """A turn that calls tool `name` with `arguments`."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """A turn that answers with `text` and ends the exchange."""

    text: str


@dataclass(frozen=True)
class Echo:
    """A turn that answers with the last tool result it was sent ("tool result: ..."), and its images' count."""

    prefix: str = "tool result: "


Turn = Call | Reply | Echo


def tool_result_of(api: str, body: dict[str, Any]) -> tuple[str, int] | None:
    """The last message's tool result in a request (its text, and how many images it carries), if it is one."""
    if api == "responses":
        items = body.get("input")
        last_item = items[-1] if isinstance(items, list) and items else {}
        return (str(last_item.get("output")), 0) if last_item.get("type") == "function_call_output" else None
    messages = body.get("messages") or []
    if not messages:
        return None
    last = messages[-1]
    if api == "openai":
        if last.get("role") != "tool":
            return None
        content = last.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content), 0
    blocks = last.get("content") if last.get("role") == "user" else None
    results = [b for b in blocks or [] if isinstance(b, dict) and b.get("type") == "tool_result"]
    if not results:
        return None
    inner = results[-1].get("content")
    if isinstance(inner, str):
        return inner, 0
    text = "".join(b.get("text", "") for b in inner or [] if b.get("type") == "text")
    return text, sum(1 for b in inner or [] if b.get("type") == "image")


def _problem(api: str, body: Any) -> str | None:
    """What makes a request malformed for its API (the part of the documented format the SDK must get right)."""
    if not isinstance(body, dict) or not body.get("model"):
        return "model is required"
    if api == "responses" and not isinstance(body.get("input"), str | list):
        return "input is required"
    if api != "responses" and not isinstance(body.get("messages"), list):
        return "messages are required"
    tools = body.get("tools") or []
    for t in tools:
        if api == "responses" and not (t.get("type") == "function" and t.get("name")
                                       and isinstance(t.get("parameters"), dict)):
            return f"tools: {json.dumps(t)[:80]} is not a function tool"
        if api == "openai" and not (t.get("type") == "function" and t.get("function", {}).get("name")
                                    and isinstance(t["function"].get("parameters"), dict)):
            return f"tools: {json.dumps(t)[:80]} is not a function tool"
        if api == "anthropic" and not (t.get("name") and isinstance(t.get("input_schema"), dict)):
            return f"tools: {json.dumps(t)[:80]} has no name and input_schema"
    if api == "anthropic" and not body.get("max_tokens"):
        return "max_tokens is required"
    return None


class StandIn:
    """The stand-in server; `turns` are played in order, one per request (then "done")."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                api = {"/v1/chat/completions": "openai", "/v1/responses": "responses",
                       "/v1/messages": "anthropic"}.get(self.path.split("?")[0])
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                except json.JSONDecodeError:
                    body = None
                if api is None:
                    return self._send(404, {"error": {"type": "not_found_error", "message": self.path}})
                problem = _problem(api, body)
                if problem:
                    error = {"type": "invalid_request_error", "message": problem}
                    return self._send(400, {"error": error} if api != "anthropic" else {"type": "error", "error": error})
                self._send(200, stand_in.answer(api, body))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="standin-model", daemon=True)

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, api: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.requests.append((api, body))
            turn = self.turns.pop(0) if self.turns else Reply("done")
            n = next(self._ids)
        if isinstance(turn, Echo):
            got = tool_result_of(api, body)
            text = "no tool result was sent" if got is None else \
                f"{turn.prefix}{got[0]}" + (f" [{got[1]} image(s)]" if got[1] else "")
            turn = Reply(text)
        model = body["model"]
        if api == "responses":
            if isinstance(turn, Call):
                item: dict[str, Any] = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
                                        "name": turn.name, "arguments": json.dumps(turn.arguments),
                                        "status": "completed"}
            else:
                item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": turn.text, "annotations": []}]}
            return {"id": f"resp_{n}", "object": "response", "created_at": 1_700_000_000 + n, "model": model,
                    "status": "completed", "output": [item], "parallel_tool_calls": True, "tool_choice": "auto",
                    "tools": body.get("tools") or [], "error": None, "incomplete_details": None,
                    "instructions": None, "metadata": {}, "temperature": None, "top_p": None,
                    "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                              "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": 0}}}
        if api == "openai":
            if isinstance(turn, Call):
                message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                    {"id": f"call_{n}", "type": "function",
                     "function": {"name": turn.name, "arguments": json.dumps(turn.arguments)}}]}
            else:
                message = {"role": "assistant", "content": turn.text, "refusal": None}
            return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 1_700_000_000 + n, "model": model,
                    "choices": [{"index": 0, "message": message, "logprobs": None,
                                 "finish_reason": "tool_calls" if isinstance(turn, Call) else "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
        if isinstance(turn, Call):
            content: list[dict[str, Any]] = [{"type": "tool_use", "id": f"toolu_{n:04d}", "name": turn.name,
                                              "input": turn.arguments}]
        else:
            content = [{"type": "text", "text": turn.text}]
        return {"id": f"msg_{n:04d}", "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": "tool_use" if isinstance(turn, Call) else "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 5}}
