"""A broker's leadership term: the fence every store write and every agent command carries.

Several brokers may serve one store; one leads (docs/ha.md). Each leadership has a term number that only grows.
The leader's term travels with each write (the store refuses a write whose term is no longer the newest) and with
each command to a pod's agent (`TERM_HEADER`; an agent refuses a term older than the newest it has seen). A broker
that meets a newer term was deposed while it paused or was cut off: it ends at once (`Term.deposed`) and restarts
as a standby, as leader-elected controllers do; nothing it still had in flight can land.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger("firepool.fencing")

TERM_HEADER = "X-Firepool-Term"
"""The header of every broker -> agent request that names the sender's term."""
DEFAULT_LEASE_S = 15.0
"""A leader silent this long is replaced (broker.store.leadership). A leader cut off from its store deposes itself
after 3/4 of it, so it rides through a shorter store outage (a database restart or fail-over) and a paused leader
is replaced within it (Kubernetes' leader election uses the same 15 s)."""
DEPOSED_EXIT = 75
"""The exit status of a deposed broker (EX_TEMPFAIL: start it again and it comes back a standby)."""


def _exit_now(reason: str) -> None:
    log.critical("deposed: %s; exiting at once (a newer leader owns the store and the pods)", reason)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - the exit must happen whatever a handler does
            pass
    os._exit(DEPOSED_EXIT)  # no cleanup: every pod and job now belongs to the new leader


class Term:
    """This broker's term: 0 until it leads, then the term the store granted it."""

    __slots__ = ("value", "_on_deposed")

    def __init__(self, value: int = 0, on_deposed: Callable[[str], None] = _exit_now) -> None:
        self.value = value
        self._on_deposed = on_deposed

    def deposed(self, reason: str) -> None:
        """A newer term exists: stop everything this broker does, now (the default ends the process)."""
        self._on_deposed(reason)

    def headers(self) -> dict[str, str]:
        return {TERM_HEADER: str(self.value)}
