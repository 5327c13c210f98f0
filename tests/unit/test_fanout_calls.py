"""`map(fn, inputs)`: a module-level function found by its file and imported by the job's runner from the
package's root, its JSON result read back from a marked stdout line; whatever a job cannot import is refused
before anything is sent, and a call whose job failed raises CallFailed with the job and its log's end."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from broker.client import Client
from broker.client_core import JobInfo
from broker.fanout_calls import RESULT_MARK, CallFailed, call_spec, result_line
from tests.unit.fanout_fake import FakeBroker

SOURCE = """
import sys

def square(x):
    print("thinking", end="")  # no newline: the result line still stands on its own
    return {"in": x, "out": x * x}

def fail(x):
    raise ValueError(f"no {x}")
"""


@pytest.fixture
def module(tmp_path: Path) -> Iterator[ModuleType]:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "work.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("pkg.work")
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("pkg", "pkg.work"):
            sys.modules.pop(name, None)


def test_a_function_in_a_package_is_imported_from_the_directory_above_the_package(module: ModuleType,
                                                                               tmp_path: Path) -> None:
    spec = call_spec(module.square)
    assert (spec.root, spec.module, spec.function) == (tmp_path.resolve(), "pkg.work", "square")


def test_the_runner_calls_the_function_in_the_package_root_and_prints_a_marked_json_line(module: ModuleType) -> None:
    spec = call_spec(module.square)
    argv = spec.command(7)
    assert argv[:2] == ["python3", "-c"]
    run = subprocess.run([sys.executable, *argv[1:]], cwd=spec.root, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("thinking\n" + RESULT_MARK)
    done = JobInfo.from_json({"id": "j", "state": "SUCCEEDED"})
    assert json.loads(result_line(done, run.stdout) or "null") == {"in": 7, "out": 49}
    assert result_line(JobInfo.from_json({"id": "j", "state": "FAILED"}), run.stdout) is None


def test_a_function_that_raises_exits_non_zero_with_its_traceback_and_no_result_line(module: ModuleType) -> None:
    spec = call_spec(module.fail)
    run = subprocess.run([sys.executable, *spec.command("x")[1:]], cwd=spec.root, capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 1 and "ValueError: no x" in run.stderr and RESULT_MARK not in run.stdout


def _nested() -> object:
    def inner(x: int) -> int:
        return x

    return inner


@pytest.mark.parametrize("fn", [lambda x: x, _nested(), Client.whoami, print], ids=["lambda", "nested", "method",
                                                                                      "builtin"])
def test_what_a_job_cannot_import_is_refused_before_anything_is_sent(fn: object) -> None:
    fake = FakeBroker()
    with Client("http://a:1", "tok", transport=fake.transport()) as fp, pytest.raises(TypeError, match="map()"):
        fp.map(fn, [1, 2])  # type: ignore[call-overload]
    assert fake.hosts == []


def test_map_packages_once_and_yields_results_in_input_order(module: ModuleType) -> None:
    fake = FakeBroker(finish_order="reverse", stdout={
        str(i): f"noise\n{RESULT_MARK}{json.dumps(i * i)}\n" for i in range(4)})
    with Client("http://a:1", "tok", transport=fake.transport(), sleep=lambda _: None) as fp:
        results = list(fp.map(module.square, range(4), "gpu", timeout_s=30))
    assert results == [0, 1, 4, 9] and fake.packages == ["HEAD", "PUT"] and len(fake.batches) == 1
    bodies = fake.batches[0]
    assert {b["pool"] for b in bodies} == {"gpu"} and {b["timeout_s"] for b in bodies} == {30}
    assert len({b["package"] for b in bodies}) == 1 and [json.loads(b["command"][-1]) for b in bodies] == [0, 1, 2, 3]
    assert [b["command"][3:5] for b in bodies] == [["pkg.work", "square"]] * 4


def test_a_failed_call_raises_call_failed_naming_its_input_job_and_log_tail(module: ModuleType) -> None:
    fake = FakeBroker(stdout={"0": f"{RESULT_MARK}1\n", "1": "partial output\n"}, fails={1})
    with Client("http://a:1", "tok", transport=fake.transport(), sleep=lambda _: None) as fp:
        results = fp.map(module.square, [1, 2])
        assert next(results) == 1
        with pytest.raises(CallFailed, match=r"input 1 failed in job j-1 \(exit code 1\): Traceback: boom") as failed:
            next(results)
    assert failed.value.job.id == "j-1" and failed.value.log_tail.endswith("Traceback: boom\n")
    assert failed.value.details["index"] == 1


def test_a_call_that_printed_no_result_line_fails_too(module: ModuleType) -> None:
    fake = FakeBroker(stdout={"0": "exited early\n"})
    with Client("http://a:1", "tok", transport=fake.transport(), sleep=lambda _: None) as fp, \
            pytest.raises(CallFailed, match=r"input 0 failed in job j-0 \(it printed no result line\)"):
        list(fp.map(module.square, [1]))


def test_a_callable_map_takes_no_package_or_command_of_its_own(module: ModuleType) -> None:
    with Client("http://a:1", "tok", transport=FakeBroker().transport()) as fp, pytest.raises(TypeError, match="package"):
        fp.map(module.square, [1], package="0" * 64)
