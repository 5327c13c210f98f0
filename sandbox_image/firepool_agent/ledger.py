"""The agent's record of the attempts it started: one line per attempt, appended before the attempt's user code
can run.

One write, no fsync: the line is in the host's page cache when the code starts, so it outlives a killed agent,
pod or broker, the failures it vouches for. A host crash ends every attempt with the host, and the local pods
it would vouch for with them. An fsync an attempt cost the pods' agents 0.1-0.4 ms of CPU a job and a
16-pod fan-out 6-23 % of its jobs/s (four alternating pairs, docs/benchmarks.md).

The file is not reachable from any job: the pod's launcher opens it on the host (outside every
sandbox) and hands the agent only an O_APPEND file descriptor, which jobs never inherit (they are
spawned with close_fds) and cannot take from the agent (it is non-dumpable, so its /proc/fd is
root's). It outlives the pod, so the record of an attempt on a deleted pod can still be read: this is
how a crash test proves that no attempt id ran twice.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path


class Ledger:
    """Appends `{"attempt", "pod", "at"}` lines to an inherited file descriptor, one write each."""

    def __init__(self, fd: int, pod: str) -> None:
        os.set_inheritable(fd, False)
        self.fd = fd
        self.pod = pod
        self._lock = threading.Lock()

    def started(self, attempt_id: str) -> None:
        """Record that `attempt_id` is about to run user code; in the host's page cache when this returns."""
        line = json.dumps({"attempt": attempt_id, "pod": self.pod, "at": time.time()}) + "\n"
        with self._lock:
            os.write(self.fd, line.encode())  # one O_APPEND write: lines never interleave


def read_ledger(paths: Iterable[Path]) -> Iterator[dict[str, object]]:
    """Every record in these ledger files; a torn last line (a host crash mid-write) is skipped."""
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("attempt"), str):
                yield record
