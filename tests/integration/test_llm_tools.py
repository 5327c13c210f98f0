"""broker.tools end to end: the real `openai` and `anthropic` SDKs send our definitions to a stand-in model
(examples/standin_model.py), the model's tool calls run in a real broker's sandbox through tools.handle, and the
tool-result message the SDK sends back is checked by what the stand-in recorded. Then examples/llm_agent.py,
on either API and through the MCP server, against the same stand-in."""

from __future__ import annotations

import base64
import gc
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from broker import tools
from broker.client import AsyncClient, Client
from tests.integration.conftest import BrokerProcess, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

from standin_model import Call, Echo, StandIn, tool_result_of  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

POOLS = ("pools:\n  - name: cpu\n    gpus: 0\n    min_count: 0\n    max_idle_count: 4\n    max_count: 4\n"
         "    idle_timeout: 120\n")
PLOT = ("import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9]); plt.show()")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("llm-tools") / "broker", pools=POOLS)
    yield b
    b.stop()


@pytest.fixture
def fp(broker: BrokerProcess) -> Iterator[Client]:
    with Client(broker.url, broker.tokens["alice"]) as client:
        yield client


def session() -> str:
    return f"llm-{uuid.uuid4().hex[:10]}"


def chat_loop(llm: openai.OpenAI, fp: Client, conv: str, prompt: str) -> str:
    """The loop an agent author writes with Chat Completions: call the model, run its tool calls, repeat."""
    defs: Any = tools.definitions("openai")
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(8):
        c = llm.chat.completions.create(model="stand-in", messages=messages, tools=defs)
        msg = c.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content or ""
        for call in msg.tool_calls:
            res = tools.handle(call.function.name, call.function.arguments, session=conv, client=fp)
            messages.append(res.openai_message(call.id))
    raise AssertionError("the loop did not end")


def messages_loop(llm: anthropic.Anthropic, fp: Client, conv: str, prompt: str) -> str:
    """The same loop with Anthropic's Messages API."""
    defs: Any = tools.definitions("anthropic")
    messages: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(8):
        m = llm.messages.create(model="stand-in", max_tokens=1024, messages=messages, tools=defs)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        if m.stop_reason != "tool_use":
            return "".join(b.text for b in m.content if b.type == "text")
        messages.append({"role": "user", "content": [
            tools.handle(b.name, b.input, session=conv, client=fp).anthropic_block(b.id)
            for b in m.content if b.type == "tool_use"]})
    raise AssertionError("the loop did not end")


def test_openai_sdk_sends_our_tools_and_gets_the_commands_output_back(fp: Client) -> None:
    with StandIn([Call("run_in_sandbox", {"command": "echo from-the-tool-$((6*7)); echo oops >&2; exit 3"}),
                  Echo()]) as model:
        llm = openai.OpenAI(base_url=model.url + "/v1", api_key="stand-in", max_retries=0)
        final = chat_loop(llm, fp, session(), "run it")
    (api, first), (_, second) = model.requests
    assert api == "openai" and first["tools"] == tools.definitions("openai")
    result = tool_result_of("openai", second)
    assert result is not None
    text, _ = result
    # A failing command is a result, not an error: its exit code and both streams reach the model.
    assert text.startswith("exit code 3") and "from-the-tool-42" in text and "oops" in text
    assert second["messages"][-1]["tool_call_id"] == "call_1" and second["messages"][-2]["tool_calls"]
    assert final.startswith("tool result: exit code 3")


def test_openai_responses_api_takes_our_definitions_and_the_function_call_output(fp: Client) -> None:
    conv = session()
    with StandIn([Call("write_files", {"files": [{"path": "r.txt", "text": "via responses"}]}),
                  Call("read_file", {"path": "r.txt"}), Echo()]) as model:
        llm = openai.OpenAI(base_url=model.url + "/v1", api_key="stand-in", max_retries=0)
        defs: Any = tools.definitions("openai-responses")
        items: list[Any] = [{"role": "user", "content": "write and read"}]
        for _ in range(8):
            r = llm.responses.create(model="stand-in", input=items, tools=defs)
            calls = [o for o in r.output if o.type == "function_call"]
            if not calls:
                break
            for call in calls:
                items.append(call.model_dump(exclude_none=True))
                items.append(tools.handle(call.name, call.arguments, session=conv, client=fp).responses_item(call.call_id))
    assert [api for api, _ in model.requests] == ["responses"] * 3
    assert model.requests[0][1]["tools"] == tools.definitions("openai-responses")
    last = model.requests[2][1]["input"]
    assert last[-2]["type"] == "function_call" and last[-1] == {"type": "function_call_output", "call_id": "call_2",
                                                                "output": "via responses"}
    assert r.output_text == "tool result: via responses"


def test_anthropic_sdk_keeps_python_state_across_calls_and_gets_the_plot_as_an_image(fp: Client) -> None:
    with StandIn([Call("python_exec", {"code": "x = 41"}), Call("python_exec", {"code": "x + 1"}),
                  Call("python_exec", {"code": PLOT}), Echo()]) as model:
        llm = anthropic.Anthropic(base_url=model.url, api_key="stand-in", max_retries=0)
        final = messages_loop(llm, fp, session(), "compute")
    assert [api for api, _ in model.requests] == ["anthropic"] * 4
    assert model.requests[0][1]["tools"] == tools.definitions("anthropic")
    second = tool_result_of("anthropic", model.requests[2][1])
    assert second is not None and second[0].splitlines()[-1] == "42"
    plot = model.requests[3][1]["messages"][-1]["content"][0]
    assert plot["type"] == "tool_result" and plot["tool_use_id"] == "toolu_0003" and plot["is_error"] is False
    assert len(plot["content"]) == 2, plot["content"]
    image = plot["content"][1]
    assert image["type"] == "image" and image["source"]["media_type"] == "image/png"
    assert base64.b64decode(image["source"]["data"]).startswith(b"\x89PNG")
    assert final.endswith("[1 image(s)]")


