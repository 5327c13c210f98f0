"""broker.tools without a broker: the definitions in each API's format, one source with the MCP server's tools,
the arguments checked against them, and the result's messages for each API."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from mcp import Client

from broker import tools
from broker.sandbox.results import CodeResult, CommandResult
from broker.tools import render
from mcp_server.server import build_server

NAMES = ["run_in_sandbox", "python_exec", "write_files", "read_file", "list_files"]
MCP_ONLY = {"run_in_sandbox": {"background"}}
"""Parameters only the MCP form has: a background job is followed with job_status, an MCP-only tool."""


class NoBroker:
    transport = "stdio"

    def client(self) -> tuple[str, Any]:
        raise AssertionError("the broker was called")

    async def close(self) -> None:
        pass


def test_each_format_lists_every_tool_in_that_apis_shape() -> None:
    chat = tools.definitions("openai")
    assert [d["function"]["name"] for d in chat] == NAMES
    assert all(d["type"] == "function" and set(d["function"]) == {"name", "description", "parameters"} for d in chat)
    responses = tools.definitions("openai-responses")
    assert [(d["type"], d["name"]) for d in responses] == [("function", n) for n in NAMES]
    assert all(set(d) == {"type", "name", "description", "parameters"} for d in responses)
    anthropic = tools.definitions("anthropic")
    assert [d["name"] for d in anthropic] == NAMES
    assert all(set(d) == {"name", "description", "input_schema"} for d in anthropic)
    plain = tools.definitions("json")
    assert [d["parameters"] for d in plain] == [d["input_schema"] for d in anthropic]
    assert [d["parameters"] for d in plain] == [d["function"]["parameters"] for d in chat]


def test_the_llm_definitions_never_mention_a_session_and_refuse_unknown_fields() -> None:
    # The application names the session; a model told of one would pass it and be refused as an unknown field.
    assert "session" not in json.dumps(tools.definitions("openai")).lower()
    for d in tools.definitions("json"):
        params = d["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert "session" not in params["properties"], d["name"]
    run = tools.definitions("json", names=["run_in_sandbox"])[0]["parameters"]
    assert run["required"] == ["command"] and run["properties"]["timeout_s"]["maximum"] == 3600


def test_an_unknown_format_or_tool_name_is_a_value_error_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="openai, openai-responses, anthropic, json"):
        tools.definitions("gemini")
    with pytest.raises(ValueError, match="run_in_sandbox"):
        tools.definitions("openai", names=["job_status"])


async def test_the_mcp_servers_shared_tools_take_the_llm_definitions_parameters_plus_session() -> None:
    async with Client(build_server(NoBroker())) as c:
        served = {t.name: t for t in (await c.list_tools()).tools}
    for d in tools.definitions("json"):
        mcp = served[d["name"]]
        schema = json.loads(json.dumps(mcp.input_schema))
        props = schema["properties"]
        assert props.pop("session")["anyOf"][0]["maxLength"] == 128
        for extra in MCP_ONLY.get(d["name"], ()):
            props.pop(extra)
        ours = {k: v for k, v in d["parameters"].items() if k != "additionalProperties"}
        assert schema == ours, d["name"]
        assert (mcp.description or "").startswith(d["description"]), d["name"]


@pytest.mark.parametrize(("name", "arguments", "needle"), [
    ("run_in_sandbox", {"command": "true", "bogus": 1}, "unknown argument 'bogus' (the arguments are command"),
    ("run_in_sandbox", {"command": "true", "session": "s"}, "unknown argument 'session'"),
    ("run_in_sandbox", {"command": "true", "timeout_s": 0}, "timeout_s: Input should be greater than 0"),
    ("run_in_sandbox", '{"command": "true", "timeout_s": NaN}', "timeout_s: Input should be a finite number"),
    ("run_in_sandbox", {"command": "true", "env": {"A": 1}}, "env.A: Input should be a valid string"),
    ("run_in_sandbox", {}, "command is required"),
    ("run_in_sandbox", '{"command": ', "not valid JSON"),
    ("run_in_sandbox", "[1]", "must be a JSON object"),
    ("python_exec", {"code": ""}, "code: String should have at least 1 character"),
    ("write_files", {"files": []}, "files: List should have at least 1 item"),
    ("write_files", {"files": [{"path": "a"}]}, "exactly one of `text` or `base64`"),
    ("read_file", {"path": "a", "max_bytes": 0}, "max_bytes"),
    ("list_files", {"depth": "deep"}, "depth: Input should be a valid integer"),
    ("job_status", {"job_id": "j"}, "unknown tool 'job_status': the tools are run_in_sandbox"),
])
def test_bad_arguments_are_error_results_the_model_can_act_on(name: str, arguments: Any, needle: str) -> None:
    res = tools.parse(name, arguments)
    assert isinstance(res, tools.ToolResult) and res.is_error
    assert needle in res.text, res.text
    assert res.text.startswith(name if name != "job_status" else "unknown tool")


def test_arguments_as_the_apis_json_string_parse_like_a_dict() -> None:
    args = tools.parse("run_in_sandbox", json.dumps({"command": "ls", "timeout_s": 5}))
    assert not isinstance(args, tools.ToolResult)
    assert args.model_dump() == {"command": "ls", "cwd": None, "env": None, "timeout_s": 5.0}


def test_bad_arguments_never_reach_the_client() -> None:
    # handle() checks the arguments before it looks at the client: a client it cannot use is never touched
    res = tools.handle("write_files", {"files": [{"path": "a", "text": "x", "mode": 1}]}, session="s1",
                       client=object())  # type: ignore[arg-type]
    assert res.is_error and "unknown argument 'files.0.mode'" in res.text


def test_a_failing_command_is_a_result_with_its_exit_code_and_a_lost_one_is_an_error() -> None:
    failed = render.command(CommandResult(exit_code=3, stdout="", stderr="no such file\n", state="FAILED",
                                          error_class="NonZeroExit", duration_s=0.25))
    assert not failed.is_error and failed.text.startswith("exit code 3") and "no such file" in failed.text
    lost = render.command(CommandResult(exit_code=None, stdout="", stderr="", state="FAILED", error_class="PodLost"))
    assert lost.is_error and "PodLost" in lost.text
    slow = render.command(CommandResult(exit_code=None, stdout="partial\n", stderr="", state="FAILED",
                                        error_class="Timeout"))
    assert not slow.is_error and "TIMED OUT" in slow.text and "partial" in slow.text


def test_long_output_keeps_its_end_within_the_budget_and_says_what_was_cut() -> None:
    out = "".join(f"line {i}\n" for i in range(10_000))
    res = render.command(CommandResult(exit_code=0, stdout=out, stderr="", state="SUCCEEDED"))
    assert "line 9999" in res.text and "line 0\n" not in res.text
    assert len(res.text.encode()) < render.TAIL_BYTES + 200 and "bytes left out" in res.text


def test_a_cells_value_error_and_images_reach_the_model() -> None:
    png = b"\x89PNG\r\n\x1a\nfake"
    cell = CodeResult.of("printed\n", "", [
        {"kind": "display_data", "data": {"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"}},
        {"kind": "execute_result", "data": {"text/plain": "42"}},
    ], None, 3, False)
    res = render.code(cell)
    assert res.text.splitlines() == ["[3] ok", "printed", "42", "(1 image displayed)"]
    assert res.images == [png] and not res.is_error
    failed = render.code(CodeResult.of("", "", [], {"ename": "ZeroDivisionError", "evalue": "division by zero",
                                                    "traceback": ["\x1b[31mTraceback\x1b[0m", "----> 1 1/0"]},
                                       4, False))
    assert not failed.is_error and "ZeroDivisionError: division by zero" in failed.text
    assert "----> 1 1/0" in failed.text and "\x1b" not in failed.text


def test_each_apis_tool_result_message_carries_the_text_and_images() -> None:
    res = tools.ToolResult("exit code 0", images=[b"\x89PNG-bytes"])
    assert res.openai_message("call_1") == {"role": "tool", "tool_call_id": "call_1", "content": "exit code 0"}
    assert res.responses_item("fc_1") == {"type": "function_call_output", "call_id": "fc_1", "output": "exit code 0"}
    block = res.anthropic_block("toolu_1")
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_1" and block["is_error"] is False
    assert block["content"][0] == {"type": "text", "text": "exit code 0"}
    assert block["content"][1]["source"] == {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(b"\x89PNG-bytes").decode()}


def test_a_read_says_where_it_stopped_and_a_whole_png_is_an_image() -> None:
    part = render.read("log.txt", 0, 100, b"0123456789")
    assert part.text == "0123456789\n(bytes 0-10 of 100; read on with offset=10)" and not part.images
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    whole = render.read("plot.png", 0, len(png), png)
    assert whole.images == [png] and "binary data" in whole.text
