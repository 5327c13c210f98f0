"""B12: the Firepool Jupyter kernel — start from a warm sandbox, and the execute round trip.

A broker on the local backend; a kernelspec with a fixed session tag, so after the first kernel (which
makes the pod) every kernel lands on the same warm sandbox. Start = AsyncKernelManager.start_kernel()
until the kernel answers kernel_info (wait_for_ready); phases: submit -> the job's first instruction,
-> the connection line read back, -> ready. Execute round trip = execute_request -> execute_reply for
`pass`. The same figures for a local ipykernel (the stock `python3` kernelspec) are measured in the
same run as the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from typing import Any

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, median, percentile, report

TAG = "bench-jupyter"


async def _start(name: str) -> tuple[Any, Any, float]:
    from jupyter_client.manager import AsyncKernelManager

    began = time.perf_counter()
    km = AsyncKernelManager(kernel_name=name)
    # Popen arguments for the local baseline's process (its banner would fill the table); the Firepool
    # provisioner ignores them: its kernel's output goes to the job's log.
    await km.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    return km, kc, time.perf_counter() - began


async def _round_trips(kc: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        msg_id = kc.execute("pass", store_history=False)
        while True:
            reply = await kc._async_get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        out.append(time.perf_counter() - began)
    while True:  # drain iopub so the next kernel starts from a quiet client
        try:
            await kc._async_get_iopub_msg(timeout=0.05)
        except Exception:
            break
    return out


async def _stop(km: Any, kc: Any) -> None:
    kc.stop_channels()
    await km.shutdown_kernel()


async def _measure(starts: int, executes: int, url: str, client: Any) -> dict[str, Any]:
    from jupyter_ext import kernelspec

    kernelspec.install(kernelspec.kernel_json("cpu", url=url, lease_tag=TAG), "fp-bench", user=True)
    found: dict[str, Any] = {"start": [], "paths": {}, "to_first_instruction": [], "to_connection": []}
    km, kc, found["first_start"] = await _start("fp-bench")  # makes the pod
    await _stop(km, kc)
    for i in range(starts):
        km, kc, took = await _start("fp-bench")
        job = client.get(f"/v1/jobs/{km.provisioner.job_id}").json()
        path = job["acquisition"][0]["path"]
        found["paths"][path] = found["paths"].get(path, 0) + 1
        found["start"].append(took)
        t = job["timings"]
        found["to_first_instruction"].append(t["first_instruction_at"] - t["submitted_at"])
        found["to_connection"].append(km.provisioner.launch_s)
        if i == starts - 1:
            found["rtt"] = await _round_trips(kc, executes)
        await _stop(km, kc)
    # Baseline: the stock local ipykernel, same machine, same run.
    km, kc, _ = await _start("python3")
    await _stop(km, kc)
    found["local_start"] = []
    for _ in range(max(3, starts // 2)):
        km, kc, took = await _start("python3")
        found["local_start"].append(took)
        await _stop(km, kc)
    km, kc, _ = await _start("python3")
    found["local_rtt"] = await _round_trips(kc, executes)
    await _stop(km, kc)
    return found


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench jupyter", description=__doc__)
    parser.add_argument("--starts", type=int, default=10, help="kernel starts from the warm sandbox")
    parser.add_argument("--executes", type=int, default=200, help="execute round trips")
    args = parser.parse_args(argv)
    saved = {k: os.environ.get(k) for k in ("FIREPOOL_URL", "FIREPOOL_TOKEN", "JUPYTER_DATA_DIR",
                                            "JUPYTER_RUNTIME_DIR")}
    with BenchBroker() as broker, broker.client() as client, tempfile.TemporaryDirectory() as home:
        os.environ.update({"FIREPOOL_URL": broker.url, "FIREPOOL_TOKEN": broker.tokens["bench"],
                           "JUPYTER_DATA_DIR": os.path.join(home, "data"),
                           "JUPYTER_RUNTIME_DIR": os.path.join(home, "runtime")})
        try:
            found = asyncio.run(_measure(args.starts, args.executes, broker.url, client))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    ms = 1000.0
    start = median(found["start"])
    rtt50, rtt90 = percentile(found["rtt"], 50) * ms, percentile(found["rtt"], 90) * ms
    rows = [
        Row("B12", f"kernel start from a warm sandbox, median of {args.starts} ({found['paths']})", start, "s",
            "-", "<= 1.5 s", at_most(start, 1.5)),
        Row("B12", f"execute round trip p50 ({args.executes} x `pass`)", rtt50, "ms", "-", "<= 15 ms",
            at_most(rtt50, 15)),
        Row("B12", "execute round trip p90", rtt90, "ms", "-"),
        Row("B12", "phase: submit -> kernel job's first instruction p50",
            percentile(found["to_first_instruction"], 50) * ms, "ms", "-"),
        Row("B12", "phase: submit -> connection line read back (ipykernel import, bind) p50",
            percentile(found["to_connection"], 50) * ms, "ms", "-"),
        Row("B12", "phase: connection line -> kernel ready (kernel_info answered) p50",
            percentile([a - b for a, b in zip(found["start"], found["to_connection"], strict=True)], 50) * ms,
            "ms", "-"),
        Row("B12", "first kernel (creates the sandbox)", found["first_start"], "s", "-"),
        Row("B12", "baseline: local ipykernel start, median (same run)", median(found["local_start"]), "s", "-"),
        Row("B12", "kernel start: Firepool / local ipykernel (same run; the machine's load cancels)",
            start / median(found["local_start"]), "x", "-"),
        Row("B12", "baseline: local ipykernel execute round trip p50", percentile(found["local_rtt"], 50) * ms,
            "ms", "-"),
    ]
    return report("jupyter", rows, json_out=json_out, extra={"raw": found})
