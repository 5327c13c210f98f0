"""The MCP server driven by a client nobody here wrote: the official TypeScript SDK (what Claude Desktop, Cursor
and the MCP Inspector use), over stdio as a user's MCP config launches `firepool mcp` and over streamable HTTP.

tests/integration/mcp_ts/drive.mjs does the talking and prints what it saw as JSON; these tests assert on it.
The TS client validates every structured result against the tool's outputSchema and compiles the schemas with
its own JSON Schema validator, so a schema the Python SDK is happy with but other clients refuse fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import BrokerProcess, node_client
from tests.integration.test_mcp import mcp_http, pod_of  # noqa: F401 - a fixture shared with the Python-client tests

pytestmark = pytest.mark.integration

CLIENT_DIR = Path(__file__).parent / "mcp_ts"
TOOLS = {"run_in_sandbox", "python_exec", "job_status", "job_cancel", "write_files", "read_file", "list_files",
         "install_packages", "sandbox_info", "end_session", "expose_port"}


@pytest.fixture(scope="module")
def fp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for every transport: stdio and `firepool mcp --http` reach it over REST, and it also serves
    the MCP server itself at /mcp/ (`firepool serve --mcp`)."""
    broker = BrokerProcess(tmp_path_factory.mktemp("mcpts") / "broker", extra=("--mcp",))
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def node() -> str:
    return node_client(CLIENT_DIR, "@modelcontextprotocol/sdk")


