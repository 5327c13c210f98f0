"""The orphan watch: a pod that no broker has spoken to for `orphan_after_s` ends its sandbox on its own.

A pod outlives its broker by design (a restarted broker re-attaches to its jobs), but not forever: when
every broker is gone (stopped for good, cut off, or deposed with no successor that knows the pod), the pod
would hold its GPUs and run its job for nobody. The leader probes every pod well within the bound
(`broker.running.heartbeat`), so a live leader never lets one orphan itself; only requests of a current term
count (`terms`): a deposed broker's polls keep nothing alive. Past the bound the agent kills every attempt
process and exits; as the sandbox's PID 1 its exit ends the sandbox (the local backend's bwrap, a Kubernetes
pod with restartPolicy Never). 0 turns the watch off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from firepool_agent import proctree
from firepool_agent.terms import Terms

log = logging.getLogger(__name__)

DEFAULT_AFTER_S = 300.0
"""The default bound (`--orphan-after-s`, env FIREPOOL_AGENT_ORPHAN_AFTER_S): ten of the leader's probes."""
ENV = "FIREPOOL_AGENT_ORPHAN_AFTER_S"
EXIT_STATUS = 3
"""The agent's exit status when it ended as an orphan (its log says why)."""


def end_sandbox(silent_s: float, after_s: float) -> None:
    """Kill every attempt process and exit now: nothing is flushed, attempt state lives only in memory."""
    log.error("orphaned: no broker request for %.0f s (orphan_after_s=%g); killing every attempt and exiting",
              silent_s, after_s)
    proctree.kill_all()
    logging.shutdown()
    os._exit(EXIT_STATUS)


class OrphanWatch:
    """Checks every `period_s` (a tenth of the bound, at most 5 s) whether a broker spoke within the bound."""

    def __init__(self, terms: Terms, after_s: float, end: Callable[[float, float], None] = end_sandbox) -> None:
        self.terms = terms
        self.after_s = after_s
        self.period_s = min(5.0, max(0.05, after_s / 10))
        self._end = end

    def due(self) -> float | None:
        """The silence in seconds when it passed the bound, else None."""
        silent = self.terms.silent_for()
        return silent if self.after_s > 0 and silent > self.after_s else None

    def start(self) -> threading.Thread | None:
        """Watch on a daemon thread; None when the bound is 0 (never)."""
        if self.after_s <= 0:
            return None
        thread = threading.Thread(target=self._run, name="orphan watch", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        while True:
            time.sleep(self.period_s)
            silent = self.due()
            if silent is not None:
                self._end(silent, self.after_s)
                return
