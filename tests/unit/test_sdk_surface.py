"""The SDK's two clients offer the same calls, and a session command's request becomes the job it says."""

from __future__ import annotations

import base64
import inspect

import pytest

from broker.aclient import AsyncClient
from broker.api.command_routes import MAX_STDIN_BYTES, CommandRequest
from broker.client import Client
from broker.errors import InvalidRequest
from broker.sandbox.results import CodeResult, CommandFailed, CommandResult
from broker.sandbox.wrappers import STDIN_WRAPPER


def _public(cls: type) -> dict[str, object]:
    return {n: m for n, m in inspect.getmembers(cls) if not n.startswith("_") and callable(m)}


def test_async_client_has_every_call_the_sync_client_has_with_the_same_parameters() -> None:
    sync, asynchronous = _public(Client), _public(AsyncClient)
    assert set(sync) == set(asynchronous)
    for name in sync:
        assert list(inspect.signature(sync[name]).parameters) == list(inspect.signature(asynchronous[name]).parameters), name


def test_a_command_string_runs_under_bash_and_an_argv_as_is_with_no_extra_shell() -> None:
    assert CommandRequest(command="echo hi").spec("t").command == ("bash", "-c", "echo hi")
    assert CommandRequest(command=["python3", "-V"]).spec("t").command == ("python3", "-V")
    spec = CommandRequest(command="echo hi", pool="gpu", env={"A": "1"}, timeout_s=5).spec("conv")
    assert (spec.lease_tag, spec.pool, spec.env, spec.timeout_s, spec.recycle) == ("conv", "gpu", {"A": "1"}, 5, False)


def test_stdin_and_cwd_travel_through_one_wrapper_as_base64_in_argument_sized_chunks() -> None:
    argv = CommandRequest(command=["cat"], stdin="a\x00b", cwd="sub").spec("t").command
    assert argv[:6] == ("bash", "-c", STDIN_WRAPPER, "firepool", "sub", "1")
    assert base64.b64decode(argv[6]) == b"a\x00b" and argv[7:] == ("cat",)
    raw = CommandRequest(command="wc -c", stdin_base64=base64.b64encode(b"\xff\x00").decode()).spec("t").command
    assert base64.b64decode(raw[6]) == b"\xff\x00" and raw[4] == "" and raw[7:] == ("bash", "-c", "wc -c")
    big = CommandRequest(command=["wc", "-c"], stdin="x" * MAX_STDIN_BYTES).spec("t").command
    chunks = big[6:6 + int(big[5])]
    assert int(big[5]) > 1 and all(len(c) < 131072 for c in chunks)
    assert base64.b64decode("".join(chunks)) == b"x" * MAX_STDIN_BYTES and big[6 + int(big[5]):] == ("wc", "-c")


@pytest.mark.parametrize("fields", [{"stdin": "a", "stdin_base64": "YQ=="}, {"stdin_base64": "not base64!"},
                                    {"stdin": "x" * (MAX_STDIN_BYTES + 1)}, {"command": []}])
def test_bad_stdin_or_an_empty_command_is_a_typed_refusal(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        CommandRequest(**{"command": "cat", **fields}).spec("t")  # type: ignore[arg-type]


def test_a_failed_command_raises_only_when_checked_with_its_exit_code_and_last_error_line() -> None:
    bad = CommandResult(exit_code=3, stdout="", stderr="warning\nfatal: no such thing\n", state="FAILED",
                        error_class="NonZeroExit", job_id="j1")
    assert not bad.ok and not bad.timed_out
    with pytest.raises(CommandFailed, match=r"exit code 3\): fatal: no such thing") as info:
        bad.check()
    assert info.value.details == {"exit_code": 3, "job": "j1"}


def test_a_cells_value_images_and_error_come_out_of_its_outputs() -> None:
    png = base64.b64encode(b"\x89PNG fake").decode()
    r = CodeResult.of("out\n", "", [{"kind": "display_data", "data": {"image/png": png, "text/plain": "<Figure>"}},
                                    {"kind": "execute_result", "data": {"text/plain": "42"}}],
                      {"ename": "E", "evalue": "v", "traceback": ["\x1b[31mTrace\x1b[0m", "line"]}, 3, False)
    assert (r.text, r.images, r.data["text/plain"], r.execution_count) == ("42", [b"\x89PNG fake"], "42", 3)
    assert r.error is not None and str(r.error) == "E: v" and r.error.traceback == "Trace\nline"
