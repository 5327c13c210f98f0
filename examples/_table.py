"""Shared printing for the examples: progress while a loop runs, then one aligned row per job and a summary.

Progress is a rich progress bar on a terminal and one line per finished job otherwise (a log, CI, `make demo
| tee`), so something is always moving while the loop runs.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from broker.client import JobInfo

_console = Console(no_color=not sys.stdout.isatty(), highlight=False, width=None if sys.stdout.isatty() else 200)


def run_time(job: JobInfo) -> float | None:
    t = job.timings
    if "first_instruction_at" in t and "finished_at" in t:
        return t["finished_at"] - t["first_instruction_at"]
    return None


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds is not None else "-"


class LoopProgress:
    """`with LoopProgress("agent loop", total) as p: ... p.done(label, job)` from any thread."""

    def __init__(self, title: str, total: int) -> None:
        self.title, self.total, self.count = title, total, 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> LoopProgress:
        if _console.is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[last]}"), TimeElapsedColumn(), console=_console)
            self._bar.start()
            self._task = self._bar.add_task(self.title, total=self.total, last="")
        else:
            _console.print(f"{self.title}: {self.total} jobs, a line as each finishes")
        return self

    def done(self, label: str, job: JobInfo) -> None:
        with self._lock:
            self.count += 1
            note = f"{label}: {job.state.lower()} on a {job.path or '?'} pod, submit->first {_ms(job.start_latency)}"
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, advance=1, last=note)
            else:
                elapsed = time.monotonic() - self.started
                _console.print(f"  [{elapsed:5.1f}s] {self.count:>3}/{self.total} {note}")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()


def print_table(title: str, rows: Sequence[tuple[str, JobInfo]]) -> None:
    """`rows` are (step label, final job)."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, right in (("step", False), ("job", False), ("caller", False), ("tag", False), ("path", False),
                        ("submit->first", True), ("run", True), ("state", False)):
        table.add_column(name, justify="right" if right else "left", no_wrap=True)
    for label, job in rows:
        run = run_time(job)
        table.add_row(label, job.id, job.caller, job.raw.get("lease_tag", ""), job.path or "-",
                      _ms(job.start_latency), f"{run:.2f} s" if run is not None else "-", job.state)
    _console.print(f"\n{title}")
    _console.print(table)
    paths = Counter(job.path for _, job in rows)
    lats = sorted(j.start_latency for _, j in rows if j.start_latency is not None)
    warm = [j.start_latency for _, j in rows if j.path == "warm" and j.start_latency is not None]
    summary = ", ".join(f"{p}: {n}" for p, n in sorted(paths.items(), key=lambda kv: str(kv[0])))
    _console.print(f"paths: {summary}")
    if lats:
        _console.print(f"submit->first instruction: p50 {statistics.median(lats) * 1000:.0f} ms over {len(lats)} jobs"
                       + (f"; warm p50 {statistics.median(warm) * 1000:.0f} ms" if warm else ""))
