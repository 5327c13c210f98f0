"""Process attributes that keep the secret in the agent: not dumpable, and a subreaper outside a namespace.

A non-dumpable process's /proc files (environ, mem, maps, fd) belong to root and it cannot be
ptraced, so a job running under the same uid without capabilities cannot read the agent's memory.
"""

from __future__ import annotations

import ctypes

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
PR_SET_CHILD_SUBREAPER = 36

_libc: ctypes.CDLL | None = None


def _prctl(option: int, arg: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols include libc's prctl
    result = int(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)))
    if result < 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
    return result


def forbid_dumps() -> None:
    """Make this process non-dumpable: no core dumps, no ptrace, /proc/self/* owned by root."""
    _prctl(PR_SET_DUMPABLE, 0)


def is_dumpable() -> bool:
    return _prctl(PR_GET_DUMPABLE, 0) == 1


def become_subreaper() -> None:
    """Orphaned descendants re-parent to us instead of the host's init, so a reset can find them."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
