"""`firepool submit --from FILE`: many jobs from JSON Lines in one batch request per 1000, followed to their ends.

Each line is an argv array or a job body object (`command` and any POST /v1/jobs field); `submit`'s options are
every line's defaults. Progress goes to stderr (a bar on a terminal, a plain line every few seconds otherwise);
stdout gets one line per job in the file's order (or its JSON), so the n-th output line is the n-th job.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from typing import Any, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from broker.cli_commands import UsageError, checked_requirements, client_of, submit_fields
from broker.cli_output import console
from broker.client_core import JobInfo
from broker.errors import FirepoolError
from broker.fanout import InOrder, Item

PLAIN_EVERY_S = 5.0
"""Off a terminal, a progress line this often (and one at the end)."""


def read_items(source: str, stdin: TextIO | None = None) -> tuple[list[Item], list[int]]:
    """The jobs of a JSON Lines file (`-`: stdin) and the line number of each; UsageError naming the line that
    is not a job. Blank lines are skipped."""
    try:
        if source == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(source, encoding="utf-8") as f:
                text = f.read()
    except FileNotFoundError:
        raise UsageError(f"--from {source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--from {source}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    items: list[Item] = []
    numbers: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--from {source} line {number}: not JSON ({exc.msg})") from None
        argv = item.get("command") if isinstance(item, dict) else item
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise UsageError(f"--from {source} line {number}: a job is an argv array of strings or an object "
                             f"with a `command` array")
        items.append(item)
        numbers.append(number)
    if not items:
        raise UsageError(f"--from {source}: no jobs in it")
    return items, numbers


class FanoutProgress:
    """done/total, failed and jobs/s on stderr: a rich bar on a terminal, else a line every PLAIN_EVERY_S."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.out = console(stream or sys.stderr)
        self.started = self.last_line = time.monotonic()
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self) -> FanoutProgress:
        if self.out.is_terminal:
            self.bar = Progress(TextColumn("jobs"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
                                TimeElapsedColumn(), console=self.out)
            self.bar.start()
            self.task = self.bar.add_task("jobs", total=self.total, note=self.note())
        return self

    def note(self) -> str:
        rate = self.done / max(time.monotonic() - self.started, 1e-6)
        return f"{self.failed} failed, {rate:.1f} jobs/s"

    def line(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s] {self.done}/{self.total} done, {self.note()}"

    def finished(self, job: JobInfo) -> None:
        self.done += 1
        self.failed += job.state != "SUCCEEDED"
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=self.done, note=self.note())
        elif time.monotonic() - self.last_line >= PLAIN_EVERY_S:
            self.out.print(self.line())
            self.last_line = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
        self.out.print(self.line())


def job_line(job: JobInfo) -> str:
    error = f" error={job.error_class}" if job.error_class else ""
    return f"{job.id} {job.state} exit={'' if job.exit_code is None else job.exit_code}{error}"


def follow(finished: Iterable[JobInfo], ids: list[str], as_json: bool, progress: FanoutProgress) -> None:
    """Each finished job counted at once, printed when every job before it in the file is printed."""
    order = InOrder(ids)
    for job in finished:
        progress.finished(job)
        for due in order.add(job):
            print(json.dumps(due.raw) if as_json else job_line(due), flush=True)


def cmd_submit_from(args: argparse.Namespace) -> int:
    """`firepool submit --from FILE`: exit 0 when every job succeeded, else 1."""
    if [a for a in args.command if a != "--"]:
        raise UsageError("--from FILE takes its jobs from the file: give no command after --")
    items, numbers = read_items(args.from_file)
    requirements = checked_requirements(args)
    with client_of(args) as fp:
        defaults: dict[str, Any] = submit_fields(args, fp, requirements)
        try:
            jobs = fp.submit_many(items, pool=args.pool, **defaults)
        except FirepoolError as exc:
            index = exc.details.get("index")
            if isinstance(index, int) and 0 <= index < len(numbers):  # the broker counts jobs; the user, lines
                exc.message = f"--from {args.from_file} line {numbers[index]}: {exc.message}"
            raise
        ids = [j.id for j in jobs]
        with FanoutProgress(len(set(ids))) as progress:
            follow(fp.as_completed(ids), ids, args.json, progress)
            failed = progress.failed
    return 1 if failed else 0
