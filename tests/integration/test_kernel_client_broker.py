"""The SDK's kernel client through the broker's own gateway: a kernel in a sandbox reached with the caller's
token over HTTP + one websocket, nothing else (no connection info, no keys, no pod port), owner-only."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client import AsyncClient
from broker.errors import InvalidRequest, NotFound
from broker.kernel_client import AsyncKernel, KernelDisconnected, kernels, kernelspecs
from broker.kernel_wire import V1_PROTOCOL

pytestmark = pytest.mark.integration

POOLS = """pools:
  - {name: cpu, max_count: 2}
"""
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway_kernel.py"
MODEL_FIELDS = {"id", "name", "last_activity", "execution_state", "connections"}


@pytest.fixture
def broker(broker_factory):
    return broker_factory(pools=POOLS)


async def test_a_gateway_kernel_runs_cells_restarts_in_its_sandbox_and_is_the_owners_alone(broker):
    async with AsyncClient(broker.url, broker.tokens["alice"]) as fp, \
            AsyncClient(broker.url, broker.tokens["bob"]) as other:
        specs = await kernelspecs(fp)
        assert "firepool-cpu" in specs["kernelspecs"]
        k = await AsyncKernel.start(fp, pool="cpu", env={"KERNEL_FIREPOOL_SESSION": "sdk-test"})
        try:
            assert k.protocol == V1_PROTOCOL and set(k.model) == MODEL_FIELDS
            ex = await k.execute("open('kept.txt', 'w').write('on disk')\nx = 41\nprint(x + 1)\nx")
            assert (ex.status, ex.stdout, ex.outputs[-1]["data"]["text/plain"]) == ("ok", "42\n", "41")
            # Nothing the client was given names a port or a key.
            assert "key" not in json.dumps(await kernels(fp))
            with pytest.raises(NotFound):
                await AsyncKernel.attach(other, k.id)
            assert await kernels(other) == []

            sleeping = asyncio.Event()
            cell = asyncio.create_task(k.execute(
                "import time; print('sleeping', flush=True); time.sleep(60)",
                on_message=lambda m: sleeping.set() if m["msg_type"] == "stream" else None))
            await asyncio.wait_for(sleeping.wait(), 30)
            await k.interrupt()
            stopped = await asyncio.wait_for(cell, 30)
            assert stopped.error is not None and stopped.error["ename"] == "KeyboardInterrupt"

            await k.restart()
            after = await k.execute("print(open('kept.txt').read())\nx", timeout=60)
            assert after.stdout == "on disk\n"  # same sandbox, same files
            assert after.error is not None and after.error["ename"] == "NameError"  # a new process
        finally:
            await k.shutdown()
        with pytest.raises(NotFound):
            await AsyncKernel.attach(fp, k.id)


async def test_a_kernel_takes_its_jobs_queue_and_no_recycle_from_its_env_and_bad_values_are_refused(broker):
    async with AsyncClient(broker.url, broker.tokens["alice"]) as fp:
        env = {"KERNEL_FIREPOOL_SESSION": "mcp-like", "KERNEL_FIREPOOL_QUEUE": "agents",
               "KERNEL_FIREPOOL_RECYCLE": "0"}
        async with await AsyncKernel.start(fp, pool="cpu", env=env) as k:
            probe = await k.execute("import os; print(os.environ['FIREPOOL_JOB_ID'])")
            job = (await fp.get(probe.stdout.strip())).raw
            assert (job["queue"], job["recycle"], job["lease_tag"]) == ("agents", False, "mcp-like")
        for bad in ({"KERNEL_FIREPOOL_QUEUE": ""}, {"KERNEL_FIREPOOL_QUEUE": "q" * 65},
                    {"KERNEL_FIREPOOL_RECYCLE": "maybe"}):
            with pytest.raises(InvalidRequest):
                await AsyncKernel.start(fp, pool="cpu", env=bad)
        assert await kernels(fp) == []


def test_the_plain_script_example_runs_code_in_a_sandbox_with_http_and_a_websocket_only(broker):
    done = subprocess.run([sys.executable, str(EXAMPLE), "--url", broker.url, "--token", broker.tokens["alice"],
                           "--pool", "cpu", "import os; print('pod', os.environ['FIREPOOL_POD']); 6 * 7"],
                          capture_output=True, text=True, timeout=120, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("pod cpu-") and second == "42"
    assert broker.client("alice").get("/api/kernels").json() == []  # it shut its kernel down


async def test_a_cell_waiting_on_a_kernel_whose_job_ends_fails_at_once_as_disconnected(broker):
    async with AsyncClient(broker.url, broker.tokens["alice"]) as fp:
        k = await AsyncKernel.start(fp, pool="cpu")
        try:
            job_id = (await k.execute("import os; print(os.environ['FIREPOOL_JOB_ID'])")).stdout.strip()
            cell = asyncio.create_task(k.execute("import time; time.sleep(60)", timeout=60))
            await asyncio.sleep(0.5)
            await fp.cancel(job_id)
            with pytest.raises(KernelDisconnected):
                await asyncio.wait_for(cell, 30)
        finally:
            await k.shutdown()
