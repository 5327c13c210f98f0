"""When a conversation's live kernel must end: the pool's keep-alive, and a hold broken at the ceiling.

A live kernel is a running job: it keeps its pod (and its GPU) for as long as it lives. An idle
conversation must not pin that forever, so the kernel follows the rules a held pod follows (paper §7):
it ends after `caller_hold_seconds` (which inherits `idle_timeout`) without a call, and earlier when the
pool has queued demand blocked at its ceiling and the kernel has been idle at least `min_idle_at_ceiling`.
Pure functions over a clock reading and the pool's `GET /v1/pools` view, so tests run on virtual time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MIN_IDLE_AT_CEILING_S = 60.0
"""A kernel idle for less than this keeps its pod even when the pool is blocked (as a hold's tenure)."""
WATCHDOG_MARGIN_S = 60.0
"""How long past the keep-alive a kernel whose MCP server went away ends itself."""
MIN_TICK_S = 0.5
MAX_TICK_S = 15.0

KEEP_ALIVE = "keep-alive"
CEILING = "ceiling"


@dataclass(frozen=True)
class Pressure:
    """What of one pool's view decides a kernel's life."""

    keep_alive: float
    """Seconds a kernel may sit idle (inf: no limit)."""
    blocked: bool
    """Queued demand and no room under the ceiling."""


def _seconds(value: Any) -> float:
    if value is None:
        return math.inf
    return float(value)


def pressure_of(view: dict[str, Any]) -> Pressure:
    """The pressure of a pool as `GET /v1/pools` reports it (an unbounded knob is null)."""
    hold = view.get("caller_hold_seconds")
    keep = _seconds(hold if hold is not None else view.get("idle_timeout"))
    ceiling = _seconds(view.get("max_count"))
    blocked = int(view.get("queued_demand") or 0) > 0 and float(view.get("physical") or 0) >= ceiling
    return Pressure(keep_alive=keep, blocked=blocked)


def end_reason(now: float, last_used: float, busy: bool, pressure: Pressure,
               min_idle_at_ceiling: float = MIN_IDLE_AT_CEILING_S) -> str | None:
    """Why the kernel should end now (KEEP_ALIVE or CEILING), or None to keep it. A busy kernel stays."""
    if busy:
        return None
    idle = now - last_used
    if idle >= pressure.keep_alive:
        return KEEP_ALIVE
    if pressure.blocked and idle >= min(min_idle_at_ceiling, pressure.keep_alive):
        return CEILING
    return None


def tick(pressure: Pressure, min_idle_at_ceiling: float = MIN_IDLE_AT_CEILING_S) -> float:
    """How often to look again: a quarter of the shorter limit, within [MIN_TICK_S, MAX_TICK_S]."""
    return min(MAX_TICK_S, max(MIN_TICK_S, min(pressure.keep_alive, min_idle_at_ceiling) / 4))


def watchdog_seconds(pressure: Pressure, margin: float = WATCHDOG_MARGIN_S) -> float | None:
    """The in-kernel watchdog's limit: past the keep-alive, for a kernel whose MCP server went away."""
    return None if math.isinf(pressure.keep_alive) else pressure.keep_alive + margin
