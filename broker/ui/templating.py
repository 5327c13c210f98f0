"""Jinja2 filters the dashboard's templates use: times, durations and byte sizes in plain words."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any


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
    return {"when": when, "duration": duration, "size": size}
