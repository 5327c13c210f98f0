"""Reset with proof: kill every process of every attempt, empty what a job may have written, verify.

The order matters. Processes die first and /proc must confirm it (a survivor could write into a
directory after it was emptied); then the package dir, the private /dev/shm, the pool's wipe paths,
the run dir (attempt logs) and, on request, the workspace and TMPDIR are emptied and re-listed.
Anything that survives either step makes the reset unclean, and the broker deletes the pod. A clean
reset marks the pod clean and starts its next pre-started kernel process, when it keeps one (`prestart`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from firepool_agent import proctree, wiping
from firepool_agent.attempt import ResetSpec
from firepool_agent.attempts import Attempts

__all__ = ["KILL_DEADLINE_S", "ResetOutcome", "ResetSpec", "Resetter"]

KILL_DEADLINE_S = 2.0
"""How long processes in uninterruptible sleep get to die before the reset is declared unclean."""


@dataclass(frozen=True)
class ResetOutcome:
    clean: bool
    duration_s: float
    killed: int
    problems: list[str]
    incarnation: int | None = None
    """The agent's incarnation: the broker checks the reset pod is still the agent it bound work to (R5)."""

    def to_json(self) -> dict[str, object]:
        return {"clean": self.clean, "duration_s": self.duration_s, "killed": self.killed,
                "problems": list(self.problems), "incarnation": self.incarnation}


class Resetter:
    def __init__(self, attempts: Attempts) -> None:
        self.attempts = attempts
        self.config = attempts.config

    def sandbox_path(self, path: str) -> str | None:
        """Where a pool path lies for this agent, or None when wiping it would touch the host.

        Inside a sandbox, pool paths are the sandbox's own. Unisolated, the agent's directories stand
        in for /workspace, /pkg and /tmp, and any other path is the host's: never wiped.
        """
        path = os.path.normpath(path)
        if self.config.isolated:
            return path
        c = self.config
        for own in (c.workspace, c.package_dir, c.tmp_dir):
            if path == own or path.startswith(own + "/"):
                return path
        for sandbox, host in (("/workspace", c.workspace), ("/pkg", c.package_dir), ("/tmp", c.tmp_dir)):
            if path == sandbox or path.startswith(sandbox + "/"):
                return host + path[len(sandbox):]
        return None

    def reset(self, spec: ResetSpec) -> ResetOutcome:
        began = time.perf_counter()
        problems: list[str] = []
        with self.attempts.launch_lock:
            self.attempts.prestarter.clean = False
            self.attempts.prestarter.kill()
            killed = proctree.kill_all() if proctree.others() else 0
            survivors = proctree.wait_gone(KILL_DEADLINE_S) if killed else []
            problems += [f"process {p.pid} (state {p.state}) survived SIGKILL" for p in survivors]
            if not self.attempts.settle(KILL_DEADLINE_S if not survivors else 0.0):
                problems.append("the running attempt did not end")
            keep = tuple(k for k in (self.sandbox_path(p) for p in spec.keep_paths) if k)
            if self.config.listen.startswith("unix:"):
                keep += (os.path.normpath(self.config.listen[len("unix:"):]),)  # our own socket
            # The run dir holds the attempts' logs, and a job could leave notes there for the next one.
            targets = [self.config.package_dir, *self.attempts.scratch_dirs(spec.wipe_workspace),
                       self.config.run_dir]
            for path in spec.wipe_paths:
                local = self.sandbox_path(path)
                if local is None:
                    problems.append(f"{path}: not wiped, it would be the host's path (unisolated agent)")
                else:
                    targets.append(local)
            for target in targets:
                problems += wiping.empty_dir(target, keep)
            for target in targets:
                problems += [f"{left}: still there after the wipe" for left in wiping.leftovers(target, keep)]
            self.attempts.delivered = None
            if spec.wipe_workspace:
                self.attempts.forget_session()
            if not problems:
                # Only now, with every process gone and the scratch verified empty, may a fresh one start.
                self.attempts.prestarter.clean = True
                self.attempts.prestarter.spawn()
        return ResetOutcome(clean=not problems, duration_s=time.perf_counter() - began, killed=killed,
                            problems=problems, incarnation=self.config.incarnation)
