"""B12: the Firepool Jupyter kernel — start from a warm sandbox, cold and pre-started, and the round trip.

A broker on the local backend with two pools: `cpu` (`kernels: cold`: every kernel imports ipykernel in
the sandbox) and `kern` (`kernels: prestart`: an idle pod keeps a pre-imported, unbound kernel process
that the next kernel job binds). Kernelspecs with a fixed session tag, so after the first kernel (which
makes the pod) every kernel lands on the same warm sandbox. Start (ready) = AsyncKernelManager.start_kernel()
until the kernel answers kernel_info (jupyter_client's wait_for_ready adds a fixed 0.2 s IOPub flush
after that, for every kernel, and is left out); phases: submit -> the job's first instruction,
-> the connection line read back, -> ready. A pre-started start waits first until the pod's process is
ready (an idle pod); a back-to-back restart (the process still importing) is measured too. A third pool,
`learn` (`kernels: auto`, two pods), serves one kernel and then the first kernel of each new session (a
new tag): on a pod that never ran one (the pool learned) or on the caller's pod of another session (the
process kept across the session boundary). Execute
round trip = execute_request -> execute_reply for `pass`. The same figures for a local ipykernel (the
stock `python3` kernelspec) are measured in the same run as the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, environment, median, percentile, report

TAG = "bench-jupyter"
POOLS = """
pools:
  - name: cpu
    gpus: 0
    max_count: 2
    kernels: cold
  - name: kern
    gpus: 0
    max_count: 2
    kernels: prestart
  - name: learn
    gpus: 0
    min_count: 2
    max_count: 2
"""


async def _start(name: str, totals: list[float] | None = None) -> tuple[Any, Any, float]:
    """Start a kernel; the seconds until it answered kernel_info (jupyter_client's own wait_for_ready then
    runs untimed: it ends with a fixed 0.2 s wait for a quiet IOPub channel, which no kernel can shorten)."""
    from jupyter_client.manager import AsyncKernelManager

    began = time.perf_counter()
    km = AsyncKernelManager(kernel_name=name)
    # Popen arguments for the local baseline's process (its banner would fill the table); the Firepool
    # provisioner ignores them: its kernel's output goes to the job's log.
    await km.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kc = km.client()
    kc.start_channels()
    took = await _kernel_info(kc) - began
    await kc.wait_for_ready(timeout=120)
    if totals is not None:
        totals.append(time.perf_counter() - began)
    return km, kc, took


async def _kernel_info(kc: Any, timeout_s: float = 120.0) -> float:
    """When the kernel's kernel_info_reply arrived (requests queue in ZeroMQ until the kernel is up)."""
    from queue import Empty

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg_id = kc.kernel_info()
        try:
            while True:
                reply = await kc._async_get_shell_msg(timeout=1.0)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return time.perf_counter()
        except Empty:
            continue
    raise TimeoutError("the kernel never answered kernel_info")


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


async def _prestart_state(state_dir: Path, pod: str) -> dict[str, Any]:
    from broker.running.agent_http import HttpAgentClient

    root = state_dir / "pods" / pod
    secret = json.loads((root / "pod.json").read_text())["secret"]
    fd = os.open(root / "run", os.O_PATH | os.O_DIRECTORY)
    agent = HttpAgentClient(f"unix:{root}/run/agent.sock", secret, uds_path=f"/proc/self/fd/{fd}/agent.sock")
    try:
        return dict((await agent.health()).info["kernel_prestart"])
    finally:
        await agent.close()
        os.close(fd)


async def _prestart_ready(state_dir: Path, pod: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The pod's pre-started kernel once the pod is idle again and the process has finished importing."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = await _prestart_state(state_dir, pod)
        if state.get("ready") or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.02)


