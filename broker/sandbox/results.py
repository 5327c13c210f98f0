"""What a sandbox's calls return: a command's result (`CommandResult`) and a cell's (`CodeResult`)."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from broker.errors import FirepoolError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class CommandResult:
    """A command that ran to its end (or its timeout) in the sandbox."""

    exit_code: int | None
    """As a shell reports it: 128 + the signal's number when killed (a timeout: 137); None when it never got to
    an exit status (cancelled before it ran, the sandbox lost)."""
    stdout: str
    stderr: str
    state: str
    error_class: str | None = None
    job_id: str = ""
    """The broker job it ran as; while the session's kernel is live, the kernel's job (it ran beside it)."""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def timed_out(self) -> bool:
        return self.error_class == "Timeout"

    def check(self) -> CommandResult:
        """Itself when the command exited 0; else CommandFailed with its exit code and the end of stderr."""
        if not self.ok:
            raise CommandFailed(self)
        return self


class CommandFailed(FirepoolError):
    """A command of `Sandbox.run(..., check=True)` did not exit 0."""

    def __init__(self, result: CommandResult) -> None:
        how = f"exit code {result.exit_code}" if result.exit_code is not None else result.error_class or result.state
        tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
        super().__init__(f"the command failed ({how})" + (f": {tail[0][:300]}" if tail else ""),
                         {"exit_code": result.exit_code, "job": result.job_id})
        self.result = result


@dataclass(frozen=True)
class CodeError:
    name: str
    value: str
    traceback: str
    """The kernel's traceback, plain text (no terminal colours)."""

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass(frozen=True)
class CodeResult:
    """One cell's outcome in the session's live kernel."""

    text: str | None
    """The cell's value as text (`text/plain` of its execute_result), None when it had none."""
    stdout: str
    stderr: str
    results: list[dict[str, Any]] = field(default_factory=list)
    """Every rich output in order (display_data and the execute_result): MIME type -> data (`image/png` base64,
    `text/html` for a DataFrame, ...)."""
    error: CodeError | None = None
    execution_count: int | None = None
    timed_out: bool = False
    """The cell ran past its timeout and was interrupted (the kernel and its state stay)."""

    @property
    def data(self) -> dict[str, Any]:
        """The execute_result's MIME bundle ({} when the cell had no value)."""
        return next((r for r in reversed(self.results) if r.get("_kind") == "execute_result"), {})

    @property
    def images(self) -> list[bytes]:
        """PNG images the cell displayed (a matplotlib figure, ...), decoded."""
        return [base64.b64decode(r["image/png"]) for r in self.results if isinstance(r.get("image/png"), str)]

    def check(self) -> CodeResult:
        """Itself when the cell raised nothing; else CodeFailed."""
        if self.error is not None:
            raise CodeFailed(self.error)
        return self

    @classmethod
    def of(cls, stdout: str, stderr: str, outputs: list[dict[str, Any]], error: dict[str, Any] | None,
           execution_count: int | None, timed_out: bool) -> CodeResult:
        results = [{**o.get("data", {}), "_kind": o.get("kind")} for o in outputs]
        value = next((r.get("text/plain") for r in reversed(results) if r["_kind"] == "execute_result"), None)
        err = None
        if error is not None:
            tb = "\n".join(str(line) for line in error.get("traceback") or [])
            err = CodeError(str(error.get("ename") or "Error"), str(error.get("evalue") or ""), ANSI.sub("", tb))
        return cls(text=value, stdout=stdout, stderr=stderr, results=results, error=err,
                   execution_count=execution_count, timed_out=timed_out)


class CodeFailed(FirepoolError):
    """A cell of `Sandbox.run_code(..., check=True)` raised."""

    def __init__(self, error: CodeError) -> None:
        super().__init__(str(error), {"name": error.name})
        self.error = error
