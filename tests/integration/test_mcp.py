"""The MCP server against a real broker on the local backend, driven by the official MCP client:
in process (`mcp.Client`), as a `firepool mcp` subprocess over stdio, and over streamable HTTP."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from mcp_server.identity import StdioBroker
from mcp_server.server import build_server
from tests.integration.conftest import BrokerProcess, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("mcp") / "broker")
    yield broker
    broker.stop()


@contextlib.asynccontextmanager
async def in_process(fp: BrokerProcess, caller: str = "alice") -> AsyncIterator[Client]:
    """The server in this process (the official client's in-memory connection), acting as `caller`."""
    broker = StdioBroker(fp.url, fp.tokens[caller])
    server = build_server(broker)
    try:
        async with Client(server) as client:
            yield client
    finally:
        await server.kernels.close(save=False)
        await broker.close()


async def call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    res = await client.call_tool(tool, args)
    assert not res.is_error, res.content
    assert res.structured_content is not None
    return dict(res.structured_content)


def pod_of(fp: BrokerProcess, job_id: str, caller: str = "alice") -> str:
    job = fp.client(caller).get(f"/v1/jobs/{job_id}").json()
    return str(job["acquisition"][0]["pod"])


async def test_a_conversation_stays_warm_and_keeps_its_files_apart_from_other_sessions(fp: BrokerProcess) -> None:
    async with in_process(fp) as c:
        first = await call(c, "run_in_sandbox", command="echo one > f.txt; echo ok", session="conv-a")
        assert first["session"] == "conv-a" and first["exit_code"] == 0 and first["stdout_tail"] == "ok\n"
        later = [await call(c, "run_in_sandbox", command="cat f.txt", session="conv-a") for _ in range(4)]
        assert [r["acquisition"] for r in later] == ["warm"] * 4
        assert all(r["stdout_tail"] == "one\n" for r in later)
        other = await call(c, "run_in_sandbox", command="cat f.txt || echo absent", session="conv-b")
        assert other["stdout_tail"] == "absent\n"
        back = await call(c, "run_in_sandbox", command="cat f.txt", session="conv-a")
        assert back["acquisition"] == "warm" and back["stdout_tail"] == "one\n"
        assert pod_of(fp, other["job_id"]) != pod_of(fp, back["job_id"])


async def test_two_callers_naming_one_session_never_share_a_sandbox(fp: BrokerProcess) -> None:
    async with in_process(fp, "alice") as alice, in_process(fp, "bob") as bob:
        a = await call(alice, "run_in_sandbox", command="echo secret > mine.txt", session="shared")
        b = await call(bob, "run_in_sandbox", command="cat mine.txt 2>/dev/null || echo absent", session="shared")
        assert b["stdout_tail"] == "absent\n"
        assert pod_of(fp, a["job_id"], "alice") != pod_of(fp, b["job_id"], "bob")


async def test_python_state_survives_between_calls_and_plots_come_back_as_images(fp: BrokerProcess) -> None:
    async with in_process(fp) as c:
        await call(c, "python_exec", code="x = 41\nimport math\ndef double(v):\n    return 2 * v", session="py")
        res = await call(c, "python_exec", code="print(x + 1)\ndouble(math.floor(2.5))", session="py")
        assert res["stdout_tail"] == "42\n" and res["result"] == "4" and res["status"] == "ok"
        plot = await c.call_tool("python_exec", {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])",
                                                 "session": "py"})
        assert not plot.is_error, plot.content
        images = [b for b in plot.content if b.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
        assert plot.structured_content["outputs"] == ["image/png"]
        gen = await call(c, "python_exec", code="gen = (i for i in range(3))\nnext(gen)", session="py")
        assert (await call(c, "python_exec", code="next(gen)", session="py"))["result"] == "1" and gen["result"] == "0"


async def test_non_image_outputs_come_back_as_resource_links_readable_as_resources(fp: BrokerProcess) -> None:
    async with in_process(fp) as c:
        res = await c.call_tool("run_in_sandbox", {"command": "echo made; echo a,b > outputs/table.csv",
                                                  "session": "links"})
        links = [b for b in res.content if b.type == "resource_link"]
        assert [link.name for link in links] == ["outputs/table.csv"]
        read = await c.read_resource(links[0].uri)
        # A text file reads back as text, with its own MIME type.
        assert getattr(read.contents[0], "text", None) == "a,b\n" and read.contents[0].mime_type == "text/csv"
        log = await c.read_resource(res.structured_content["log_uri"])
        assert getattr(log.contents[0], "text", None) == "made\n"


async def test_a_timeout_returns_partial_output_within_seconds(fp: BrokerProcess) -> None:
    async with in_process(fp) as c:
        began = time.monotonic()
        res = await call(c, "run_in_sandbox", command="echo started; sleep 30; echo never", session="slow",
                         timeout_s=2)
        assert time.monotonic() - began < 10
        assert res["timed_out"] is True and res["stdout_tail"] == "started\n" and res["state"] == "FAILED"


async def test_progress_notifications_carry_the_last_output_line(fp: BrokerProcess) -> None:
    seen: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    async with in_process(fp) as c:
        res = await c.call_tool("run_in_sandbox", {"command": "echo step-one; sleep 5", "session": "prog"},
                                progress_callback=progress)
        assert not res.is_error
    assert any("step-one" in m for m in seen), seen


def _sleepers(pid_listing: str) -> list[str]:
    return [line for line in pid_listing.splitlines() if "sleep 31" in line]


async def test_a_cancelled_call_leaves_no_process_behind(fp: BrokerProcess) -> None:
    async with in_process(fp) as c:
        await call(c, "run_in_sandbox", command="true", session="cancel")
        task = asyncio.ensure_future(c.call_tool("run_in_sandbox", {"command": "sleep 31", "session": "cancel"}))
        http = fp.client()
        deadline = time.monotonic() + 20
        running: list[dict[str, Any]] = []
        while not running and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            running = http.get("/v1/jobs", params={"state": "RUNNING"}).json()["jobs"]
        assert running, "the call never started its job"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        job = http.get(f"/v1/jobs/{running[0]['id']}", params={"wait_s": 20}).json()
        assert job["state"] == "CANCELLED"
        check = await call(c, "run_in_sandbox", session="cancel",
                           command="for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
        assert check["acquisition"] == "warm" and _sleepers(check["stdout_tail"]) == []


async def test_unknown_arguments_and_bad_values_are_tool_errors_the_model_can_read(fp: BrokerProcess) -> None:
    async with in_process(fp) as c:
        bad: list[tuple[str, dict[str, Any], str]] = [
               ("run_in_sandbox", {"command": "true", "bogus": 1}, "unknown argument"),
               ("run_in_sandbox", {"command": "true", "timeout_s": -1}, "timeout_s"),
               ("run_in_sandbox", {"command": "true", "timeout_s": 4000}, "timeout_s"),
               ("run_in_sandbox", {"command": "true", "session": "no spaces!"}, "not a valid session"),
               ("run_in_sandbox", {}, "command"),
               ("write_files", {"files": [{"path": "a", "text": "x", "base64": "eA=="}]}, "exactly one"),
               ("write_files", {"files": [{"path": "a", "body": "x"}]}, "body"),
               ("read_file", {"path": "missing.txt", "session": "errs"}, "no such file"),
               ("job_status", {"job_id": "nosuchjob"}, "NotFound"),
               ("install_packages", {"packages": ["--index-url=http://evil"]}, "packages")]
        for tool, args, needle in bad:
            res = await c.call_tool(tool, args)
            assert res.is_error, (tool, args)
            text = " ".join(b.text for b in res.content if b.type == "text")
            assert needle.lower() in text.lower(), (tool, args, text)
        # the server is still fine afterwards
        assert (await call(c, "run_in_sandbox", command="echo alive", session="errs"))["stdout_tail"] == "alive\n"


async def test_workspace_files_round_trip_and_end_session_retires_the_sandbox(fp: BrokerProcess) -> None:
    payload = bytes(range(256))
    async with in_process(fp) as c:
        wrote = await call(c, "write_files", session="files", files=[
            {"path": "src/main.py", "text": "print('hi')\n"},
            {"path": "data.bin", "base64": base64.b64encode(payload).decode()}])
        assert wrote["written"] == [{"path": "src/main.py", "bytes": 12}, {"path": "data.bin", "bytes": 256}]
        text = await call(c, "read_file", path="src/main.py", session="files")
        assert text["text"] == "print('hi')\n" and text["eof"] is True
        binary = await call(c, "read_file", path="data.bin", session="files", offset=128, max_bytes=8)
        assert base64.b64decode(binary["base64"]) == payload[128:136] and binary["size"] == 256
        listing = await call(c, "list_files", session="files")
        assert {"src", "src/main.py", "data.bin"} <= {e["path"] for e in listing["entries"]}
        ran = await call(c, "run_in_sandbox", command="python3 main.py", cwd="src", session="files")
        assert ran["stdout_tail"] == "hi\n" and ran["acquisition"] == "warm"
        info = await call(c, "sandbox_info", session="files")
        assert info["pool"] == "cpu" and info["acquisition"] == "warm" and info["disk"]["total_bytes"] > 0
        ended = await call(c, "end_session", session="files")
        # Idle now, or still resetting from sandbox_info's job (the result can come back before the reset ends):
        assert ended["retired_pods"] + ended["retiring_at_release"] == [info["pod"]]
        after = await call(c, "run_in_sandbox", command="ls src 2>/dev/null || echo gone", session="files")
        assert after["acquisition"] != "warm" and after["stdout_tail"] == "gone\n"


async def test_background_jobs_are_followed_with_job_status_and_cancelled_with_job_cancel(fp: BrokerProcess) -> None:
    async with in_process(fp) as c:
        started = await call(c, "run_in_sandbox", command="echo a; sleep 1; echo b", session="bg", background=True)
        assert started["state"] in ("QUEUED", "RUNNING")
        done = await call(c, "job_status", job_id=started["job_id"], wait_s=30)
        assert done["state"] == "SUCCEEDED" and done["output"] == "a\nb\n" and done["output_complete"] is True
        tail = await call(c, "job_status", job_id=started["job_id"], since=2)
        assert tail["output"] == "b\n" and tail["next_offset"] == 4
        long = await call(c, "run_in_sandbox", command="sleep 60", session="bg", background=True)
        await call(c, "job_cancel", job_id=long["job_id"])
        final = await call(c, "job_status", job_id=long["job_id"], wait_s=30)
        assert final["state"] == "CANCELLED"


def _wheel(name: str, version: str) -> bytes:
    """A minimal pure-Python wheel: one module that knows its version."""
    buf = io.BytesIO()
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": f"VERSION = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(path, text)
    return buf.getvalue()


async def test_installed_packages_stay_for_the_session_and_are_not_reinstalled(fp: BrokerProcess) -> None:
    wheel = "fptiny-1.0-py3-none-any.whl"
    async with in_process(fp) as c:
        await call(c, "write_files", session="pkgs",
                   files=[{"path": wheel, "base64": base64.b64encode(_wheel("fptiny", "1.0")).decode()}])
        first = await call(c, "install_packages", packages=[f"./{wheel}"], session="pkgs")
        assert first["installed"] == [f"./{wheel}"] and first["pip_exit_code"] == 0
        used = await call(c, "python_exec", code="import fptiny; fptiny.VERSION", session="pkgs")
        assert used["result"] == "'1.0'"
        again = await call(c, "install_packages", packages=["fptiny==1.0"], session="pkgs")
        assert again["installed"] == [] and again["already_present"] == [{"package": "fptiny==1.0", "version": "1.0"}]


def _text(res: Any) -> dict[str, Any]:
    assert not res.is_error, res.content
    return dict(res.structured_content)


async def test_firepool_mcp_over_stdio_keeps_a_default_session_warm(fp: BrokerProcess) -> None:
    env = {**fp.env("alice"), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    params = StdioServerParameters(command="firepool", args=["mcp"], env=env)
    async with Client(params) as c:
        names = {t.name for t in (await c.list_tools()).tools}
        assert {"run_in_sandbox", "python_exec", "job_status", "job_cancel", "write_files", "read_file",
                "list_files", "install_packages", "sandbox_info", "end_session"} <= names
        tools = {t.name: t for t in (await c.list_tools()).tools}
        notes = {name: t.annotations for name, t in tools.items() if t.annotations is not None}
        assert notes["read_file"].read_only_hint is True
        assert notes["end_session"].destructive_hint is True
        first = _text(await c.call_tool("run_in_sandbox", {"command": "echo 1 > n"}))
        second = _text(await c.call_tool("run_in_sandbox", {"command": "cat n"}))
        assert first["session"] == second["session"] and second["acquisition"] == "warm"
        assert second["stdout_tail"] == "1\n"


@pytest.fixture
def mcp_http(fp: BrokerProcess, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`firepool mcp --http` with its own client tokens, acting toward the broker with the broker's tokens."""
    client_tokens = {"alice": "mcp-alice-token", "bob": "mcp-bob-token", "mallory": "mcp-mallory-token"}
    (tmp_path / "mcp-tokens.json").write_text(json.dumps({t: c for c, t in client_tokens.items()}))
    broker_tokens = {t: c for c, t in fp.tokens.items() if c in ("alice", "bob")}
    (tmp_path / "broker-tokens.json").write_text(json.dumps(broker_tokens))
    (tmp_path / "broker-tokens.json").chmod(0o600)  # plain tokens it sends on: refused when others may read them
    port = free_port()
    with open(tmp_path / "mcp.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "broker.cli", "mcp", "--http", "--port", str(port),
                                 "--url", fp.url, "--tokens", str(tmp_path / "mcp-tokens.json"),
                                 "--broker-tokens", str(tmp_path / "broker-tokens.json"),
                                 "--cors-origin", "https://inspector.example"],
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield url, client_tokens
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


@contextlib.asynccontextmanager
async def _http_client(url: str, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The official client over streamable HTTP, presenting an MCP bearer token."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=40) as http, \
            Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


async def test_streamable_http_acts_as_the_verified_caller_and_refuses_unknown_tokens(
        fp: BrokerProcess, mcp_http: tuple[str, dict[str, str]]) -> None:
    url, tokens = mcp_http
    async with _http_client(url, tokens["alice"]) as alice, _http_client(url, tokens["bob"]) as bob:
        a1 = _text(await alice.call_tool("run_in_sandbox", {"command": "echo hi > f; whoami", "session": "h"}))
        a2 = _text(await alice.call_tool("run_in_sandbox", {"command": "cat f", "session": "h"}))
        b1 = _text(await bob.call_tool("run_in_sandbox", {"command": "cat f || echo absent", "session": "h"}))
        assert a2["acquisition"] == "warm" and a2["stdout_tail"] == "hi\n" and b1["stdout_tail"] == "absent\n"
    assert fp.client("alice").get(f"/v1/jobs/{a1['job_id']}").json()["caller"] == "alice"
    assert fp.client("bob").get(f"/v1/jobs/{b1['job_id']}").json()["caller"] == "bob"
    for token in ("wrong-token", fp.tokens["alice"], tokens["mallory"]):
        r = httpx.post(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
                       json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status_code == 401, (token, r.status_code)


def test_a_browser_origin_named_with_cors_origin_is_served_and_any_other_is_refused(
        mcp_http: tuple[str, dict[str, str]]) -> None:
    url, tokens = mcp_http
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "browser", "version": "1"}}}

    def preflight(origin: str) -> httpx.Response:
        return httpx.options(url, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                           "Access-Control-Request-Headers": "authorization,content-type,"
                                                                             "mcp-protocol-version"})

    def post(origin: str) -> httpx.Response:
        return httpx.post(url, json=initialize, headers={"Origin": origin, "Authorization": f"Bearer {tokens['alice']}",
                                                        "Accept": "application/json, text/event-stream"})

    pre = preflight("https://inspector.example")  # carries no token: answered before the bearer check
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://inspector.example"
    assert "mcp-protocol-version" in pre.headers["access-control-allow-headers"].lower()
    ok = post("https://inspector.example")
    assert ok.status_code == 200 and ok.headers["mcp-session-id"]
    assert "mcp-session-id" in ok.headers["access-control-expose-headers"].lower()  # the page can read it
    assert preflight("https://evil.example").status_code == 400
    refused = post("https://evil.example")  # a page that somehow holds a token still gets nothing
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers


async def test_python_exec_over_streamable_http_keeps_live_objects_per_caller(
        fp: BrokerProcess, mcp_http: tuple[str, dict[str, str]]) -> None:
    url, tokens = mcp_http
    async with _http_client(url, tokens["alice"]) as alice, _http_client(url, tokens["bob"]) as bob:
        _text(await alice.call_tool("python_exec", {"code": "import threading\nlk = threading.Lock()\nlk.acquire()",
                                                    "session": "hp"}))
        used = _text(await alice.call_tool("python_exec", {"code": "lk.locked()", "session": "hp"}))
        other = _text(await bob.call_tool("python_exec", {"code": "'lk' in globals()", "session": "hp"}))
    assert used["result"] == "True" and other["result"] == "False"
    assert used["kernel_job_id"] != other["kernel_job_id"]


async def test_mcp_session_id_header_names_the_session_for_older_http_clients(
        mcp_http: tuple[str, dict[str, str]]) -> None:
    url, tokens = mcp_http
    async with _http_client(url, tokens["alice"], mode="legacy") as old:
        first = _text(await old.call_tool("run_in_sandbox", {"command": "echo x > kept"}))
        second = _text(await old.call_tool("run_in_sandbox", {"command": "cat kept"}))
    assert first["session"] == second["session"] and second["acquisition"] == "warm"
    assert second["stdout_tail"] == "x\n"
    async with _http_client(url, tokens["alice"]) as modern:
        one = _text(await modern.call_tool("run_in_sandbox", {"command": "true"}))
        two = _text(await modern.call_tool("run_in_sandbox", {"command": "true"}))
    # no protocol session and no `session` argument: each call gets a newly minted session, echoed back
    assert one["session"] != two["session"] and first["session"] not in (one["session"], two["session"])


async def test_the_broker_serves_the_mcp_server_at_mcp_with_its_own_tokens(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    fp = broker_factory("mounted", extra=("--mcp",))
    url = fp.url + "/mcp/"
    async with _http_client(url, fp.tokens["alice"]) as c:
        first = _text(await c.call_tool("run_in_sandbox", {"command": "echo m > f", "session": "mounted"}))
        second = _text(await c.call_tool("run_in_sandbox", {"command": "cat f", "session": "mounted"}))
    assert second["acquisition"] == "warm" and second["stdout_tail"] == "m\n"
    assert fp.client("alice").get(f"/v1/jobs/{first['job_id']}").json()["caller"] == "alice"
    r = httpx.post(url, headers={"Authorization": "Bearer nope", "Accept": "application/json, text/event-stream"},
                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status_code == 401
    assert fp.client("alice").get("/v1/nosuchroute").json()["error"]["class"] == "NotFound"


async def test_cancelling_a_call_over_stdio_cancels_its_job(fp: BrokerProcess) -> None:
    env = {**fp.env("alice"), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    http = fp.client()
    async with Client(StdioServerParameters(command="firepool", args=["mcp"], env=env)) as c:
        task = asyncio.ensure_future(c.call_tool("run_in_sandbox", {"command": "sleep 32", "session": "stdio-cancel"}))
        deadline = time.monotonic() + 30
        mine: list[dict[str, Any]] = []
        while not mine and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            mine = [j for j in http.get("/v1/jobs", params={"state": "RUNNING"}).json()["jobs"]
                    if j["lease_tag"] == "stdio-cancel"]
        assert mine, "the call never started its job"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        job = http.get(f"/v1/jobs/{mine[0]['id']}", params={"wait_s": 20}).json()
        assert job["state"] == "CANCELLED"