async def _prestarted(starts: int, state_dir: Path, url: str, client: Any) -> dict[str, Any]:
    """Kernel starts on a `kernels: prestart` pod: after the process is ready, and back to back."""
    from jupyter_ext import kernelspec

    kernelspec.install(kernelspec.kernel_json("kern", url=url, lease_tag=TAG + "-kern"), "fp-bench-kern", user=True)
    found: dict[str, Any] = {"start": [], "bound": [], "to_connection": [], "back_to_back": [],
                             "back_to_back_bound": [], "back_to_back_ready": [], "with_wait_for_ready": []}
    km, kc, _ = await _start("fp-bench-kern")  # makes the pod
    pod = client.get(f"/v1/jobs/{km.provisioner.job_id}").json()["bound_pods"][0]
    await _stop(km, kc)
    for _ in range(starts):
        found["idle"] = await _prestart_ready(state_dir, pod)
        km, kc, took = await _start("fp-bench-kern", found["with_wait_for_ready"])
        job = client.get(f"/v1/jobs/{km.provisioner.job_id}").json()
        found["start"].append(took)
        found["bound"].append(job["attempts"][-1].get("timings", {}).get("kernel_prestarted", 0.0))
        found["to_connection"].append(km.provisioner.launch_s)
        await _stop(km, kc)
    await _prestart_ready(state_dir, pod)
    for _ in range(max(3, starts // 2)):  # a restart: the next kernel right after the last one's reset
        km, kc, took = await _start("fp-bench-kern")
        job = client.get(f"/v1/jobs/{km.provisioner.job_id}").json()
        found["back_to_back"].append(took)
        timings = job["attempts"][-1].get("timings", {})
        found["back_to_back_bound"].append(timings.get("kernel_prestarted", 0.0))
        found["back_to_back_ready"].append(timings.get("kernel_prestart_ready", 0.0))
        await _stop(km, kc)
    return found


async def _new_sessions(starts: int, state_dir: Path, url: str, client: Any) -> dict[str, Any]:
    """First kernels of new sessions on a `kernels: auto` pool after it served one kernel: each on a pod
    that never ran a kernel (learned per pool) or on the caller's pod of another session (kept across the
    boundary). Interleaved with a same-session restart on the same pool, so both see the same load."""
    from jupyter_ext import kernelspec

    found: dict[str, Any] = {"start": [], "bound": [], "crossed": [], "paths": {}, "to_connection": [],
                             "to_first_instruction": [], "session_wipe_s": [], "same_session": []}
    kernelspec.install(kernelspec.kernel_json("learn", url=url, lease_tag=f"{TAG}-same"), "fp-bench-same", user=True)
    km, kc, _ = await _start("fp-bench-same")  # the pool's first kernel: it learns from this one
    await _stop(km, kc)
    for i in range(starts):
        name = f"fp-bench-new-{i}"
        kernelspec.install(kernelspec.kernel_json("learn", url=url, lease_tag=f"{TAG}-new-{i}"), name, user=True)
        for kind in ("same", "new"):
            # Every idle pod of the pool has its process imported (an idle pool, as a new session finds it).
            for pod in [p["name"] for p in client.get("/v1/pods").json()["pods"] if p["pool"] == "learn"]:
                await _prestart_ready(state_dir, pod)
            km, kc, took = await _start(name if kind == "new" else "fp-bench-same")
            job = client.get(f"/v1/jobs/{km.provisioner.job_id}").json()
            await _stop(km, kc)
            if kind == "same":
                found["same_session"].append(took)
                continue
            timings = job["attempts"][-1].get("timings", {})
            path = job["acquisition"][0]["path"]
            found["paths"][path] = found["paths"].get(path, 0) + 1
            found["start"].append(took)
            found["bound"].append(timings.get("kernel_prestarted", 0.0))
            found["crossed"].append(timings.get("kernel_prestart_crossed", 0.0))
            found["session_wipe_s"].append(timings.get("session_wipe_s", 0.0))
            found["to_connection"].append(km.provisioner.launch_s)
            t = job["timings"]
            found["to_first_instruction"].append(t["first_instruction_at"] - t["submitted_at"])
    return found


async def _measure(starts: int, executes: int, url: str, client: Any, state_dir: Path) -> dict[str, Any]:
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
    found["prestarted"] = await _prestarted(starts, state_dir, url, client)
    found["new_sessions"] = await _new_sessions(starts, state_dir, url, client)
    return found


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench jupyter", description=__doc__)
    parser.add_argument("--starts", type=int, default=10, help="kernel starts from the warm sandbox")
    parser.add_argument("--executes", type=int, default=200, help="execute round trips")
    args = parser.parse_args(argv)
    with BenchBroker(pools=POOLS) as broker, broker.client() as client, tempfile.TemporaryDirectory() as home, \
            environment({"FIREPOOL_URL": broker.url, "FIREPOOL_TOKEN": broker.tokens["bench"],
                         "JUPYTER_DATA_DIR": os.path.join(home, "data"),
                         "JUPYTER_RUNTIME_DIR": os.path.join(home, "runtime")}):
        found = asyncio.run(_measure(args.starts, args.executes, broker.url, client, broker.dir / "state"))
    ms = 1000.0
    start = median(found["start"])
    rtt50, rtt90 = percentile(found["rtt"], 50) * ms, percentile(found["rtt"], 90) * ms
    pre = found["prestarted"]
    pre_start, local = median(pre["start"]), median(found["local_start"])
    idle = pre.get("idle", {})
    new = found["new_sessions"]
    new_start = median(new["start"])
    rows = [
        Row("B12", f"first kernel of a new session (pool that serves kernels), median of {len(new['start'])} "
            f"({sum(new['bound']):.0f} bound, {sum(new['crossed']):.0f} kept across the boundary; {new['paths']})",
            new_start, "s", "-", "<= 0.25 s", at_most(new_start, 0.25)),
        Row("B12", "first kernel of a new session / local ipykernel (same run)", new_start / local, "x", "-", "< 1",
            new_start < local),
        Row("B12", "first kernel of a new session / same-session restart on that pool (interleaved)",
            new_start / median(new["same_session"]), "x", "-"),
        Row("B12", f"kernel ready from a pod with a pre-started kernel, median of {args.starts} "
            f"({sum(pre['bound']):.0f} bound)", pre_start, "s", "-", "<= 0.25 s", at_most(pre_start, 0.25)),
        Row("B12", "kernel ready: pre-started / local ipykernel (same run)", pre_start / local, "x", "-", "< 1",
            pre_start < local),
        Row("B12", "phase: submit -> connection line read back, pre-started p50",
            percentile(pre["to_connection"], 50) * ms, "ms", "-"),
        Row("B12", f"kernel ready back to back (a restart: {sum(pre['back_to_back_bound']):.0f} of "
            f"{len(pre['back_to_back'])} bound, {sum(pre['back_to_back_ready']):.0f} found it imported), median",
            median(pre["back_to_back"]), "s", "-"),
        Row("B12", "pre-started, through jupyter_client's wait_for_ready (+ its fixed 0.2 s IOPub flush), median",
            median(pre["with_wait_for_ready"]), "s", "-"),
        Row("B12", "idle pod's pre-started kernel: RSS", idle.get("rss_kib", float("nan")) / 1024, "MiB", "-"),
        Row("B12", "idle pod's pre-started kernel: PSS (shared pages split)", idle.get("pss_kib", float("nan")) / 1024,
            "MiB", "-"),
        Row("B12", f"kernel start from a warm sandbox, cold (kernels: cold), median of {args.starts} "
            f"({found['paths']})", start, "s", "-", "<= 1.5 s", at_most(start, 1.5)),
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
