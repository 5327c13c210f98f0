"""The SDK's `Sandbox` against a real broker and real sandboxes: commands streamed as they print (as jobs, and
beside the session's live kernel), stdin, cwd, timeouts, files both ways, a live kernel with rich outputs,
ending and keeping a session; and the REST surface behind it (`POST /v1/sessions/{tag}/commands`)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import AsyncClient, Client
from broker.errors import InvalidRequest, NotFound
from broker.sandbox.results import CodeFailed, CommandFailed
from tests.integration.conftest import BrokerProcess

pytestmark = pytest.mark.integration

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-not-really-an-image").decode()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("sandbox-sdk") / "state")
    try:
        yield b
    finally:
        b.stop()


def client(broker: BrokerProcess, caller: str = "alice") -> Client:
    return Client(broker.url, broker.tokens[caller])


def test_a_commands_output_streams_while_it_runs_and_comes_back_whole(broker: BrokerProcess) -> None:
    seen: list[tuple[float, str]] = []
    with client(broker) as fp, fp.sandbox("stream") as sb:
        t0 = time.monotonic()
        r = sb.run("echo first; sleep 2; echo second; echo oops >&2; exit 3",
                   on_stdout=lambda t: seen.append((time.monotonic() - t0, t)))
    assert (r.exit_code, r.stdout, r.stderr, r.error_class, r.ok) == (3, "first\nsecond\n", "oops\n", "NonZeroExit", False)
    first = next(at for at, text in seen if "first" in text)
    second = next(at for at, text in seen if "second" in text)
    assert second - first > 1.0, seen  # seen before the command slept, not at its end (however busy the machine)
    assert "".join(t for _, t in seen) == "first\nsecond\n"


def test_stdin_cwd_env_timeout_and_check(broker: BrokerProcess) -> None:
    with client(broker) as fp, fp.sandbox("inputs") as sb:
        sb.run("mkdir -p sub/dir")
        assert sb.run(["wc", "-c"], stdin=b"\x00\xff\n").stdout.strip() == "3"
        assert sb.run(["wc", "-c"], stdin=b"y" * 400_000).stdout.strip() == "400000"  # past one argument's 128 KiB
        with pytest.raises(InvalidRequest, match="stdin holds at most"):
            sb.run(["wc", "-c"], stdin=b"y" * (1 << 20))
        assert sb.run("pwd; echo $GREETING", cwd="sub/dir", env={"GREETING": "hi"}).stdout.endswith("/sub/dir\nhi\n")
        slow = sb.run("echo started; sleep 30", timeout=1)
        assert slow.timed_out and slow.exit_code == 137 and slow.stdout == "started\n"
        with pytest.raises(CommandFailed, match="exit code 7"):
            sb.run("exit 7", check=True)
        assert sb.run("true", check=True).ok


def test_files_round_trip_text_bytes_and_trees_and_refuse_paths_outside(broker: BrokerProcess, tmp_path: Path) -> None:
    big = bytes(range(256)) * 5000  # 1.28 MB: more than one helper call each way
    with client(broker) as fp, fp.sandbox("files") as sb:
        assert sb.files.write("notes/a.txt", "héllo") == len("héllo".encode())
        sb.files.write("blob.bin", big)
        assert sb.files.read("notes/a.txt") == "héllo"
        assert sb.files.read("blob.bin", format="bytes") == big
        assert sb.run("cat notes/a.txt").stdout == "héllo"
        assert {(e.path, e.type) for e in sb.files.list()} >= {("notes", "dir"), ("blob.bin", "file")}
        assert [e.name for e in sb.files.list("notes")] == ["a.txt"]
        src = tmp_path / "src"
        (src / "pkg").mkdir(parents=True)
        (src / "pkg" / "m.py").write_text("X = 1\n")
        (src / "top.txt").write_text("top")
        assert sb.files.upload(src, to="up") == 9
        assert sb.run("cat up/pkg/m.py up/top.txt").stdout == "X = 1\ntop"
        assert sb.files.download("up", tmp_path / "back") == 9
        assert (tmp_path / "back" / "pkg" / "m.py").read_text() == "X = 1\n"
        sb.files.remove("notes", "blob.bin")
        assert not sb.files.exists("notes") and sb.files.exists("up/top.txt")
        with pytest.raises(NotFound):
            sb.files.read("notes/a.txt")
        with pytest.raises(InvalidRequest):
            sb.files.write("../escape.txt", "x")
        with pytest.raises(InvalidRequest):
            sb.files.read("/etc/passwd")


def test_run_code_keeps_state_shows_rich_output_and_commands_run_beside_it(broker: BrokerProcess) -> None:
    seen: list[str] = []
    with client(broker) as fp, fp.sandbox("kernel") as sb:
        sb.files.write("data.txt", "41")
        assert sb.run_code("x = int(open('data.txt').read())").error is None
        r = sb.run_code("print('side'); x + 1")
        assert (r.text, r.stdout) == ("42", "side\n")
        shown = sb.run_code(f"from IPython.display import display; display({{'image/png': {PNG!r}, "
                            "'text/plain': 'img'}, raw=True)")
        assert shown.images == [base64.b64decode(PNG)]
        err = sb.run_code("1/0")
        assert err.error is not None and err.error.name == "ZeroDivisionError" and "1/0" in err.error.traceback
        with pytest.raises(CodeFailed, match="ZeroDivisionError"):
            sb.run_code("1/0", check=True)
        slow = sb.run_code("import time; time.sleep(30)", timeout=1)
        assert slow.timed_out and sb.run_code("x").text == "41"  # interrupted; the kernel and its state stay
        # The kernel holds the session's pod: a command runs as its subprocess, same workspace, still streamed.
        beside = sb.run("echo one; sleep 1; cat data.txt >&2; echo two", on_stdout=seen.append, stdin="ignored")
        assert (beside.exit_code, beside.stdout, beside.stderr) == (0, "one\ntwo\n", "41")
        assert seen[0] == "one\n" and beside.job_id == sb.run_code("import os; os.environ['FIREPOOL_JOB_ID']").text.strip("'")
        assert sb.run(["cat"], stdin="through the kernel").stdout == "through the kernel"
        assert sb.run("pwd", cwd=".firepool").stdout.strip().endswith("/.firepool")


def test_leaving_ends_the_session_unless_kept_and_a_kept_namespace_comes_back(broker: BrokerProcess) -> None:
    with client(broker) as fp:
        with fp.sandbox("ends") as sb:
            sb.run("echo x > mark")
        assert not [p for p in fp.pods() if p.get("tag") == "ends" and p.get("state") in ("idle", "running")]
        with fp.sandbox("kept", keep=True) as sb:
            sb.run_code("y = 'remembered'")
            sb.files.write("mark", "here")
        with fp.sandbox("kept") as sb:
            assert sb.files.read("mark") == "here"
            assert sb.run_code("y").text == "'remembered'"


def test_another_caller_naming_the_same_session_gets_a_sandbox_of_its_own(broker: BrokerProcess) -> None:
    with client(broker, "alice") as a, client(broker, "bob") as b, a.sandbox("shared-name") as sa, \
            b.sandbox("shared-name") as sb:
        sa.files.write("secret.txt", "alice's")
        assert not sb.files.exists("secret.txt")


def test_the_async_sandbox_streams_to_async_callbacks(broker: BrokerProcess) -> None:
    async def main() -> tuple[list[str], str]:
        got: list[str] = []

        async def on_stdout(text: str) -> None:
            await asyncio.sleep(0)
            got.append(text)

        async with AsyncClient(broker.url, broker.tokens["alice"]) as fp, fp.sandbox("async") as sb:
            r = await sb.run("echo a; echo b", on_stdout=on_stdout)
            await sb.files.write("f", b"\x01")
            return got, r.stdout + str(await sb.files.read("f", format="bytes")) + str((await sb.run_code("6*7")).text)

    got, out = asyncio.run(main())
    assert "".join(got) == "a\nb\n" and out == "a\nb\nb'\\x01'42"


def test_the_rest_surface_streams_ndjson_and_a_client_that_leaves_cancels_its_command(broker: BrokerProcess) -> None:
    c = broker.client()
    with c.stream("POST", "/v1/sessions/rest/commands", json={"command": "echo hi; echo err >&2; exit 2"}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in r.iter_lines() if line]
    assert events[0]["event"] == "job" and events[-1]["event"] == "end"
    assert events[-1]["job"]["exit_code"] == 2 and events[-1]["job"]["state"] == "FAILED"
    assert "".join(e["data"] for e in events if e["event"] == "stdout") == "hi\n"
    assert "".join(e["data"] for e in events if e["event"] == "stderr") == "err\n"
    with c.stream("POST", "/v1/sessions/rest/commands", json={"command": "echo up; sleep 60"}) as r:
        lines = r.iter_lines()
        job_id = json.loads(next(lines))["job"]["id"]
        assert json.loads(next(lines)) == {"event": "stdout", "data": "up\n"}
    deadline = time.monotonic() + 20
    while (state := c.get(f"/v1/jobs/{job_id}").json()["state"]) != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state == "CANCELLED"
    bad = c.post("/v1/sessions/rest/commands", json={"command": "true", "shell": True})
    assert bad.status_code == 422 and bad.json()["error"]["class"] == "UnknownField"
    schema = c.get("/openapi.json").json()["paths"]["/v1/sessions/{tag}/commands"]["post"]
    assert "application/x-ndjson" in schema["responses"]["200"]["content"]


def test_a_command_nobody_streams_is_answered_once_and_a_long_output_comes_back_whole(broker: BrokerProcess) -> None:
    c = broker.client()
    r = c.post("/v1/sessions/once/commands", params={"stream": "false"}, json={"command": "echo hi; echo e >&2"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert (body["stdout"], body["stderr"], body["stdout_truncated"], body["job"]["exit_code"]) == ("hi\n", "e\n", False, 0)
    with client(broker) as fp, fp.sandbox("once") as sb:
        big = sb.run("head -c 1500000 /dev/zero | tr '\\0' x")  # past the 1 MiB an answer carries inline
        assert big.ok and len(big.stdout) == 1_500_000 and set(big.stdout) == {"x"}
