"""Jinja2 filters the dashboard's templates use: times, durations and byte sizes in plain words."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from broker.ui.commands import display_command


def when(ts: float | None) -> str:
    """An epoch time as UTC `YYYY-MM-DD HH:MM:SS`; a dash when absent."""
    if not ts:
        return "—"
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def bucket(bound: str) -> str:
    """A latency bucket's upper bound (seconds, or `+Inf`) in words: `5 ms`, `2.5 s`, `more`."""
    if bound == "+Inf":
        return "more"
    seconds = float(bound)
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def elapsed(started: float | None, ended: float | None, now: float) -> str:
    """A job's run time: started -> ended, `running for ...` while it runs, a dash if it never started.
    app.js's `elapsed` writes the same text for live rows."""
    if not started:
        return "—"
    if ended:
        return duration(max(0.0, ended - started))
    return f"running for {duration(max(0.0, now - started))}"


def placeable(shapes: dict[str, int] | None) -> str:
    """`largest_placeable` in words: `1 GPU: 6, 2 GPUs: 3, ..., whole nodes: 1`; a dash without nodes.
    app.js's `placeable` writes the same text for the live update."""
    if not shapes:
        return "—"
    keys = sorted(shapes, key=lambda k: (0, int(k), k) if k.isdigit() else (1, 0, k))
    return ", ".join(f"{_shape(k)}: {shapes[k]}" for k in keys)


def _shape(key: str) -> str:
    if key == "node":
        return "whole nodes"
    return f"{key} GPU" if key == "1" else f"{key} GPUs" if key.isdigit() else key


def size(n: int | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def filters() -> dict[str, Callable[..., Any]]:
    return {"when": when, "duration": duration, "size": size, "elapsed": elapsed, "bucket": bucket, "placeable": placeable, "command": display_command}
