"""MCP file tools, `cwd` and resources stay inside the session's workspace (docs/mcp.md): a path that is absolute or
climbs out is a tool error before any job runs; a resource that is not the caller's (or not there) is the protocol's
resource-not-found error, with no sandbox started to look; a text file reads back as `text`."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from broker.errors import NotFound
from broker.sandbox import wrappers
from broker.sandbox.calls import CallOutcome, Calls
from broker.sandbox.paths import OutsideWorkspace, inside_workspace
from mcp_server.resources import RESOURCE_NOT_FOUND
from mcp_server.server import build_server


class FakeClient:
    """Alice's broker client: her pods are `pods`; no job of hers exists; nothing may be submitted."""

    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self._pods = pods or []

    async def get(self, job_id: str, wait_s: float = 0.0) -> Any:
        raise NotFound(f"no job {job_id}")  # what the broker answers for another caller's job

    async def pods(self, pool: str | None = None) -> list[dict[str, Any]]:
        return list(self._pods)

    async def whoami(self) -> str:
        return "alice"

    async def submit(self, *args: Any, **kw: Any) -> Any:
        raise AssertionError("no job may be submitted")


class FakeBroker:
    transport = "stdio"

    def __init__(self, client: FakeClient, label: str = "alice") -> None:
        self._client = client
        self._label = label

    def client(self) -> tuple[str, Any]:
        return self._label, self._client

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "..", "/", "a\x00b"])
def test_absolute_paths_and_climbing_out_are_refused(path: str) -> None:
    with pytest.raises(OutsideWorkspace):
        inside_workspace(path)


@pytest.mark.parametrize("path", ["a.txt", "outputs/plot.png", "a/../b", ".", "./x", "..a", "a/..b", "~x"])
def test_paths_inside_the_workspace_are_kept(path: str) -> None:
    assert inside_workspace(path) == path


@pytest.mark.parametrize(("tool", "args"), [
    ("write_files", {"files": [{"path": "../escape.txt", "text": "x"}]}),
    ("write_files", {"files": [{"path": "ok.txt", "text": "x"}, {"path": "/tmp/abs.txt", "text": "x"}]}),
    ("read_file", {"path": "/etc/passwd"}),
    ("read_file", {"path": "../../etc/passwd"}),
    ("list_files", {"path": "/"}),
    ("list_files", {"path": ".."}),
    ("run_in_sandbox", {"command": "pwd", "cwd": "/etc"}),
    ("run_in_sandbox", {"command": "pwd", "cwd": "../.."}),
])
async def test_file_tools_and_cwd_refuse_paths_outside_the_workspace_before_any_job(tool: str,
                                                                                  args: dict[str, Any]) -> None:
    async with Client(build_server(FakeBroker(FakeClient()), pool="cpu")) as c:
        res = await c.call_tool(tool, {**args, "session": "s1"})
    assert res.is_error
    text = " ".join(b.text for b in res.content if b.type == "text")
    assert "absolute" in text or "leaves the workspace" in text, text


def _helper(ws: Path, op: str, args: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The sandbox's file helper, run in this process (its code is a plain `python3 -c` script)."""
    monkeypatch.setenv("FIREPOOL_WORKSPACE", str(ws))
    monkeypatch.setattr(sys, "argv", ["-c", op, json.dumps(args)])
    with pytest.raises(SystemExit):
        exec(compile(wrappers.FILES, "<files>", "exec"), {"__name__": "__main__"})
    return wrappers.parse_result(capsys.readouterr().out) or {}


def test_the_sandbox_helper_refuses_a_symlink_out_of_the_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("not yours")
    (ws / "link").symlink_to(tmp_path / "secret.txt")
    (ws / "mine.txt").write_text("mine")
    got = _helper(ws, "read", {"files": [{"path": "link"}]}, monkeypatch, capsys)
    assert got.get("error") == "OutsideWorkspace"
    got = _helper(ws, "write", {"files": [{"path": "link", "text": "planted"}]}, monkeypatch, capsys)
    assert got.get("error") == "OutsideWorkspace" and (tmp_path / "secret.txt").read_text() == "not yours"
    got = _helper(ws, "read", {"files": [{"path": "mine.txt"}]}, monkeypatch, capsys)
    assert base64.b64decode(got["files"][0]["base64"]) == b"mine"


@pytest.mark.parametrize("uri", [
    "sandbox://s1/jobs/job-of-bob/log",        # another caller's job: the broker says 404
    "sandbox://bobs-session/files/notes.txt",  # a session alice has no sandbox for
    "sandbox://s1/files/../../etc/passwd",     # outside the workspace
])
@pytest.mark.parametrize("label", ["alice", ""])  # the HTTP server's verified caller; stdio's (none: whoami)
async def test_another_callers_or_a_missing_resource_is_resource_not_found(uri: str, label: str) -> None:
    # As an admin caller sees them: bob's pod of his session too.
    client = FakeClient(pods=[{"lease_tag": "s1", "queue": "default", "caller": "alice"},
                              {"lease_tag": "bobs-session", "queue": "default", "caller": "bob"}])
    async with Client(build_server(FakeBroker(client, label), pool="cpu")) as c:
        with pytest.raises(MCPError) as caught:
            await c.read_resource(uri)
    assert caught.value.code == RESOURCE_NOT_FOUND, caught.value


async def test_a_text_file_resource_reads_back_as_text_and_an_image_as_a_blob(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {"notes.txt": b"mine\n", "Makefile": b"all:\n", "plot.png": b"\x89PNG\r\n", "data.bin": b"\xff\x00"}

    async def helper(self: Calls, op: str, args: dict[str, Any], session: str, **kw: Any
                     ) -> tuple[dict[str, Any], CallOutcome | None]:
        data = files[args["files"][0]["path"]]
        return {"files": [{"path": "x", "size": len(data), "base64": base64.b64encode(data).decode()}]}, None

    monkeypatch.setattr(Calls, "helper", helper)
    client = FakeClient(pods=[{"lease_tag": "s1", "queue": "default", "caller": "alice"}])
    async with Client(build_server(FakeBroker(client, ""), pool="cpu")) as c:  # over stdio
        got = {name: (await c.read_resource(f"sandbox://s1/files/{name}")).contents[0] for name in files}
    assert getattr(got["notes.txt"], "text", None) == "mine\n" and got["notes.txt"].mime_type == "text/plain"
    assert getattr(got["Makefile"], "text", None) == "all:\n" and got["Makefile"].mime_type == "text/plain"
    assert getattr(got["plot.png"], "blob", None) and got["plot.png"].mime_type == "image/png"
    assert getattr(got["data.bin"], "blob", None)
