"""The first hour's failures: a user's mistake or a missing broker is one line and a non-zero exit at every door.

Each door is walked with FIREPOOL_URL at a closed port, with a refused token and with an unknown pool: the CLI,
the examples, the SDK (its errors' text is one line), `firepool kernelspec install` (it checks the pool) and a
Jupyter kernel start through the provisioner (one error of the broker's class, nothing chained under it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client
from broker.errors import FirepoolError, Unauthorized, Unavailable, UnknownPool
from broker.retrying import NO_RETRY
from tests.integration.conftest import BrokerProcess, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "broker.cli"]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("first-hour") / "broker", callers=("alice",))
    yield b
    b.stop()


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there once the probe socket is closed


def env_for(tmp_path: Path, url: str, token: str = "not-a-token") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIREPOOL_", "JUPYTER_"))}
    return {**env, "FIREPOOL_URL": url, "FIREPOOL_TOKEN": token, "FIREPOOL_STATE_DIR": str(tmp_path / "state"),
            "JUPYTER_DATA_DIR": str(tmp_path / "jupyter"), "JUPYTER_PATH": str(tmp_path / "jupyter"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "sandbox_image"), env.get("PYTHONPATH", "")])}


def run(argv: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def assert_one_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A non-zero exit and one line on stderr (a blank beside it allowed) saying why; no traceback."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode != 0, r
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


CLI_COMMANDS = [["jobs"], ["pools"], ["submit", "--wait", "--", "true"], ["logs", "job-1"], ["shell", "s1", "-c", "true"]]


@pytest.mark.parametrize("argv", CLI_COMMANDS, ids=lambda a: a[0])
def test_the_cli_without_a_broker_says_so_in_one_line(argv: list[str], tmp_path: Path) -> None:
    url = closed_url()
    assert_one_line(run([*CLI, *argv], env_for(tmp_path, url)), "Unavailable", f"cannot reach the broker at {url}")


@pytest.mark.parametrize("argv", CLI_COMMANDS[:3], ids=lambda a: a[0])
def test_the_cli_with_a_refused_token_says_so_in_one_line(argv: list[str], broker: BrokerProcess,
                                                          tmp_path: Path) -> None:
    assert_one_line(run([*CLI, *argv], env_for(tmp_path, broker.url)), "Unauthorized")


def test_the_cli_with_an_unknown_pool_names_it(broker: BrokerProcess, tmp_path: Path) -> None:
    env = env_for(tmp_path, broker.url, broker.tokens["alice"])
    assert_one_line(run([*CLI, "submit", "--pool", "nope", "--wait", "--", "true"], env), "UnknownPool", "nope")


def test_kernelspec_install_refuses_a_pool_the_broker_lacks_and_lists_its_pools(broker: BrokerProcess,
                                                                               tmp_path: Path) -> None:
    env = env_for(tmp_path, broker.url, broker.tokens["alice"])
    line = assert_one_line(run([*CLI, "kernelspec", "install", "--pool", "nope", "--user"], env), "UnknownPool", "'nope'")
    assert "cpu" in line and "gpu" in line
    assert not (tmp_path / "jupyter" / "kernels").exists()
    ok = run([*CLI, "kernelspec", "install", "--pool", "cpu", "--user"], env)
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    assert (tmp_path / "jupyter" / "kernels" / "firepool-cpu" / "kernel.json").is_file()


def test_kernelspec_install_without_a_broker_warns_in_one_line_and_installs(tmp_path: Path) -> None:
    url = closed_url()
    r = run([*CLI, "kernelspec", "install", "--pool", "cpu", "--user"], env_for(tmp_path, url))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "not checked" in lines[0] and url in lines[0], r.stderr
    assert (tmp_path / "jupyter" / "kernels" / "firepool-cpu" / "kernel.json").is_file()


EXAMPLE_SCRIPTS = ["agent_loop.py", "rl_loop.py", "gateway_kernel.py"]


@pytest.mark.parametrize("script", EXAMPLE_SCRIPTS)
def test_an_example_without_a_broker_fails_in_one_line(script: str, tmp_path: Path) -> None:
    url = closed_url()
    line = assert_one_line(run([sys.executable, str(EXAMPLES / script)], env_for(tmp_path, url)),
                           script, "cannot reach the broker")
    assert str(url.rsplit(":", 1)[1]) in line


@pytest.mark.parametrize("script", EXAMPLE_SCRIPTS)
def test_an_example_with_a_refused_token_fails_in_one_line(script: str, broker: BrokerProcess,
                                                           tmp_path: Path) -> None:
    r = run([sys.executable, str(EXAMPLES / script), "--url", broker.url, "--token", "not-a-token"],
            env_for(tmp_path, broker.url))
    line = assert_one_line(r, script)
    assert "Unauthorized" in line or "401" in line


@pytest.mark.parametrize("script", EXAMPLE_SCRIPTS)
def test_an_example_with_an_unknown_pool_fails_in_one_line(script: str, broker: BrokerProcess,
                                                           tmp_path: Path) -> None:
    env = env_for(tmp_path, broker.url, broker.tokens["alice"])
    argv = [sys.executable, str(EXAMPLES / script), "--url", broker.url, "--token", broker.tokens["alice"],
            "--pool", "nope"]
    assert_one_line(run(argv, env), script, "nope")


def assert_one_line_error(exc: BaseException) -> None:
    assert "\n" not in str(exc) and str(exc).strip(), repr(exc)


def test_the_sdks_errors_are_one_line(broker: BrokerProcess) -> None:
    with Client(closed_url(), "t", retry=NO_RETRY) as fp, pytest.raises(Unavailable) as no_broker:
        fp.run(["true"])
    with Client(broker.url, "not-a-token") as fp, pytest.raises(Unauthorized) as refused:
        fp.run(["true"])
    with Client(broker.url, broker.tokens["alice"]) as fp, pytest.raises(UnknownPool) as no_pool:
        fp.run(["true"], pool="nope")
    for exc in (no_broker.value, refused.value, no_pool.value):
        assert_one_line_error(exc)
    assert "cannot reach the broker" in str(no_broker.value) and "nope" in str(no_pool.value)


async def start_firepool_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, token: str,
                                pool: str) -> BaseException:
    """Start the firepool-POOL kernel through jupyter_client as nbclient does; the error it raises."""
    from jupyter_client.manager import AsyncKernelManager

    from jupyter_ext.kernelspec import install, kernel_json

    env = env_for(tmp_path, url, token)
    for name in ("FIREPOOL_URL", "FIREPOOL_TOKEN", "FIREPOOL_STATE_DIR", "JUPYTER_DATA_DIR", "JUPYTER_PATH"):
        monkeypatch.setenv(name, env[name])
    install(kernel_json(pool, url=url), f"firepool-{pool}", user=True)
    manager = AsyncKernelManager(kernel_name=f"firepool-{pool}")
    with pytest.raises(FirepoolError) as raised:
        await manager.start_kernel()
    return raised.value


async def test_a_jupyter_kernel_start_without_a_broker_is_one_clean_error(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    url = closed_url()
    error = await start_firepool_kernel(tmp_path, monkeypatch, url, "t", "cpu")
    assert isinstance(error, Unavailable) and f"cannot reach the broker at {url}" in str(error)
    assert "pool 'cpu'" in str(error)
    assert_one_line_error(error)
    assert error.__cause__ is None and error.__suppress_context__  # no httpx chain printed under it


async def test_a_jupyter_kernel_of_an_unknown_pool_is_one_clean_error(broker: BrokerProcess, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    error = await start_firepool_kernel(tmp_path, monkeypatch, broker.url, broker.tokens["alice"], "nope")
    assert isinstance(error, UnknownPool) and "nope" in str(error)
    assert_one_line_error(error)
    assert error.__cause__ is None and error.__suppress_context__


def test_nbconvert_without_a_broker_ends_with_the_one_line_reason(tmp_path: Path) -> None:
    """jupyter nbconvert prints the traceback of the error it got; that error is ours, and nothing is chained."""
    url = closed_url()
    env = env_for(tmp_path, url)
    assert run([*CLI, "kernelspec", "install", "--pool", "cpu", "--user"], env).returncode == 0
    notebook = tmp_path / "nb.ipynb"
    notebook.write_text('{"cells": [{"cell_type": "code", "execution_count": null, "metadata": {}, "outputs": [],'
                        ' "source": "1 + 1"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    r = run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--stdout",
             "--ExecutePreprocessor.kernel_name=firepool-cpu", str(notebook)], env)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("broker.errors.Unavailable: Firepool kernel in pool 'cpu'")
    assert "direct cause" not in r.stderr and "During handling" not in r.stderr