def drive(node: str, config: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([node, str(CLIENT_DIR / "drive.mjs"), json.dumps(config)], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"], report.get("error")
    return report


def assert_a_full_conversation(fp: BrokerProcess, report: dict[str, Any]) -> None:
    """What any conforming client must see, whatever the transport."""
    init = report["initialize"]
    assert init["protocol_version"] == "2025-11-25"  # the newest the TS SDK offers: we speak it
    assert init["server_info"]["name"] == "firepool" and init["server_info"]["version"]
    assert {"tools", "resources"} <= set(init["capabilities"]) and init["has_instructions"]

    assert set(report["tools"]) == TOOLS and report["schema_problems"] == {}
    # Newer clients show the top-level title, older ones the annotations' one: both are there and agree.
    assert all(t["title"] and t["annotations"]["title"] == t["title"] for t in report["tools"].values())
    assert report["tools"]["run_in_sandbox"]["required"] == ["command"]
    assert report["tools"]["run_in_sandbox"]["has_output_schema"]
    assert report["tools"]["read_file"]["annotations"]["readOnlyHint"] is True

    a = report["conversations"]["a"]
    assert a["first"]["session"] == a["second"]["session"] and a["first"]["stdout_tail"] == "one\n"
    assert a["second"]["stdout_tail"] == "kept\n" and a["second"]["acquisition"] == "warm"
    assert report["python"]["first"]["structured"]["status"] == "ok"
    assert report["python"]["second"]["structured"]["result"] == "42"

    b = report["conversations"]["b"]["first"]
    assert b["stdout_tail"] == "absent\n" and b["session"] != a["first"]["session"]
    assert pod_of(fp, b["job_id"]) != pod_of(fp, a["second"]["job_id"])

    errors = report["errors"]
    for case in ("negative_timeout", "missing_command", "wrong_type", "unknown_argument", "bad_session",
                 "missing_file"):
        assert errors[case].get("is_error") is True, (case, errors[case])
    assert "timeout_s" in errors["negative_timeout"]["text"] and "command" in errors["missing_command"]["text"]
    assert "bogus" in errors["unknown_argument"]["text"] and "no such file" in errors["missing_file"]["text"]
    assert errors["unknown_tool"]["rpc_error"]["code"] == -32602, errors["unknown_tool"]
    assert report["after_errors"]["stdout_tail"] == "alive\n"

    progress = report["progress"]
    assert progress["result"]["stdout_tail"] == "step-one\ndone\n"
    assert any("step-one" in (p.get("message") or "") for p in progress["notifications"]), progress
    values = [p["progress"] for p in progress["notifications"]]
    assert values == sorted(values) and len(set(values)) == len(values)  # the spec: progress increases

    tools = report["tool_calls"]  # each result passed the SDK's outputSchema check, or the call threw
    assert {name: r.get("is_error") for name, r in tools.items()} == dict.fromkeys(tools, False), tools
    assert tools["write_files"]["structured"]["written"] == [{"path": "src/a.txt", "bytes": 6},
                                                             {"path": "dot.png", "bytes": 70}]
    assert tools["read_text"]["structured"]["text"] == "hello\n"
    assert tools["read_image"]["content_types"] == ["text", "image"] and tools["read_image"]["structured"]["base64"]
    assert "src/a.txt" in {e["path"] for e in tools["list_files"]["structured"]["entries"]}
    assert tools["outputs"]["content_types"] == ["text", "image", "resource_link"]
    assert [p["package"] for p in tools["install_packages"]["structured"]["already_present"]] == ["pip"]
    assert tools["sandbox_info"]["structured"]["session"] == "ts-tools"
    assert tools["job_status"]["structured"]["state"] in ("QUEUED", "RUNNING")
    # A running job's cancel is a request its attempt answers; a job still queued (a loaded machine) is cancelled at once.
    cancelled = tools["job_cancel"]["structured"]
    assert cancelled["cancel_requested"] is True or cancelled["state"] == "CANCELLED", cancelled
    assert tools["end_session"]["structured"]["session"] == "ts-tools"

    cancel = report["cancel"]  # the user pressed stop 3 s into `sleep 33`
    assert cancel["outcome"].startswith("rejected") and cancel["ms"] < 10_000, cancel
    assert cancel["sleepers_left"] == "0" and cancel["after"]["acquisition"] == "warm", cancel
    jobs = fp.client().get("/v1/jobs", params={"state": "CANCELLED"}).json()["jobs"]
    assert [j["lease_tag"] for j in jobs].count(cancel["session"]) == 1

    resources = report["resources"]
    assert set(resources["templates"]) == {"sandbox://{session}/jobs/{job_id}/log", "sandbox://{session}/files/{+path}"}
    assert resources["log"][0]["text"] == "one\n" and resources["log"][0]["mime_type"] == "text/plain"
    # A text file reads back as text (not a blob), with its own MIME type.
    assert resources["file"][0]["text"] == "a,b\n" and resources["file"][0]["mime_type"] == "text/csv"


def test_the_typescript_sdk_over_stdio_holds_a_whole_conversation(node: str, fp: BrokerProcess) -> None:
    firepool = Path(sys.executable).parent / "firepool"
    env = {"FIREPOOL_URL": fp.url, "FIREPOOL_TOKEN": fp.tokens["alice"]}
    report = drive(node, {"transport": "stdio", "command": str(firepool), "args": ["mcp"], "env": env})
    assert_a_full_conversation(fp, report)
    # The client ends the server's stdin: the server exits by itself, before the SDK's SIGTERM at 2 s.
    for closed in report["close"].values():
        assert closed["exit_code"] == 0 and closed["signal"] is None and closed["ms"] < 2000, closed


def test_the_typescript_sdk_over_streamable_http_holds_a_whole_conversation(
        node: str, fp: BrokerProcess, mcp_http: tuple[str, dict[str, str]]) -> None:  # noqa: F811
    url, tokens = mcp_http
    report = drive(node, {"transport": "http", "url": url, "token": tokens["alice"]})
    assert_a_full_conversation(fp, report)
    assert_streamable_http_by_the_spec(report)


def test_the_typescript_sdk_reaches_the_brokers_own_mcp_endpoint_with_or_without_the_slash(
        node: str, fp: BrokerProcess) -> None:
    # `/mcp` as users type it: served where it is, not redirected to `/mcp/` (a 307 on every message)
    report = drive(node, {"transport": "http", "url": fp.url + "/mcp", "token": fp.tokens["alice"]})
    assert_a_full_conversation(fp, report)
    assert_streamable_http_by_the_spec(report)
    assert [x for x in report["http"] if x["status"] in (301, 302, 307, 308)] == []


def assert_streamable_http_by_the_spec(report: dict[str, Any]) -> None:
    """Session id issued at initialize and honoured, protocol version header on every later request, POST
    answers as SSE or JSON, DELETE ends the session, and the ended session is 404 afterwards."""
    init = report["initialize"]
    assert init["session_id"] and init["transport_protocol_version"] == "2025-11-25"
    exchanges = report["http"]
    after_init = [x for x in exchanges if x["rpc"] not in ("initialize", None) and x["method"] == "POST"]
    assert all(x["sent_protocol_version"] == "2025-11-25" for x in after_init)
    assert all(x["status"] in (200, 202) for x in exchanges if x["method"] == "POST"), exchanges
    calls = [x for x in exchanges if x["rpc"] == "tools/call"]
    assert all(x["content_type"].split(";")[0] in ("text/event-stream", "application/json") for x in calls)
    deletes = [x for x in exchanges if x["method"] == "DELETE"]
    assert [x["status"] for x in deletes] == [200, 200], deletes
    assert report["stale_session_status"] == 404
