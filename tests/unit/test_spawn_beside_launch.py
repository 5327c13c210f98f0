"""A process beside the session's job (exec, the terminal) waits for the launch lock, except while a launch of
its very session holds it in its spawn (a kernel waiting for its pre-started process's imports): never while a
reset or another session's launch holds it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from firepool_agent.sessionspawn import _beside_launch


def _holder(attempts: SimpleNamespace, launching: str | None, hold_s: float) -> threading.Thread:
    taken = threading.Event()

    def hold() -> None:
        with attempts.launch_lock:
            attempts.launching = launching
            taken.set()
            time.sleep(hold_s)
            attempts.launching = None

    t = threading.Thread(target=hold)
    t.start()
    taken.wait()
    return t


def _entered_after(attempts: SimpleNamespace, session: str | None) -> float:
    began = time.monotonic()
    with _beside_launch(attempts, session):  # type: ignore[arg-type]
        return time.monotonic() - began


def test_a_launch_of_the_same_session_does_not_hold_its_processes_back() -> None:
    attempts = SimpleNamespace(launch_lock=threading.Lock(), launching=None)
    t = _holder(attempts, "s1", 0.5)
    assert _entered_after(attempts, "s1") < 0.25
    t.join()


def test_a_reset_or_another_sessions_launch_is_waited_for() -> None:
    for launching, session in ((None, "s1"), ("s2", "s1"), ("s1", None)):
        attempts = SimpleNamespace(launch_lock=threading.Lock(), launching=None)
        t = _holder(attempts, launching, 0.3)
        assert _entered_after(attempts, session) >= 0.25
        t.join()
        assert not attempts.launch_lock.locked()
