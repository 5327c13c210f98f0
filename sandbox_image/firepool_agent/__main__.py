"""Entry point: `python -m firepool_agent ...`: read the secret, lock the process down, serve.

Order matters: the secret is read and its fd closed before anything else runs, and the process is
made non-dumpable before the first job can exist, so no job ever sees the secret in our memory.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time

from firepool_agent import privileges, proctree
from firepool_agent.attempts import Attempts
from firepool_agent.config import parse_args
from firepool_agent.incarnation import FILE, next_incarnation
from firepool_agent.ledger import Ledger
from firepool_agent.orphan import OrphanWatch
from firepool_agent.reaping import Reaper
from firepool_agent.server import Agent, make_server

log = logging.getLogger("firepool_agent")

JOB_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2,
               signal.SIGALRM, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD)
"""Signals whose ignored disposition every job would inherit from us (an exec keeps SIG_IGN): a launcher that
ignores them (`nohup`, a script's `cmd &` ignoring SIGINT and SIGQUIT) must not leave a hang-up, an interrupt or a
Ctrl-C reaching nothing. SIGPIPE and SIGXFSZ are Python's own, and subprocess restores them for each child."""


def default_signals() -> list[int]:
    """Put the signals we inherited ignored back to their default action; returns those it changed."""
    changed = []
    for sig in JOB_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
            changed.append(int(sig))
    return changed


def main(argv: list[str] | None = None) -> int:
    config, secret = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s agent[{config.pod}] %(levelname)s %(message)s")
    privileges.forbid_dumps()
    reset = default_signals()  # before anything is spawned
    if reset:
        log.info("signals %s were ignored when we started: back to their default action for every job", reset)
    if not proctree.in_own_pid_namespace():
        privileges.become_subreaper()
    for directory in (config.workspace, config.package_dir, config.run_dir, config.tmp_dir,
                      *([config.deps_dir] if config.deps_dir else [])):
        os.makedirs(directory, exist_ok=True)
    if config.incarnation is None:
        # No launcher-kept counter: our own, or (no state dir) the start time, monotonic while clocks are sane.
        incarnation = next_incarnation(os.path.join(config.state_dir, FILE)) if config.state_dir else time.time_ns()
        config = dataclasses.replace(config, incarnation=incarnation)
    reaper = Reaper()
    reaper.start()
    attempts = Attempts(config, reaper)
    if config.ledger_fd is not None:
        attempts.ledger = Ledger(config.ledger_fd, config.pod)
    agent = Agent(config, secret, attempts)
    server = make_server(agent)
    with attempts.launch_lock:
        attempts.prestarter.spawn()  # a new pod has run nothing yet: as clean as after a verified reset
    if not proctree.in_own_pid_namespace():
        # Outside a namespace our jobs would outlive us; take them down when asked to stop. As PID 1
        # no handler is installed, so jobs in the namespace cannot signal the agent at all.
        def stop(signum: int, _frame: object) -> None:
            log.info("signal %d: killing every attempt process and stopping", signum)
            proctree.kill_all()
            logging.shutdown()
            os._exit(0)  # nothing to flush: attempt state lives only in memory

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    OrphanWatch(agent.terms, config.orphan_after_s).start()
    log.info("listening on %s (isolated=%s, pid namespace=%s, term %d, orphan after %gs)", config.listen,
             config.isolated, proctree.in_own_pid_namespace(), agent.terms.newest, config.orphan_after_s)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
