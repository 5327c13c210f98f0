"""`map(fn, inputs)`: a Python function run once per input as jobs, its code shipped as a package.

The function must be a module-level function of a module file that imports on its own: the module's directory
(for a module in a package, the directory holding the top package) is packaged once per map with the SDK's
`package`, and each job runs a small runner with `python3 -c` that imports the module from the job's cwd, calls
the function with the JSON-decoded input and prints the JSON-encoded result on a marked last line of stdout.
So inputs and results are JSON (no tuples, sets, bytes or objects); a function of `__main__` is imported by
its file's name, so the script must guard its own top-level work with `if __name__ == "__main__":`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.client_core import JobInfo
from broker.errors import FirepoolError

RESULT_MARK = "\x1efirepool-map-result:"
"""Starts the stdout line that carries a call's JSON result (a record separator first: no print makes it)."""
LOG_TAIL_CHARS = 2000

RUNNER = f"""import importlib, json, sys
fn = importlib.import_module(sys.argv[1])
for name in sys.argv[2].split("."):
    fn = getattr(fn, name)
result = json.dumps(fn(json.loads(sys.argv[3])))
sys.stdout.flush()
sys.stdout.write("\\n{RESULT_MARK}" + result + "\\n")
"""
"""What each job runs (`python3 -c RUNNER module function input`); `python3 -c` puts the cwd, where the
package is unpacked, first on sys.path."""


class CallFailed(FirepoolError):
    """One call of `map(fn, inputs)` did not return: its job failed, or it ended without a result line.
    `job` is the job as it ended, `log_tail` the end of its combined output (the traceback, usually)."""

    def __init__(self, job: JobInfo, index: int, log_tail: str) -> None:
        if job.state == "SUCCEEDED":
            how = "it printed no result line"
        else:
            how = f"exit code {job.exit_code}" if job.exit_code not in (None, 0) else job.error_class or job.state
        last = log_tail.strip().splitlines()[-1:] if log_tail.strip() else []
        super().__init__(f"the call of input {index} failed in job {job.id} ({how})"
                         + (f": {last[0][:300]}" if last else ""),
                         {"job": job.id, "index": index, "state": job.state, "exit_code": job.exit_code})
        self.job = job
        self.log_tail = log_tail


@dataclass(frozen=True)
class CallSpec:
    """Where a function lives: the directory to package and what to import from it."""

    root: Path
    module: str
    function: str

    def command(self, value: Any) -> list[str]:
        """The argv of the job that calls the function on `value` (TypeError when it is not JSON)."""
        return ["python3", "-c", RUNNER, self.module, self.function, json.dumps(value)]


def call_spec(fn: Callable[[Any], Any]) -> CallSpec:
    """The CallSpec of a module-level function; TypeError for a lambda, a nested function or a method
    (which a job cannot import), and for one whose module is not a file."""
    qualname = getattr(fn, "__qualname__", "")
    name = getattr(fn, "__module__", None)
    if not qualname or "<" in qualname or "." in qualname or name is None:
        raise TypeError(f"map() runs a module-level function of an importable module; {fn!r} is not one "
                        "(a lambda, a nested function or a method cannot be imported by the job)")
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if not file or not str(file).endswith(".py"):
        raise TypeError(f"map() needs the source file of {name}.{qualname}; its module has none")
    path = Path(file).resolve()
    if name == "__main__":
        return CallSpec(path.parent, path.stem, qualname)
    root = path.parent
    for _ in range(name.count(".") + (path.name == "__init__.py")):
        root = root.parent  # to the directory holding the top package
    return CallSpec(root, name, qualname)


def call_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The job fields of a callable map: the map brings its own `package` and `command`."""
    clash = sorted({"package", "command"} & set(fields))
    if clash:
        raise TypeError(f"map(fn, inputs) packages fn's module itself; it takes no {', '.join(clash)}")
    return dict(fields)


def result_line(job: JobInfo, stdout: str) -> str | None:
    """The JSON text of the marked result line of a succeeded call, or None (then CallFailed is due)."""
    if job.state != "SUCCEEDED":
        return None
    at = stdout.rfind(RESULT_MARK)
    if at < 0:
        return None
    return stdout[at + len(RESULT_MARK):].split("\n", 1)[0]
