"""The one place a health decision is announced: epoch invalidations, quarantines and releases.

Kinds: `epoch_invalidated` (a pod or node answered with another identity epoch than the recorded one,
or none was recorded: what was bound to it is dropped), `quarantined` (a device or node crossed the
failure threshold), `quarantine_released` (an operator let it back). Each carries what happened, to
what, why, and the detail an operator needs (failures, the jobs re-queued, the pods drained).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("firepool.health")

EPOCH_INVALIDATED = "epoch_invalidated"
QUARANTINED = "quarantined"
QUARANTINE_RELEASED = "quarantine_released"


@dataclass(frozen=True)
class Decision:
    kind: str
    subject: str
    why: str
    caller: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


class EventSink(Protocol):
    """Where decisions are recorded beside the log line: the broker's event log (broker.events.EventLog)."""

    def emit(self, kind: str, subject: str, why: str, cost_gpu_s: float | None = None, caller: str | None = None,
             detail: Mapping[str, Any] | None = None) -> object: ...


RECENT: list[Decision] = []
"""The last decisions of this process (newest last), for tests and the debug view; bounded."""
RECENT_MAX = 256


def decided(kind: str, subject: str, why: str, *, caller: str | None = None,
            detail: Mapping[str, Any] | None = None, events: EventSink | None = None) -> Decision:
    """Announce one health decision: a log line, and an event in `events` (`GET /v1/events`)."""
    decision = Decision(kind, subject, why, caller, dict(detail or {}))
    log.warning("%s %s: %s%s", kind, subject, why, f" {dict(detail)}" if detail else "")
    if events is not None:
        events.emit(kind, subject, why, None, caller, decision.detail)
    RECENT.append(decision)
    del RECENT[:-RECENT_MAX]
    return decision
