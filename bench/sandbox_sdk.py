"""B17 "first hour": the SDK's `Sandbox` against the job API it is built on.

A broker on the local backend (one `cpu` pool). In one warm session, interleaved round by round:

- warm round trip of `echo hi`: `Sandbox.run` (one `POST /v1/sessions/{tag}/commands?stream=false`: no callback
  listens) vs `Client.run` (`POST /v1/jobs?wait_s=`) in the same session, and `Sandbox.run` with an `on_stdout`
  callback (the NDJSON stream);
- first byte: a command prints its wall clock (`date +%s.%N`), sleeps, prints again; the gap between that
  clock and the moment `on_stdout` sees the line (same host, same clock);
- `run_code("x + 1")` round trip in the session's live kernel, and `Sandbox.run` beside that kernel.

The issue's targets: `Sandbox.run` ≤ 1.1× `Client.run`, first byte ≤ 20 ms, `run_code` p50 ≤ 10 ms.
"""

from __future__ import annotations

import argparse
import time

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, environment, median, percentile, report

TAG = "bench-sandbox"


def _measure(rounds: int, firsts: int) -> dict[str, list[float]]:
    from broker.client import Client

    found: dict[str, list[float]] = {"sandbox_run": [], "client_run": [], "streamed_run": [], "first_byte": [],
                                     "run_code": [], "beside_kernel": []}
    with Client() as fp, fp.sandbox(TAG, pool="cpu") as sb:
        for _ in range(5):  # warm the session's pod and both paths
            sb.run("echo hi")
            fp.run(["bash", "-c", "echo hi"], lease_tag=TAG, recycle=False)
        for _ in range(rounds):
            t0 = time.perf_counter()
            r = sb.run("echo hi")
            found["sandbox_run"].append(time.perf_counter() - t0)
            assert r.stdout == "hi\n", r
            t0 = time.perf_counter()
            job = fp.run(["bash", "-c", "echo hi"], lease_tag=TAG, recycle=False)
            found["client_run"].append(time.perf_counter() - t0)
            assert job.exit_code == 0, job
            t0 = time.perf_counter()
            sb.run("echo hi", on_stdout=lambda _: None)
            found["streamed_run"].append(time.perf_counter() - t0)
        for _ in range(firsts):
            seen: list[float] = []

            def arrived(text: str, seen: list[float] = seen) -> None:
                now = time.time()
                seen.extend(now - float(line) for line in text.split() if line.replace(".", "", 1).isdigit())

            sb.run("date +%s.%N; sleep 0.2; date +%s.%N", on_stdout=arrived)
            found["first_byte"].extend(seen[:2])
        sb.run_code("x = 41")
        for _ in range(rounds):
            t0 = time.perf_counter()
            text = sb.run_code("x + 1").text
            found["run_code"].append(time.perf_counter() - t0)
            assert text == "42", text
        for _ in range(rounds):
            t0 = time.perf_counter()
            sb.run("echo hi")
            found["beside_kernel"].append(time.perf_counter() - t0)
    return found


def _rows(found: dict[str, list[float]]) -> list[Row]:
    ms = {k: [1000 * v for v in vals] for k, vals in found.items()}
    sandbox, client = median(ms["sandbox_run"]), median(ms["client_run"])
    ratio = sandbox / client
    first = median(ms["first_byte"])
    code = median(ms["run_code"])
    return [
        Row("B17", "Sandbox.run warm round trip p50 (ms)", sandbox, "ms", "-", "-"),
        Row("B17", "Client.run warm round trip p50, same session (ms)", client, "ms", "-", "-"),
        Row("B17", "Sandbox.run / Client.run", ratio, "x", "-", "<= 1.1x", at_most(ratio, 1.1)),
        Row("B17", "Sandbox.run with on_stdout (NDJSON streamed) / Client.run", median(ms["streamed_run"]) / client,
            "x", "-", "-"),
        Row("B17", "first byte of streamed output after the job printed it, p50 (ms)", first, "ms", "-", "<= 20 ms",
            at_most(first, 20.0)),
        Row("B17", "first byte p90 (ms)", percentile(ms["first_byte"], 90), "ms", "-", "-"),
        Row("B17", "run_code `x + 1` round trip p50 (ms)", code, "ms", "-", "<= 10 ms", at_most(code, 10.0)),
        Row("B17", "run_code p90 (ms)", percentile(ms["run_code"], 90), "ms", "-", "-"),
        Row("B17", "Sandbox.run beside the live kernel p50 (ms)", median(ms["beside_kernel"]), "ms", "-", "-"),
    ]


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench sandbox", description=__doc__)
    parser.add_argument("--rounds", type=int, default=100, help="round trips per path (interleaved)")
    parser.add_argument("--firsts", type=int, default=20, help="first-byte samples (two lines each)")
    args = parser.parse_args(argv)
    with BenchBroker() as broker, environment({"FIREPOOL_URL": broker.url, "FIREPOOL_TOKEN": broker.tokens["bench"]}):
        found = _measure(args.rounds, args.firsts)
    return report("sandbox_sdk", _rows(found), json_out=json_out, extra={"raw": found})
