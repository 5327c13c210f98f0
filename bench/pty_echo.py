"""PTY echo round trip through the broker's terminal websocket (issue 23's target: p50 <= 10 ms on loopback).

`echo_round_trips(url, token, tag)` opens a terminal in the caller's live session TAG, switches the remote
terminal to raw mode without echo-suppression (`stty raw`, so each key comes back alone and at once), then
times `n` single keystrokes from the `stdin` frame sent to the `stdout` frame that carries the key back:
client -> broker -> agent -> PTY line discipline -> agent -> broker -> client. `bench/one_door.py` calls it.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from broker.cli_shell import terminal_socket


def _until(ws: Any, needle: str, timeout: float = 10.0) -> None:
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        message = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if message[0] == "stdout":
            seen += message[1]
        elif message[0] == "exit":
            raise RuntimeError(f"the terminal exited ({message[1]}) before {needle!r} came back")


def echo_round_trips(url: str, token: str, tag: str, n: int = 200, queue: str = "default") -> dict[str, float]:
    """Keystroke echo round trips through the broker: p50, p90, p99 and mean in ms, and the count."""
    # `cat` on a raw terminal: every byte is echoed by the line discipline as it arrives, never buffered.
    with terminal_socket(url, token, tag, queue=queue, command="stty raw echo; echo READY; exec cat") as ws:
        _until(ws, "READY")
        times = []
        for i in range(n):
            key = "abcdefghijklmnopqrstuvwxyz"[i % 26]
            began = time.perf_counter()
            ws.send(json.dumps(["stdin", key]))
            _until(ws, key)
            times.append((time.perf_counter() - began) * 1000)
        ws.send(json.dumps(["signal", "SIGKILL"]))
    times.sort()
    return {"n": float(n), "p50_ms": statistics.median(times), "p90_ms": times[int(n * 0.9) - 1],
            "p99_ms": times[max(0, int(n * 0.99) - 1)], "mean_ms": statistics.fmean(times)}