def test_bad_arguments_go_back_to_the_model_as_an_error_it_can_fix(fp: Client) -> None:
    with StandIn([Call("run_in_sandbox", {"cmd": "ls"}), Call("read_file", {"path": "../etc/passwd"}),
                  Echo()]) as model:
        llm = anthropic.Anthropic(base_url=model.url, api_key="stand-in", max_retries=0)
        messages_loop(llm, fp, session(), "look around")
    first = model.requests[1][1]["messages"][-1]["content"][0]
    assert first["is_error"] is True and "unknown argument 'cmd'" in first["content"][0]["text"]
    assert "command is required" in first["content"][0]["text"]
    second = model.requests[2][1]["messages"][-1]["content"][0]
    assert second["is_error"] is True and "leaves the workspace" in second["content"][0]["text"]


def test_files_written_by_one_tool_are_read_and_listed_by_the_others(fp: Client) -> None:
    conv = session()
    wrote = tools.handle("write_files", {"files": [{"path": "notes/a.txt", "text": "hello\n"},
                                                   {"path": "notes/b.bin", "base64": "AAEC"}]}, session=conv, client=fp)
    assert not wrote.is_error and wrote.text == "wrote 9 bytes to notes/a.txt, notes/b.bin"
    assert tools.handle("read_file", {"path": "notes/a.txt"}, session=conv, client=fp).text == "hello\n"
    listed = tools.handle("list_files", {"path": "notes"}, session=conv, client=fp).text
    assert "notes/a.txt  (6 bytes)" in listed and "notes/b.bin  (3 bytes)" in listed
    missing = tools.handle("read_file", {"path": "nope.txt"}, session=conv, client=fp)
    assert missing.is_error and "FileNotFound" in missing.text
    seen = tools.handle("run_in_sandbox", {"command": "cat a.txt", "cwd": "notes"}, session=conv, client=fp)
    assert seen.text.startswith("exit code 0") and "hello" in seen.text
    tools.end(conv, client=fp)
    after = tools.handle("run_in_sandbox", {"command": "ls notes || true"}, session=conv, client=fp)
    assert "a.txt" not in after.text  # ended: a later call starts a fresh sandbox


def test_python_state_outlives_the_client_that_made_it(broker: BrokerProcess) -> None:
    conv = session()
    with Client(broker.url, broker.tokens["alice"]) as fp:
        assert not tools.handle("python_exec", {"code": "kept = 7"}, session=conv, client=fp).is_error
    del fp
    gc.collect()  # the client gone: its sandboxes are left as Sandbox(keep=True) leaves them, namespace saved
    with Client(broker.url, broker.tokens["alice"]) as again:
        res = tools.handle("python_exec", {"code": "kept * 6"}, session=conv, client=again)
        tools.end(conv, client=again)
    assert res.text.splitlines()[-1] == "42", res.text


async def test_ahandle_runs_on_an_async_client_and_aclose_leaves_its_state_for_the_next(broker: BrokerProcess) -> None:
    conv = session()
    async with AsyncClient(broker.url, broker.tokens["alice"]) as fp:
        await tools.ahandle("python_exec", {"code": "y = 'kept'"}, session=conv, client=fp)
        await tools.aclose(client=fp)  # before the client closes: the kernel's namespace is saved
    async with AsyncClient(broker.url, broker.tokens["alice"]) as fp:
        res = await tools.ahandle("python_exec", json.dumps({"code": "y"}), session=conv, client=fp)
        assert res.text.splitlines()[-1] == "'kept'"
        await tools.aend(conv, client=fp)


def test_a_broker_failure_is_an_error_result() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", "nobody") as fp:
        res = tools.handle("run_in_sandbox", {"command": "true"}, session=session(), client=fp)
    assert res.is_error and "run_in_sandbox failed: Unavailable" in res.text


@pytest.mark.parametrize(("api", "via"), [("openai", "tools"), ("anthropic", "tools"), ("anthropic", "mcp")])
def test_the_example_agent_runs_on_each_api_against_the_stand_in(broker: BrokerProcess, api: str, via: str) -> None:
    env = {k: v for k, v in broker.env("alice").items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    done = subprocess.run([sys.executable, str(EXAMPLES / "llm_agent.py"), "--api", api, "--via", via],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "hello from the sandbox" in done.stdout and done.stdout.rstrip().endswith("\n42"), done.stdout


def test_the_example_says_so_in_one_line_when_the_broker_is_unreachable() -> None:
    env = {**os.environ, "FIREPOOL_URL": f"http://127.0.0.1:{free_port()}", "FIREPOOL_TOKEN": "x"}
    done = subprocess.run([sys.executable, str(EXAMPLES / "llm_agent.py"), "--api", "openai"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "broker" in done.stderr.lower()
