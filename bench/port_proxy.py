"""The port proxy's figures (docs/ports.md): a 10 MB download from a sandbox's `python3 -m http.server`
through `/v1/sessions/{tag}/ports/{port}/` against the same server code and client with no proxy between
(the sandbox's own port cannot be reached from the host: that is the point), and a small GET's latency.

`measure(broker)` is what `firepool bench one-door` reports; `python -m bench.port_proxy` prints it alone.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.broker_proc import BenchBroker

SIZE = 10 * 1024 * 1024
SERVER = ("import os, http.server, sys; os.makedirs('site', exist_ok=True); os.chdir('site'); "
          "open('big.bin', 'wb').write(b'x' * {size}); open('hello.txt', 'w').write('ok'); "
          "http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), "
          "http.server.SimpleHTTPRequestHandler).serve_forever()")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _download(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    n = 0
    with client.stream("GET", url) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            n += len(chunk)
    if n != SIZE:
        raise RuntimeError(f"downloaded {n} bytes of {SIZE}")
    return time.perf_counter() - start


def measure(broker: BenchBroker, caller: str = "bench", runs: int = 5, tag: str = "bench-ports") -> dict[str, Any]:
    """Best-of-`runs` 10 MB downloads, proxied and direct, interleaved (a busy host slows both alike), and
    the p50 of 30 small GETs through the proxy."""
    port = _free_port()
    with broker.client(caller) as c:
        job = c.post("/v1/jobs", json={"pool": "cpu", "lease_tag": tag, "timeout_s": 600,
                                       "command": ["python3", "-c", SERVER.format(size=SIZE), str(port)]}).json()
        path = f"/v1/sessions/{tag}/ports/{port}"
        deadline = time.monotonic() + 60
        while c.get(path + "/hello.txt").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the sandbox's server never answered through the proxy")
            time.sleep(0.2)
        with tempfile.TemporaryDirectory() as site:
            (Path(site) / "big.bin").write_bytes(b"x" * SIZE)
            direct_port = _free_port()
            server = subprocess.Popen([sys.executable, "-m", "http.server", str(direct_port), "--bind", "127.0.0.1"],
                                      cwd=site, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                with httpx.Client(timeout=60) as d:
                    direct_url = f"http://127.0.0.1:{direct_port}/big.bin"
                    while True:
                        try:
                            d.head(direct_url)
                            break
                        except httpx.ConnectError:
                            time.sleep(0.05)
                    proxied, direct = [], []
                    for _ in range(runs):
                        proxied.append(_download(c, path + "/big.bin"))
                        direct.append(_download(d, direct_url))
            finally:
                server.terminate()
                server.wait(10)
        small = []
        for _ in range(30):
            start = time.perf_counter()
            c.get(path + "/hello.txt").raise_for_status()
            small.append(time.perf_counter() - start)
        c.post(f"/v1/jobs/{job['id']}/cancel")
    best_proxy, best_direct = min(proxied), min(direct)
    return {"proxied_s": proxied, "direct_s": direct, "proxied_mb_s": SIZE / 1e6 / best_proxy,
            "direct_mb_s": SIZE / 1e6 / best_direct, "ratio": best_direct / best_proxy,
            "small_get_p50_ms": statistics.median(small) * 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.port_proxy", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with BenchBroker() as broker:
        print(json.dumps(measure(broker, runs=args.runs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
