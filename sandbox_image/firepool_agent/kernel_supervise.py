"""A restartable kernel (`python3 -m firepool_agent.kernel --restartable`): restart in place, in ~0.1 s.

The launcher stays the job's rank 0 and runs the kernel in a forked child, so the kernel stack it imported
(or the pre-started process imported) is warm in every child. SIGHUP to the job (the broker's gateway
restart) kills the child and forks the next one, which binds the same ports with the same keys from the
same connection file: the job, its sandbox and its files stay; only the interpreter is new, as a local
Jupyter restart gives. The first child alone reports the connection line (the broker already holds it).
SIGINT is the kernel's (an interrupt); a child that exits on its own ends the job with its code.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


def supervise(run_child: Callable[[bool], int], report_fd: int) -> int:
    """Fork `run_child(first)` again after each SIGHUP; return the exit code of a child that ended otherwise."""
    child = 0
    restarting = False

    def on_hangup(signum: int, frame: object) -> None:
        nonlocal restarting
        restarting = True
        if child:
            try:
                os.kill(child, signal.SIGKILL)  # the kernel's own SIGHUP may be handled by its code
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGHUP, on_hangup)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the process group's interrupt is for the kernel
    first = True
    while True:
        restarting = False
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _die_with_parent()
            code = 1
            try:
                code = run_child(first)
            finally:
                os._exit(code)
        child = pid
        if first and report_fd >= 0:
            os.close(report_fd)  # the child holds it; its close is the agent's EOF
        first = False
        _, status = os.waitpid(pid, 0)
        child = 0
        hung_up = os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGHUP, signal.SIGKILL)
        if restarting or (hung_up and os.WTERMSIG(status) == signal.SIGHUP):
            continue
        code = os.waitstatus_to_exitcode(status)
        return code if code >= 0 else 128 - code


def _die_with_parent() -> None:
    """The kernel never outlives its supervisor (a killed job's rank 0)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    except (OSError, AttributeError):
        pass
