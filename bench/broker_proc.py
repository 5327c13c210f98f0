"""A throwaway `firepool serve` for benchmarks: its own state dir, a free port, one token per caller."""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx


def free_port() -> int:
    """A free TCP port on 127.0.0.1 below the kernel's ephemeral range (ip_local_port_range): a broker restarted
    on it finds it still free, where a port the kernel hands out (bind to port 0, a connection's source port) may
    meanwhile be taken by any other process's socket."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    for port in random.sample(range(max(1024, ephemeral - 16384), ephemeral), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BenchBroker:
    def __init__(self, *, callers: tuple[str, ...] = ("bench",), pools: str | None = None,
                 extra: tuple[str, ...] = (), admins: tuple[str, ...] = ()) -> None:
        """`admins`: callers marked admin (they read /metrics)."""
        self.dir = Path(tempfile.mkdtemp(prefix="fp-bench-"))
        self.tokens = {c: secrets.token_hex(16) for c in (*callers, *admins)}
        (self.dir / "tokens.json").write_text(json.dumps({t: {"caller": c, "admin": True} if c in admins else c
                                                          for c, t in self.tokens.items()}))
        (self.dir / "tokens.json").chmod(0o600)  # plain tokens: `firepool mcp --broker-tokens` refuses an open file
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "broker.cli", "serve", "--port", str(self.port), "--state-dir",
               str(self.dir / "state"), "--tokens", str(self.dir / "tokens.json"), "--log-level", "warning", *extra]
        if pools:
            (self.dir / "pools.yaml").write_text(pools)
            cmd += ["--pools", str(self.dir / "pools.yaml")]
        self.log = open(self.dir / "broker.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((self.dir / "broker.log").read_text()[-2000:])
            try:
                if httpx.get(self.url + "/healthz", timeout=1).json().get("ok"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("benchmark broker did not start")
            time.sleep(0.05)

    def client(self, caller: str = "bench") -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[caller]}"},
                            timeout=120)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BenchBroker:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
