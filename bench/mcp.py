"""B11: the MCP `run_in_sandbox` warm round trip, official MCP client, one conversation of N calls.

A throwaway broker on the local backend; `firepool mcp` as a subprocess over stdio, then over
streamable HTTP. Each call runs `python3 -c 'print(1)'` in the same session; the first call makes the
sandbox, every later one should find it warm. The round trip is what the client waits for a tool call.
Over stdio, a second conversation measures `python_exec` of `x + 1` over the session's live kernel,
and `run_in_sandbox` while that kernel lives (it then runs as a subprocess of the kernel).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, percentile, report

COMMAND = "python3 -c 'print(1)'"
TARGET_MS = 60.0
PY_TARGET_MS = 20.0


Outcome = tuple[list[float], dict[str, int], int, list[str]]


async def _conversation(client: Any, calls: int, session: str) -> Outcome:
    """(round trips of calls 2..N in s, their acquisition counts, how many printed 1, their job ids)."""
    times: list[float] = []
    paths: dict[str, int] = {}
    right = 0
    jobs: list[str] = []
    for i in range(calls + 1):
        t0 = time.perf_counter()
        res = await client.call_tool("run_in_sandbox", {"command": COMMAND, "session": session})
        took = time.perf_counter() - t0
        if res.is_error:
            raise RuntimeError(f"run_in_sandbox failed: {res.content}")
        out = res.structured_content or {}
        if i == 0:
            continue  # the sandbox's creation
        times.append(took)
        jobs.append(str(out.get("job_id")))
        path = str(out.get("acquisition"))
        paths[path] = paths.get(path, 0) + 1
        right += out.get("stdout_tail") == "1\n"
    return times, paths, right, jobs


async def _live_python(client: Any, calls: int, session: str, live: dict[str, Any]) -> None:
    """python_exec `x + 1` round trips over one live kernel (the first call starts it), then
    run_in_sandbox round trips in the same session (beside the kernel)."""
    t0 = time.perf_counter()
    first = await client.call_tool("python_exec", {"code": "x = 41", "session": session})
    if first.is_error:
        raise RuntimeError(f"python_exec failed: {first.content}")
    live["first_call_ms"] = (time.perf_counter() - t0) * 1000
    times, right = [], 0
    for _ in range(calls):
        t0 = time.perf_counter()
        res = await client.call_tool("python_exec", {"code": "x + 1", "session": session})
        times.append((time.perf_counter() - t0) * 1000)
        right += (res.structured_content or {}).get("result") == "42"
    beside = []
    for _ in range(max(10, calls // 5)):
        t0 = time.perf_counter()
        res = await client.call_tool("run_in_sandbox", {"command": COMMAND, "session": session})
        beside.append((time.perf_counter() - t0) * 1000)
        right += (res.structured_content or {}).get("stdout_tail") == "1\n"
    live.update(python_ms=times, beside_ms=beside, right=right, expected=calls + len(beside))


async def _stdio(broker: BenchBroker, calls: int, live: dict[str, Any]) -> Outcome:
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "FIREPOOL_URL": broker.url, "FIREPOOL_TOKEN": broker.tokens["bench"]}
    params = StdioServerParameters(command=sys.executable, args=["-m", "broker.cli", "mcp"], env=env)
    async with Client(params) as client:
        outcome = await _conversation(client, calls, "b11-stdio")
        await _live_python(client, calls, "b11-py", live)
        return outcome


async def _http_run(broker: BenchBroker, calls: int, live: dict[str, Any]) -> Outcome:
    return await _http(broker, calls)


async def _http(broker: BenchBroker, calls: int) -> Outcome:
    import httpx
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    token = secrets.token_hex(16)
    (broker.dir / "mcp-tokens.json").write_text(json.dumps({token: "bench"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(broker.dir / "mcp-http.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "broker.cli", "mcp", "--http", "--port", str(port), "--url",
                                 broker.url, "--tokens", str(broker.dir / "mcp-tokens.json"),
                                 "--broker-tokens", str(broker.dir / "tokens.json")],
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((broker.dir / "mcp-http.log").read_text()[-2000:]) from None
                await asyncio.sleep(0.1)
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http, \
                Client(streamable_http_client(url, http_client=http)) as client:
            return await _conversation(client, calls, "b11-http")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _job_phases(broker: BenchBroker, jobs: list[str]) -> tuple[list[float], list[float]]:
    """Per job (ms): first instruction -> finished (the command itself, in the sandbox), and
    submitted -> first instruction (the broker's warm start)."""
    ran, start = [], []
    with broker.client() as c:
        for job_id in jobs:
            t = c.get(f"/v1/jobs/{job_id}").json().get("timings", {})
            if {"submitted_at", "first_instruction_at", "finished_at"} <= set(t):
                ran.append((t["finished_at"] - t["first_instruction_at"]) * 1000)
                start.append((t["first_instruction_at"] - t["submitted_at"]) * 1000)
    return ran, start


def _rest_baseline(broker: BenchBroker, calls: int) -> list[float]:
    """The same command as a plain SDK job (submit, wait, read its output): what MCP adds is the rest."""
    from broker.client import Client

    times = []
    with Client(broker.url, broker.tokens["bench"]) as fp:
        for i in range(calls + 1):
            t0 = time.perf_counter()
            job = fp.run(["bash", "-c", COMMAND], pool="cpu", lease_tag="b11-rest")
            out = fp.logs(job.id, stream="stdout")
            if i and out == "1\n":
                times.append((time.perf_counter() - t0) * 1000)
    return times


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench mcp", description=__doc__)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args(argv)
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    with BenchBroker() as broker:
        rest = _rest_baseline(broker, args.calls)
        rows.append(Row("B11", f"baseline: the same job over REST (SDK run + logs) p50 ({len(rest)} jobs)",
                        percentile(rest, 50), "ms", "-"))
        raw["rest_baseline_ms"] = rest
        live: dict[str, Any] = {}
        for transport, run in (("stdio", _stdio), ("streamable HTTP", _http_run)):
            times, paths, right, jobs = asyncio.run(run(broker, args.calls, live))
            ms = [t * 1000 for t in times]
            in_job, broker_side = _job_phases(broker, jobs)
            p50, p90 = percentile(ms, 50), percentile(ms, 90)
            warm = paths.get("warm", 0)
            target = "<= 60 ms" if transport == "stdio" else "-"
            rows += [
                Row("B11", f"run_in_sandbox print(1) p50, {transport} ({args.calls} calls)", p50, "ms", "-",
                    target, at_most(p50, TARGET_MS) if transport == "stdio" else None),
                Row("B11", f"run_in_sandbox print(1) p90, {transport}", p90, "ms", "-"),
                Row("B11", f"  of which the job ran (first instruction->finished) p50, {transport}",
                    percentile(in_job, 50), "ms", "-"),
                Row("B11", f"  of which the broker (submitted->first instruction) p50, {transport}",
                    percentile(broker_side, 50), "ms", "-"),
                Row("B11", f"calls after the first that were warm, {transport} ({paths})", warm, "calls", "-",
                    f"= {args.calls}", warm == args.calls and right == args.calls),
            ]
            raw[transport] = {"round_trips_ms": ms, "paths": paths, "printed_1": right}
            if transport == "stdio":
                py50 = percentile(live["python_ms"], 50)
                rows += [
                    Row("B11", f"python_exec x + 1 p50 over a live kernel, stdio ({args.calls} calls)", py50, "ms",
                        "-", f"<= {PY_TARGET_MS:.0f} ms", at_most(py50, PY_TARGET_MS)),
                    Row("B11", "python_exec x + 1 p90 over a live kernel, stdio",
                        percentile(live["python_ms"], 90), "ms", "-"),
                    Row("B11", "python_exec first call (starts the kernel), stdio", live["first_call_ms"], "ms", "-"),
                    Row("B11", f"run_in_sandbox print(1) p50 beside the live kernel, stdio "
                               f"({len(live['beside_ms'])} calls)", percentile(live["beside_ms"], 50), "ms", "-"),
                    Row("B11", "live-kernel calls that answered right", live["right"], "calls", "-",
                        f"= {live['expected']}", live["right"] == live["expected"]),
                ]
                raw["python_exec"] = live
    return report("mcp", rows, json_out=json_out, extra={"raw": raw, "command": COMMAND})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
