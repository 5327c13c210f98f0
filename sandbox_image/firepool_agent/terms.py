"""Broker terms as the agent sees them: the newest it was told of, and when a broker last spoke to it.

Several brokers may serve one store; one leads, with a term that only grows (the broker's `broker.fencing`).
Every broker request names its sender's term (`TERM_HEADER`; none is term 0: an old broker or a tool). The
agent keeps the newest term it has seen, in memory and, when it has a state directory, in a file there (an
agent restart keeps it). A request with a newer term raises it: the new leader's first probe after its
recovery teaches every agent its term. A request that changes anything (starts, signals or kills a process,
resets, receives a package: every POST and PUT, and the GETs that open a stream) with an older term comes from
a deposed leader that woke from a pause: it is refused (`StaleTerm`), logged (`stale term refused ...`, a line
the bench counts) and counted, and the deposed broker ends when it reads the answer. Reads stay open to all.

The same record tells the orphan watch (`orphan`) when the last request of a current broker arrived; a stale
term's requests do not count: a deposed broker owns nothing here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

TERM_HEADER = "X-Firepool-Term"
"""The header every broker request names its term in (the broker's `broker.fencing.TERM_HEADER`)."""
FILE = "term"
"""The file in the agent's state directory that keeps the newest term across agent restarts."""
STREAMS = frozenset({"terminal", "exec", "tunnel"})
"""The GET routes that open a stream (a process or a connection into the sandbox): changes, like a POST."""


class StaleTerm(Exception):
    """A changing request of a term older than the newest this agent has seen."""

    def __init__(self, sent: int, newest: int, what: str) -> None:
        super().__init__(f"{what} carries term {sent}, but term {newest} leads now: the sender was deposed")
        self.sent = sent
        self.newest = newest


def changes(method: str, route: str) -> bool:
    """Whether a request changes the pod: every POST and PUT, and the GETs that open a stream."""
    return method in ("POST", "PUT") or (method == "GET" and route in STREAMS)


def parse(value: str | None) -> int:
    """A request's term: its header's value, 0 without one; ValueError when it is not a count."""
    if value is None:
        return 0
    term = int(value.strip())
    if term < 0:
        raise ValueError("a term is never negative")
    return term


class Terms:
    """The newest term seen, the refusals of older ones, and the time of the last current broker request."""

    def __init__(self, state_dir: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self._path = Path(state_dir) / FILE if state_dir else None
        self._lock = threading.Lock()
        self._clock = clock
        self.newest = self._load()
        self.refused = 0
        """Changing requests refused for an older term since the agent started."""
        self.last_contact: float = self._now()
        """When the last request of a current broker (a term not older than the newest) arrived; the start
        counts as one, so a pod the broker never reached still ends after the orphan bound."""

    def _now(self) -> float:
        return self._clock()

    def _load(self) -> int:
        if self._path is None:
            return 0
        try:
            return max(0, int(self._path.read_text().strip() or 0))
        except (OSError, ValueError):
            return 0

    def _store(self, term: int) -> None:
        """Written to a temporary file, fsync'd and renamed: a crash leaves the old term or the new one."""
        if self._path is None:
            return
        temp = self._path.with_name(f".{FILE}.{os.getpid()}")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, f"{term}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, self._path)
        except OSError as exc:  # the term still holds in memory, for this agent's life
            log.warning("could not persist term %d in %s: %s", term, self._path, exc)

    def check(self, sent: int, changing: bool, what: str) -> None:
        """Take in a request's term; StaleTerm when it is older than the newest and the request changes the pod."""
        with self._lock:
            if sent > self.newest:
                log.info("term %d leads now (was %d)", sent, self.newest)
                self.newest = sent
                self._store(sent)
            if sent == self.newest:
                self.last_contact = self._now()
                return
            if not changing:
                return
            self.refused += 1
            newest, refused = self.newest, self.refused
        log.warning("stale term refused: %s with term %d < %d (%d refused so far)", what, sent, newest, refused)
        raise StaleTerm(sent, newest, what)

    def silent_for(self) -> float:
        """Seconds since the last request of a current broker."""
        with self._lock:
            return self._now() - self.last_contact
