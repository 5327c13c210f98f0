"""The official E2B SDKs (`e2b`, `e2b-code-interpreter` from PyPI) against a real broker: an E2B sandbox is a
Firepool session on a warm pod of the template's pool, commands and files run beside its kernel, and
`run_code` runs on that kernel. No client of ours is involved."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import BrokerProcess

e2b = pytest.importorskip("e2b")
pytest.importorskip("e2b_code_interpreter")

pytestmark = pytest.mark.integration
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000 1f15c4890000000d49444154789c6360000002000105"
    "4e54a2c20000000049454e44ae426082".replace(" ", ""))).decode()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("e2b") / "broker", extra=("--gateway-cull-idle", "1"))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def as_alice(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> BrokerProcess:
    monkeypatch.setenv("E2B_API_URL", broker.url + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", broker.url + "/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", broker.tokens["alice"])
    return broker


def _pods_of(broker: BrokerProcess, sandbox_id: str) -> list[dict[str, Any]]:
    pods = broker.client("ops").get("/v1/pods").json()["pods"]
    return [p for p in pods if p.get("lease_tag") == sandbox_id and p.get("state") not in ("retiring", "gone")]


def test_a_sandbox_runs_commands_streams_output_and_keeps_files(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    sbx = Sandbox.create(template="cpu", timeout=120, envs={"GREETING": "hello"}, metadata={"run": "t1"})
    try:
        res = sbx.commands.run("echo $GREETING; pwd")
        assert res.exit_code == 0 and res.stdout.split() == ["hello", res.stdout.split()[1]]
        home = res.stdout.split()[1]
        sbx.files.write("notes.txt", "x1")
        assert sbx.files.read("notes.txt") == "x1"
        assert "notes.txt" in [e.name for e in sbx.files.list(".")]
        assert sbx.commands.run("cat notes.txt").stdout == "x1"
        assert sbx.commands.run(f"cat {home}/notes.txt").stdout == "x1"
        seen: list[tuple[float, str]] = []
        sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.3; done",
                         on_stdout=lambda s: seen.append((time.monotonic(), str(s))))
        assert "".join(s for _, s in seen) == "line1\nline2\nline3\n"
        assert seen[-1][0] - seen[0][0] > 0.4, "output arrived in one piece at the end, not as printed"
        with pytest.raises(SandboxException) as failed:
            sbx.commands.run("echo oops >&2; exit 3")
        assert failed.value.exit_code == 3 and "oops" in failed.value.stderr  # type: ignore[attr-defined]
        h = sbx.commands.run("sleep 60", background=True)
        began = time.monotonic()
        assert h.kill() is True
        assert time.monotonic() - began < 5
        deadline = time.monotonic() + 5
        while h.pid in [p.pid for p in sbx.commands.list()] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert h.pid not in [p.pid for p in sbx.commands.list()]
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.files.read("notes.txt") == "x1"
        assert sbx.is_running()
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    assert not sbx.is_running()
    with pytest.raises(SandboxException, match="not running|was not found|killed"):
        sbx.commands.run("true")


def test_another_caller_gets_no_access_to_a_sandbox(as_alice: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    sbx = Sandbox.create(template="cpu", timeout=60)
    try:
        monkeypatch.setenv("E2B_API_KEY", as_alice.tokens["bob"])
        with pytest.raises(SandboxException):
            Sandbox.connect(sbx.sandbox_id)
        assert Sandbox.kill(sbx.sandbox_id) is False
        assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
        stolen = httpx.post(as_alice.url + "/e2b/sandbox/process.Process/List", json={},
                            headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983",
                                     "X-Access-Token": "guess"})
        assert stolen.status_code == 401 and stolen.json()["code"] == "unauthenticated"
        monkeypatch.setenv("E2B_API_KEY", "not-a-token")
        with pytest.raises(Exception, match="401"):
            Sandbox.create(template="cpu")
    finally:
        monkeypatch.setenv("E2B_API_KEY", as_alice.tokens["alice"])
        sbx.kill()


def test_files_bytes_depth_exists_remove_rename_make_dir(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException

    with Sandbox.create(template="cpu", timeout=60) as sbx:
        blob = bytes(range(256)) * 64
        sbx.files.write("data/raw.bin", blob)
        assert sbx.files.read("data/raw.bin", format="bytes") == blob
        assert sbx.files.make_dir("data/a/b") is True
        assert sbx.files.make_dir("data/a/b") is False
        sbx.files.write("data/a/b/deep.txt", "deep")
        shallow = {e.path.split("/data/", 1)[1] for e in sbx.files.list("data")}
        assert shallow == {"raw.bin", "a"}
        deep = {e.path.split("/data/", 1)[1] for e in sbx.files.list("data", depth=3)}
        assert {"raw.bin", "a", "a/b", "a/b/deep.txt"} <= deep
        info = sbx.files.get_info("data/raw.bin")
        assert info.size == len(blob) and info.type.value == "file"
        assert sbx.files.exists("data/raw.bin") and not sbx.files.exists("data/nothing")
        moved = sbx.files.rename("data/raw.bin", "data/moved.bin")
        assert moved.name == "moved.bin" and not sbx.files.exists("data/raw.bin")
        sbx.files.remove("data/a")
        assert not sbx.files.exists("data/a/b/deep.txt")
        with pytest.raises(NotFoundException):
            sbx.files.read("data/a/b/deep.txt")


def test_stdin_list_and_connect_to_a_running_command(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="cpu", timeout=60) as sbx:
        h = sbx.commands.run("read a; echo got:$a; cat", background=True, stdin=True)
        assert h.pid in [p.pid for p in sbx.commands.list()]
        sbx.commands.send_stdin(h.pid, "one\n")
        sbx.commands.send_stdin(h.pid, "two\n")
        sbx.commands.close_stdin(h.pid)
        assert h.wait().stdout == "got:one\ntwo\n"
        slow = sbx.commands.run("sleep 0.5; echo late", background=True)
        slow.disconnect()  # the process goes on without a reader
        joined = sbx.commands.connect(slow.pid)
        assert joined.wait().stdout == "late\n"


async def test_the_async_sdk_runs_commands_and_files(as_alice: BrokerProcess) -> None:
    from e2b import AsyncSandbox

    sbx = await AsyncSandbox.create(template="cpu", timeout=60)
    try:
        out: list[str] = []
        res = await sbx.commands.run("echo a; echo b >&2", on_stdout=lambda s: out.append(str(s)))
        assert res.stdout == "a\n" and res.stderr == "b\n" and out == ["a\n"]
        await sbx.files.write("b.bin", b"\x00\x01")
        assert await sbx.files.read("b.bin", format="bytes") == b"\x00\x01"
        h = await sbx.commands.run("sleep 30", background=True)
        assert await h.kill() is True
        info = await sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id and info.template_id == "cpu"
    finally:
        assert await sbx.kill() is True


def test_list_get_info_and_set_timeout(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox, SandboxQuery

    a = Sandbox.create(template="cpu", timeout=60, metadata={"team": "x"})
    b = Sandbox.create(template="cpu", timeout=60, metadata={"team": "y"})
    try:
        only_x = Sandbox.list(query=SandboxQuery(metadata={"team": "x"})).next_items()
        assert [s.sandbox_id for s in only_x] == [a.sandbox_id]
        pages = Sandbox.list(limit=1)
        first = pages.next_items()
        assert len(first) == 1 and pages.has_next
        second = pages.next_items()
        assert {first[0].sandbox_id, second[0].sandbox_id} == {a.sandbox_id, b.sandbox_id}
        info = a.get_info()
        assert info.metadata == {"team": "x"} and info.state.value == "running"
        before = info.end_at
        a.set_timeout(600)
        assert (a.get_info().end_at - before).total_seconds() > 500
    finally:
        a.kill()
        b.kill()


def test_a_sandbox_whose_timeout_passes_ends_and_its_pod_goes(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox

    sbx = Sandbox.create(template="cpu", timeout=1)
    sbx.files.write("secret.txt", "s")
    assert _pods_of(as_alice, sbx.sandbox_id)
    deadline = time.monotonic() + 15
    while sbx.is_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not sbx.is_running()
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
    deadline = time.monotonic() + 15
    while _pods_of(as_alice, sbx.sandbox_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pods_of(as_alice, sbx.sandbox_id)
    fresh = Sandbox.create(template="cpu", timeout=30)
    try:
        assert not fresh.files.exists("secret.txt")
    finally:
        fresh.kill()


def test_run_code_keeps_state_reports_errors_and_images(as_alice: BrokerProcess) -> None:
    from e2b_code_interpreter import Sandbox  # type: ignore[import-untyped]

    with Sandbox.create(template="cpu", timeout=60) as ci:
        assert ci.run_code("x = 41").text is None
        assert ci.run_code("x + 1").text == "42"
        logs: list[str] = []
        ex = ci.run_code("print('hi'); import sys; print('e', file=sys.stderr)", on_stdout=lambda m: logs.append(m.line))
        assert ex.logs.stdout == ["hi\n"] and ex.logs.stderr == ["e\n"] and logs == ["hi\n"]
        err = ci.run_code("1/0")
        assert err.error is not None and err.error.name == "ZeroDivisionError"
        img = ci.run_code(f"from IPython.display import Image, display; import base64\n"
                          f"display(Image(data=base64.b64decode('{PNG}')))")
        assert img.results and img.results[0].png
        assert [c.id for c in ci.list_code_contexts()] == ["python"]
        headers = {"E2b-Sandbox-Id": ci.sandbox_id, "E2b-Sandbox-Port": "49999",
                   "X-Access-Token": str(ci._envd_access_token)}
        with pytest.raises(httpx.ReadTimeout), httpx.stream(  # a client that gives up mid-execution
                "POST", as_alice.url + "/e2b/sandbox/execute", json={"code": "import time; time.sleep(2)"},
                headers=headers, timeout=httpx.Timeout(5, read=0.5)) as r:
            r.read()
        assert ci.run_code("x + 2").text == "43"  # the dropped stream let go of the kernel
        ci.files.write("from_files.txt", "z")
        assert ci.run_code("open('from_files.txt').read()").text == "'z'"


def test_what_firepool_does_not_do_is_501(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="cpu", timeout=30) as sbx:
        key = {"X-API-KEY": as_alice.tokens["alice"]}
        for method, path in (("POST", f"/sandboxes/{sbx.sandbox_id}/pause"), ("POST", f"/sandboxes/{sbx.sandbox_id}/snapshots"),
                             ("GET", f"/sandboxes/{sbx.sandbox_id}/metrics"), ("GET", "/templates")):
            r = httpx.request(method, as_alice.url + "/e2b" + path, headers=key, json={})
            assert r.status_code == 501 and "not supported by Firepool" in r.json()["message"], (path, r.text)
        with pytest.raises(Exception, match="501"):
            sbx.pause()
    bad = httpx.post(as_alice.url + "/e2b/v2/sandboxes", headers=key, json={"templateID": "nope"})
    assert bad.status_code == 400 and "unknown template" in bad.json()["message"]


def test_firepool_e2b_env_prints_the_two_urls(as_alice: BrokerProcess, tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "broker.cli", "e2b", "env"], env=as_alice.env("alice"),
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert f"export E2B_API_URL={as_alice.url}/e2b" in out
    assert f"export E2B_SANDBOX_URL={as_alice.url}/e2b/sandbox" in out
    assert f"export E2B_API_KEY={as_alice.tokens['alice']}" in out


def test_stream_input_feeds_a_running_command(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="cpu", timeout=30) as sbx:
        h = sbx.commands.run("head -c 6", background=True, stdin=True)
        sbx.commands.stream_input(h.pid, iter([b"abc", b"def"]))
        assert h.wait().stdout == "abcdef"


def test_a_restarted_broker_adopts_its_sandboxes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2b import Sandbox

    b = BrokerProcess(tmp_path / "restarted")
    try:
        monkeypatch.setenv("E2B_API_URL", b.url + "/e2b")
        monkeypatch.setenv("E2B_SANDBOX_URL", b.url + "/e2b/sandbox")
        monkeypatch.setenv("E2B_API_KEY", b.tokens["alice"])
        sbx = Sandbox.create(template="cpu", timeout=120, metadata={"kept": "yes"})
        sbx.files.write("kept.txt", "still here")
        b.kill()
        b.start()
        assert sbx.files.read("kept.txt") == "still here"  # the old access token still works
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("cat kept.txt").stdout == "still here"
        assert again.get_info().metadata == {"kept": "yes"}
        assert sbx.kill() is True
    finally:
        b.stop()


def test_get_host_reaches_a_sandbox_port_through_the_port_proxy(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from e2b import Sandbox

    b = BrokerProcess(tmp_path / "ports", extra=("--port-domain", "ports.test"))
    try:
        monkeypatch.setenv("E2B_API_URL", b.url + "/e2b")
        monkeypatch.setenv("E2B_SANDBOX_URL", b.url + "/e2b/sandbox")
        monkeypatch.setenv("E2B_API_KEY", b.tokens["alice"])
        with Sandbox.create(template="cpu", timeout=60) as sbx:
            sbx.files.write("site/index.html", "served")
            sbx.commands.run("cd site && python3 -m http.server 8000", background=True)
            host = sbx.get_host(8000)
            assert host == f"8000-{sbx.sandbox_id}.ports.test"
            deadline, got = time.monotonic() + 20, None
            while time.monotonic() < deadline:
                got = httpx.get(b.url + "/index.html", headers={"Host": host,
                                                                "Authorization": f"Bearer {b.tokens['alice']}"})
                if got.status_code == 200:
                    break
                time.sleep(0.2)
            assert got is not None and got.status_code == 200 and got.text == "served"
            other = httpx.get(b.url + "/index.html", headers={"Host": host,
                                                              "Authorization": f"Bearer {b.tokens['bob']}"})
            assert other.status_code == 404
    finally:
        b.stop()


def test_a_pty_runs_an_interactive_shell(as_alice: BrokerProcess) -> None:
    from e2b import PtySize, Sandbox

    with Sandbox.create(template="cpu", timeout=60) as sbx:
        pty = sbx.pty.create(size=PtySize(rows=24, cols=80), envs={"MARK": "pty-ok"})
        assert pty.pid in [p.pid for p in sbx.commands.list()]
        sbx.pty.resize(pty.pid, PtySize(rows=30, cols=100))
        sbx.pty.send_stdin(pty.pid, b"stty size; echo $MARK; exit 7\n")
        seen: list[bytes] = []
        with pytest.raises(Exception) as ended:  # exit 7: CommandExitException
            pty.wait(on_pty=lambda data: seen.append(bytes(data)))
        text = b"".join(seen).decode(errors="replace")
        assert "30 100" in text and "pty-ok" in text, text
        assert getattr(ended.value, "exit_code", None) == 7
        other = sbx.pty.create(size=PtySize(rows=24, cols=80))
        assert sbx.pty.kill(other.pid) is True


def test_the_gateways_idle_culling_leaves_a_sandboxs_kernel_alone(as_alice: BrokerProcess) -> None:
    from e2b_code_interpreter import Sandbox  # type: ignore[import-untyped]

    with Sandbox.create(template="cpu", timeout=60) as ci:  # the module's broker culls after 1 s idle
        ci.run_code("y = 5")
        time.sleep(3)
        assert ci.run_code("y").text == "5"
        assert ci.is_running()


def test_watch_dir_reports_creates_writes_and_removes(as_alice: BrokerProcess) -> None:
    from e2b import FilesystemEventType, Sandbox

    with Sandbox.create(template="cpu", timeout=60) as sbx:
        sbx.files.make_dir("w")
        handle = sbx.files.watch_dir("w")
        sbx.files.write("w/a.txt", "1")
        time.sleep(0.4)
        sbx.files.write("w/a.txt", "22")
        time.sleep(0.4)
        sbx.files.remove("w/a.txt")
        seen: list[tuple[str, str]] = []
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            seen += [(e.name, e.type.name) for e in handle.get_new_events()]
            time.sleep(0.1)
        handle.stop()
        assert seen[:3] == [("a.txt", FilesystemEventType.CREATE.name), ("a.txt", FilesystemEventType.WRITE.name),
                            ("a.txt", FilesystemEventType.REMOVE.name)], seen


async def test_the_async_sdk_streams_watch_events(as_alice: BrokerProcess) -> None:
    import asyncio

    from e2b import AsyncSandbox

    sbx = await AsyncSandbox.create(template="cpu", timeout=60)
    try:
        seen: list[str] = []
        handle = await sbx.files.watch_dir(".", on_event=lambda e: seen.append(e.name), recursive=True)
        await sbx.files.write("deep/er/file.txt", "x")
        for _ in range(50):
            if "deep/er/file.txt" in seen:
                break
            await asyncio.sleep(0.1)
        await handle.stop()
        assert "deep/er/file.txt" in seen, seen
    finally:
        await sbx.kill()


def test_signed_file_urls_download_and_upload_without_headers(as_alice: BrokerProcess) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="cpu", timeout=60) as sbx:
        sbx.files.write("pub/report.txt", "numbers")
        url = sbx.download_url("pub/report.txt", use_signature_expiration=60)
        assert url.startswith(as_alice.url + "/files?")
        got = httpx.get(url)
        assert got.status_code == 200 and got.text == "numbers"
        assert httpx.get(url.replace("report.txt", "other.txt")).status_code == 401  # signed for one path
        up = sbx.upload_url("pub/up.bin")
        put = httpx.post(up, files={"file": ("pub/up.bin", b"\x00\x01", "application/octet-stream")})
        assert put.status_code == 200, put.text
        assert sbx.files.read("pub/up.bin", format="bytes") == b"\x00\x01"
    assert httpx.get(url).status_code == 401  # the sandbox ended
