"""The MCP layer without a broker: argument checking, session names, the sandbox helpers' framing, auth."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from broker.sandbox import wrappers
from mcp_server.identity import FileTokenVerifier, HttpBroker, KnownCallerVerifier
from mcp_server.protocol import file_path_of, file_uri, log_uri
from mcp_server.server import build_server


class NoBroker:
    """A broker that must never be reached: every case here fails before a job is submitted."""

    transport = "stdio"

    def client(self) -> tuple[str, Any]:
        raise AssertionError("the broker was called")

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(("tool", "args", "needle"), [
    ("run_in_sandbox", {"command": "true", "bogus": 1}, "unknown argument(s) 'bogus'"),
    ("run_in_sandbox", {"command": "true", "timeout_s": 0}, "timeout_s"),
    ("run_in_sandbox", {"command": "true", "env": {"A": 1}}, "env"),
    ("run_in_sandbox", {"command": "true", "session": "../etc"}, "not a valid session"),
    ("python_exec", {"code": ""}, "code"),
    ("write_files", {"files": []}, "files"),
    ("write_files", {"files": [{"path": "a"}]}, "exactly one"),
    ("write_files", {"files": [{"path": "a", "base64": "@@@"}]}, "not valid base64"),
    ("read_file", {"path": "a", "max_bytes": 0}, "max_bytes"),
    ("install_packages", {"packages": ["-e ."]}, "packages"),
    ("job_status", {"job_id": "j", "wait_s": 301}, "wait_s"),
    ("end_session", {"session": "x", "force": True}, "unknown argument(s) 'force'"),
    ("expose_port", {"port": 0}, "port"),
])
async def test_bad_arguments_are_tool_errors_before_anything_runs(tool: str, args: dict[str, Any],
                                                                   needle: str) -> None:
    async with Client(build_server(NoBroker())) as c:
        res = await c.call_tool(tool, args)
    assert res.is_error
    text = " ".join(b.text for b in res.content if b.type == "text")
    assert needle in text, text


async def test_every_tool_is_listed_with_truthful_annotations() -> None:
    async with Client(build_server(NoBroker())) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == {"run_in_sandbox", "python_exec", "job_status", "job_cancel", "write_files", "read_file",
                          "list_files", "install_packages", "sandbox_info", "end_session", "expose_port"}
    notes = {name: t.annotations for name, t in tools.items() if t.annotations is not None}
    for name in ("job_status", "read_file", "list_files", "sandbox_info", "expose_port"):
        assert notes[name].read_only_hint is True, name
    for name in ("end_session", "run_in_sandbox", "job_cancel", "python_exec"):
        assert notes[name].read_only_hint is False and notes[name].destructive_hint is True
    assert "session" in (tools["run_in_sandbox"].description or "").lower()
    assert (tools["run_in_sandbox"].output_schema or {})["properties"]["acquisition"]
    assert (tools["python_exec"].output_schema or {})["properties"]["kernel"]
    # Newer clients (the TypeScript SDK, VS Code) show the top-level title; older ones the annotations' one.
    assert all(t.title and t.annotations and t.annotations.title == t.title for t in tools.values())


async def test_an_unknown_tool_is_a_json_rpc_error_that_lists_the_tools() -> None:
    async with Client(build_server(NoBroker())) as c:
        with pytest.raises(MCPError) as caught:
            await c.call_tool("run_in_sandbx", {"command": "true"})
    assert caught.value.code == -32602 and "run_in_sandbox" in caught.value.message


def test_only_workspace_file_uris_name_a_path() -> None:
    assert file_path_of(file_uri("s1", "outputs/plot 1.png")) == "outputs/plot 1.png"
    assert file_path_of(log_uri("s1", "j1")) is None
    assert file_path_of("sandbox://s1/files/") is None


def test_the_helper_answer_line_survives_output_around_it() -> None:
    out = "noise\n" + wrappers.RESULT_MARK + json.dumps({"files": [1]}) + "\nmore noise\n"
    assert wrappers.parse_result(out) == {"files": [1]}
    assert wrappers.parse_result("no answer\n") is None


def test_the_artifact_block_is_split_off_stderr() -> None:
    err = "warning: x\n" + wrappers.ARTIFACTS_MARK + "\n12 plot.png\n3 dir/a b.csv\n"
    text, found = wrappers.split_artifacts(err)
    assert text == "warning: x\n" and found == [(12, "plot.png"), (3, "dir/a b.csv")]
    assert wrappers.split_artifacts("plain\n") == ("plain\n", [])


def test_large_helper_payloads_are_split_across_arguments() -> None:
    argv = wrappers.files_op("write", {"files": [{"path": "a", "text": "x" * 300_000}]})
    chunks = argv[argv.index(wrappers.FILES) + 2:]
    assert len(chunks) >= 4 and all(len(c) <= 96 * 1024 for c in chunks)
    assert json.loads("".join(chunks))["files"][0]["text"] == "x" * 300_000


async def test_http_tokens_verify_only_callers_the_server_can_act_for() -> None:
    broker = HttpBroker("http://broker", {"broker-secret": "alice"})
    verifier = KnownCallerVerifier({"mcp-a": "alice", "mcp-b": "bob"}, broker)
    access = await verifier.verify_token("mcp-a")
    assert access is not None and access.client_id == "alice" and access.token != "mcp-a"
    assert await verifier.verify_token("mcp-b") is None  # bob has no broker credential here
    assert await verifier.verify_token("broker-secret") is None
    assert await FileTokenVerifier({"t": "carol"}).verify_token("t") is not None


def test_broker_token_files_in_the_brokers_object_form_are_read_and_hashed_ones_refused(tmp_path: Path) -> None:
    from mcp_server.identity import read_broker_tokens

    f = tmp_path / "tokens.json"
    f.write_text('{"t1": "alice", "t2": {"caller": "ops", "admin": true}}')
    f.chmod(0o600)
    assert read_broker_tokens(f) == {"t1": "alice", "t2": "ops"}
    f.write_text('{"sha256:' + "0" * 64 + '": "alice"}')
    with pytest.raises(ValueError, match="stored hashed"):
        read_broker_tokens(f)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_broker_token_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    from broker.locations import InsecureFileError
    from mcp_server.identity import read_broker_tokens

    f = tmp_path / "broker-tokens.json"
    f.write_text('{"t1": "alice"}')
    f.chmod(mode)
    with pytest.raises(InsecureFileError, match=f"permissions {mode:04o} are too open"):
        read_broker_tokens(f)


async def test_client_token_files_may_hold_sha256_digests(tmp_path: Path) -> None:
    import hashlib

    from mcp_server.identity import read_client_tokens

    f = tmp_path / "tokens.json"
    digest = hashlib.sha256(b"mcp-a").hexdigest()
    f.write_text(json.dumps({f"sha256:{digest}": "alice", "mcp-b": {"caller": "bob"}}))
    broker = HttpBroker("http://broker", {"broker-a": "alice", "broker-b": "bob"})
    verifier = KnownCallerVerifier({}, broker, digests=read_client_tokens(f))
    alice, bob = await verifier.verify_token("mcp-a"), await verifier.verify_token("mcp-b")
    assert alice is not None and alice.client_id == "alice" and bob is not None and bob.client_id == "bob"
    assert await verifier.verify_token(f"sha256:{digest}") is None  # the digest itself is no token
