"""The agent's side of late binding, over its real socket: package pushes, unpacking, and what a reset forgets."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest

from broker.errors import AgentError
from broker.ports.agent import LaunchRequest, ResetRequest
from tests.integration.test_agent import PY, RunningAgent, agent  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def archive(files: dict[str, bytes | str], tmp: Path) -> tuple[str, str]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    path = tmp / f"{len(os.listdir(tmp))}.zip"
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest(), str(path)


def packaged(attempt_id: str, digest: str, *argv: str) -> LaunchRequest:
    return LaunchRequest(attempt_id=attempt_id, argv=argv, env={}, session="s1", extra={"package": digest})


async def test_a_pushed_package_is_unpacked_and_the_launch_runs_inside_it(agent: RunningAgent, tmp_path) -> None:  # noqa: F811
    digest, path = archive({"main.py": "import os; print('cwd', os.getcwd())", "lib/x.txt": "x"}, tmp_path)
    delivered = await agent.client.put_package(digest, path, 1 << 20, 30)
    assert delivered.digest == digest and delivered.extracted == len("import os; print('cwd', os.getcwd())") + 1
    assert sorted(os.listdir(agent.root / "pkg")) == ["lib", "main.py"]
    await agent.client.launch(packaged("p:0", digest, PY, "-S", "main.py"))
    done = await agent.client.wait("p:0", 10)
    assert done.exit_code == 0 and done.timings["package_unpack_s"] > 0
    assert (await agent.client.read_log("p:0")).data == f"cwd {agent.root / 'pkg'}\n".encode()


async def test_a_launch_naming_an_undelivered_package_fails_before_any_process(agent: RunningAgent, tmp_path) -> None:  # noqa: F811
    status = await agent.client.launch(packaged("p:0", "b" * 64, PY, "-S", "-c", "print(1)"))
    assert not status.running and status.error_class == "PackageError" and status.pid is None


async def test_a_reset_empties_the_package_dir_and_forgets_the_delivery(agent: RunningAgent, tmp_path) -> None:  # noqa: F811
    digest, path = archive({"main.py": "print(1)"}, tmp_path)
    await agent.client.put_package(digest, path, 1 << 20, 30)
    assert (await agent.client.reset(ResetRequest())).clean
    assert os.listdir(agent.root / "pkg") == []
    status = await agent.client.launch(packaged("p:1", digest, PY, "-S", "main.py"))
    assert status.error_class == "PackageError"


async def test_the_agent_refuses_a_bomb_a_wrong_digest_and_a_push_during_a_run(agent: RunningAgent, tmp_path) -> None:  # noqa: F811
    bomb, bomb_path = archive({"zeros": b"\0" * (4 << 20)}, tmp_path)
    with pytest.raises(AgentError) as refused:
        await agent.client.put_package(bomb, bomb_path, 1 << 20, 30)
    assert refused.value.details["status"] == 413
    assert os.listdir(agent.root / "pkg") == []
    good, good_path = archive({"a.py": "1"}, tmp_path)
    with pytest.raises(AgentError) as mismatch:
        await agent.client.put_package("c" * 64, good_path, 1 << 20, 30)
    assert mismatch.value.details["status"] == 400
    await agent.client.launch(LaunchRequest(attempt_id="long:0", argv=(PY, "-S", "-c", "import time; time.sleep(30)"),
                                            env={}, session="s1"))
    with pytest.raises(AgentError) as busy:
        await agent.client.put_package(good, good_path, 1 << 20, 30)
    assert busy.value.details["status"] == 409
    assert (await agent.client.reset(ResetRequest())).clean
