"""Processes as /proc shows them: who descends from whom, killing a tree, proving it is gone.

Inside a PID namespace where the agent is PID 1, every other process belongs to some attempt, and
`kill(-1, SIGKILL)` reaches all of them. Outside one (the unisolated fallback) the agent is a child
subreaper, so orphans re-parent to it and a walk over PPIDs finds every descendant; `kill(-1)` there
would hit the whole host and is never used.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

_DEAD_STATES = frozenset("ZXx")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    starttime: int
    """Clock ticks since boot when the process started; with the pid it names one process."""

    @property
    def alive(self) -> bool:
        return self.state not in _DEAD_STATES


def read_proc(pid: int, proc_root: str = "/proc") -> Proc | None:
    """One process's stat line, or None when it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after the last ')' are fixed.
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return Proc(pid=pid, ppid=int(rest[1]), state=rest[0].decode(), starttime=int(rest[19]))
    except (IndexError, ValueError):
        return None


def all_procs(proc_root: str = "/proc") -> list[Proc]:
    """Every process this /proc shows (a PID namespace's own /proc shows only its members)."""
    procs = []
    for name in os.listdir(proc_root):
        if name.isdigit():
            proc = read_proc(int(name), proc_root)
            if proc is not None:
                procs.append(proc)
    return procs


def descendants(root: int, procs: list[Proc] | None = None) -> list[Proc]:
    """Every process below `root` in the PPID tree (not `root` itself)."""
    procs = all_procs() if procs is None else procs
    children: dict[int, list[Proc]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child.pid != root:
                found.append(child)
                stack.append(child.pid)
    return found


def in_own_pid_namespace() -> bool:
    """True when this process is PID 1 of its namespace, so every other visible process is a job's."""
    return os.getpid() == 1


def others() -> list[Proc]:
    """The processes that belong to attempts: all but us in our namespace, else our descendants."""
    me = os.getpid()
    if in_own_pid_namespace():
        return [p for p in all_procs() if p.pid != me]
    return descendants(me)


def signal_all(sig: int) -> int:
    """Send `sig` to every process of every attempt once; returns how many were alive."""
    targets = [p for p in others() if p.alive]
    for proc in targets:
        try:
            os.kill(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return len(targets)


def kill_all() -> int:
    """SIGKILL every process of every attempt; returns how many distinct processes were killed.

    Killed parents hand their children to us (PID 1 or subreaper), so the walk repeats until a pass
    finds nothing alive; killed processes cannot fork, so it converges.
    """
    killed: set[tuple[int, int]] = set()
    for _ in range(100):
        alive = [p for p in others() if p.alive and (p.pid, p.starttime) not in killed]
        if not alive:
            break
        if in_own_pid_namespace():
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            for proc in alive:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        killed.update((p.pid, p.starttime) for p in alive)
    return len(killed)


def wait_gone(deadline_s: float) -> list[Proc]:
    """Poll /proc until no attempt process is alive or the deadline passes; returns the survivors.

    A process in uninterruptible sleep (state D) dies only when its I/O returns, hence the wait.
    """
    end = time.monotonic() + deadline_s
    pause = 0.0005
    while True:
        alive = [p for p in others() if p.alive]
        if not alive or time.monotonic() >= end:
            return alive
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
