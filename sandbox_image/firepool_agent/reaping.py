"""The one place that waits for children: reaps every zombie and hands rank-0 exits to their attempts.

As PID 1 or a subreaper the agent inherits every orphan of every job, so a single thread calls
`waitpid(-1)` in a loop. Nothing else may wait on children (subprocess's own `wait` would race it);
a launch registers its pid under `lock` while spawning, so an exit can never be reaped unclaimed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

ExitCallback = Callable[[int, float], None]
"""Called with the raw wait status and the time it was reaped."""


class Reaper:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        """Held while spawning and registering, so the reaper dispatches only after registration."""
        self._watch: dict[int, ExitCallback] = {}
        self._children = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self, pid: int, callback: ExitCallback) -> None:
        """Call `callback` when `pid` exits; the caller holds `lock` since before spawning it."""
        self._watch[pid] = callback
        self._children.set()

    def spawned(self) -> None:
        """Wake the reaper after a spawn that is not watched."""
        self._children.set()

    def _run(self) -> None:
        while True:
            # Clear before waiting: a child spawned after this point sets the event again.
            self._children.clear()
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                self._children.wait(1.0)
                continue
            except InterruptedError:
                continue
            reaped_at = time.time()
            with self.lock:
                callback = self._watch.pop(pid, None)
            if callback is not None:
                try:
                    callback(status, reaped_at)
                except Exception:
                    log.exception("exit callback for pid %d failed", pid)
