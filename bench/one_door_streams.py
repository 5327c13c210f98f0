"""The one-door benchmark's port and terminal figures (bench/one_door.py runs them).

- A 10 MB download from `python -m http.server` in a session's sandbox (a `network: host` pool, so the
  server is also reachable directly): through the broker's port proxy `/v1/sessions/{tag}/ports/{port}/{path}`
  with the caller's token, against the same file fetched directly, same run.
- A PTY echo round trip over `/v1/sessions/{tag}/terminal` (JSON frames `["stdin", s]` -> `["stdout", s]`):
  one key sent, until the terminal echoes it back.

A broker without the endpoint (404) gets one "not available" row each instead. Where the checkout has the
ports and terminal work's own helpers (bench/port_proxy.py, bench/pty_echo.py), their measurements are used:
the proxy against the same server code run on the host, and keystrokes on a raw-mode `cat`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

BLOB_BYTES = 10 << 20


@dataclass
class StreamFigures:
    proxy_s: list[float] = field(default_factory=list)
    direct_s: list[float] = field(default_factory=list)
    direct_what: str = "directly from the sandbox"
    pty_rtt_s: list[float] = field(default_factory=list)
    pty_ms: dict[str, float] = field(default_factory=dict)
    """p50_ms, p90_ms, n."""
    ports_missing: str | None = None
    terminal_missing: str | None = None


def helper(name: str) -> Any | None:
    """A sibling benchmark module when this checkout has it (the ports and terminal work bring theirs)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return None


def owners_ports(broker: Any, runs: int, found: StreamFigures) -> bool:
    """bench/port_proxy.py's measurement (pool `cpu`), when present."""
    proxy = helper("bench.port_proxy")
    if proxy is None:
        return False
    measured = proxy.measure(broker, runs=runs)
    found.proxy_s, found.direct_s = list(measured["proxied_s"]), list(measured["direct_s"])
    found.direct_what = "the same server on the host"
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _download(client: httpx.Client, url: str) -> float:
    began = time.perf_counter()
    size = 0
    with client.stream("GET", url) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes(1 << 16):
            size += len(chunk)
    if size != BLOB_BYTES:
        raise RuntimeError(f"downloaded {size} bytes of {BLOB_BYTES}")
    return time.perf_counter() - began


def _server_job(client: httpx.Client, pool: str, tag: str, port: int) -> str:
    """A job in session `tag` that writes the blob and serves its workspace on `port`; its id."""
    script = (f"head -c {BLOB_BYTES} /dev/urandom > blob && "
              f"exec python3 -m http.server {port} --bind 127.0.0.1")
    body = {"pool": pool, "command": ["sh", "-c", script], "lease_tag": tag, "timeout_s": 600}
    response = client.post("/v1/jobs", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


def _wait_served(url: str, job: str, client: httpx.Client, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.head(f"{url}/blob", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        state = client.get(f"/v1/jobs/{job}").json()["state"]
        if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            raise RuntimeError(f"the sandbox's http.server job ended ({state})")
        time.sleep(0.1)
    raise RuntimeError("the sandbox's http.server never answered")


def ports(client: httpx.Client, pool: str, tag: str, repeats: int, found: StreamFigures) -> str:
    """Start the server job (it also keeps the session's sandbox for the terminal); its id."""
    port = _free_port()
    job = _server_job(client, pool, tag, port)
    direct = f"http://127.0.0.1:{port}"
    _wait_served(direct, job, client)
    proxied = f"/v1/sessions/{quote(tag, safe='')}/ports/{port}/blob"
    with client.stream("GET", proxied) as probe:
        if probe.status_code == 404:
            found.ports_missing = f"GET /v1/sessions/{{tag}}/ports/{port}/blob: 404 {probe.read()[:120]!r}"
            return job
    if repeats <= 0:
        return job
    with httpx.Client(timeout=120) as plain:
        _download(plain, direct + "/blob")
        _download(client, proxied)  # both warm
        for _ in range(repeats):
            found.direct_s.append(_download(plain, direct + "/blob"))
            found.proxy_s.append(_download(client, proxied))
    return job


async def _terminal(url: str, token: str, tag: str, repeats: int, found: StreamFigures) -> None:
    ws_url = url.replace("http", "ws", 1) + f"/v1/sessions/{quote(tag, safe='')}/terminal"
    try:
        ws = await connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30,
                           compression=None, ping_interval=None)
    except InvalidStatus as exc:
        # No such websocket route: Starlette refuses the upgrade with 403 before any handler runs.
        if exc.response.status_code in (403, 404):
            found.terminal_missing = f"WS /v1/sessions/{{tag}}/terminal: {exc.response.status_code}"
            return
        raise
    async with ws:
        await ws.send(json.dumps(["set_size", 24, 80]))
        await _until(ws, lambda text: bool(text), 30)  # the shell's prompt
        for i in range(repeats):
            key = "abcdefghijklmnopqrstuvwxyz"[i % 26]
            began = time.perf_counter()
            await ws.send(json.dumps(["stdin", key]))
            await _until(ws, lambda text, key=key: key in text, 10)
            found.pty_rtt_s.append(time.perf_counter() - began)
            if i % 26 == 25:
                await ws.send(json.dumps(["stdin", "\x15"]))  # ^U: kill the line
                await asyncio.sleep(0.05)
        await ws.send(json.dumps(["stdin", "\x15exit\n"]))


async def _until(ws: Any, match: Any, timeout_s: float) -> str:
    """Read stdout frames until `match(text so far)`; the text."""
    seen = ""
    deadline = time.monotonic() + timeout_s
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic())))
        if frame[0] == "stdout":
            seen += str(frame[1])
            if match(seen):
                return seen
        elif frame[0] == "exit":
            raise RuntimeError(f"the terminal exited ({frame[1:]}) before it echoed")


def terminal(url: str, token: str, tag: str, repeats: int, found: StreamFigures) -> None:
    """Echo round trips in the live session `tag` (bench/pty_echo.py's when present)."""
    pty = helper("bench.pty_echo")
    if pty is not None:
        found.pty_ms = dict(pty.echo_round_trips(url, token, tag, n=repeats))
        return
    asyncio.run(_terminal(url, token, tag, repeats, found))
    if found.pty_rtt_s:
        times = sorted(t * 1000.0 for t in found.pty_rtt_s)
        found.pty_ms = {"p50_ms": times[len(times) // 2], "p90_ms": times[int(len(times) * 0.9) - 1],
                        "n": float(len(times))}
