"""What the CLI prints: aligned tables and progress lines through rich, plain text when not on a terminal.

On a terminal rich sizes tables to the window and may colour; piped (`firepool jobs | grep ...`) there is
no colour and no wrapping, so each row stays one line for the next program.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

COMMAND_WIDTH = 48
"""A job's command shown in a table: argv joined as a shell would read it, cut to this many characters."""


def console(stream: TextIO | None = None) -> Console:
    """A console on `stream` (stdout by default): terminal width on a TTY, unlimited when piped."""
    stream = stream or sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else 100_000, no_color=not tty, highlight=False,
                   soft_wrap=not tty, emoji=False, markup=False)


def one_line_command(argv: Sequence[str], width: int = COMMAND_WIDTH) -> str:
    """argv joined on one line (newlines in a `-c` script shown as `⏎`), shortened with an ellipsis."""
    text = shlex.join(argv).replace("\r", "").replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def cell(value: Any) -> str:
    return "" if value is None else str(value)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str], *, right: Sequence[str] = ()) -> Table:
    """An aligned table without borders (so `grep` and `cut` still work on it); `right` columns are numbers."""
    t = Table(box=None, show_edge=False, pad_edge=False, header_style="bold", highlight=False)
    for name in header:
        t.add_column(name, justify="right" if name in right else "left", no_wrap=True, overflow="ellipsis")
    for row in rows:
        t.add_row(*(cell(c) for c in row))
    return t


def print_table(rows: Sequence[Sequence[Any]], header: Sequence[str], *, right: Sequence[str] = (),
                stream: TextIO | None = None) -> None:
    console(stream).print(table(rows, header, right=right))


def printed_json(wanted: bool, data: Any) -> bool:
    """With --json (`wanted`): print `data` as indented JSON and return True (the command has answered)."""
    if wanted:
        print(json.dumps(data, indent=2))
    return wanted
