"""Who pumps an attempt's output: the launch's own wait for a short job, a thread for one that outlives it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from firepool_agent.output import Output


def pipes() -> tuple[int, int, int, int]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    return out_r, out_w, err_r, err_w


def inline_pump(tmp_path: Path) -> tuple[Output, int, int, threading.Event]:
    """An attempt's output pumped by the launch's waiting thread: (output, stdout's and stderr's write ends, done)."""
    out = Output(tmp_path / "a", lambda: None)
    out_r, out_w, err_r, err_w = pipes()
    done = threading.Event()
    assert out.pump(out_r, err_r, done.set, inline=True) is None  # no thread until the wait hands it one
    return out, out_w, err_w, done


def pump_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pump-")]


def test_a_job_that_ends_within_the_wait_is_pumped_by_the_waiting_thread(tmp_path: Path) -> None:
    out, out_w, err_w, done = inline_pump(tmp_path)
    os.write(out_w, b"hello\n")
    os.write(err_w, b"oops\n")
    os.close(out_w)
    os.close(err_w)
    assert not done.is_set()  # nothing reads before the wait
    out.pump_for(5.0)
    assert done.is_set() and not pump_threads()
    assert out.read("stdout", 0, 100) == b"hello\n" and out.read("stderr", 0, 100) == b"oops\n"
    assert out.sizes["combined"] == len(b"hello\noops\n")


def test_a_job_that_outlives_the_wait_is_handed_to_a_thread_and_its_later_output_kept(tmp_path: Path) -> None:
    out, out_w, err_w, done = inline_pump(tmp_path)
    os.write(out_w, b"early\n")
    out.pump_for(0.02)
    assert not done.is_set() and out.read("stdout", 0, 100) == b"early\n"
    out.pump_for(5.0)  # once only: the thread has the pipes now
    os.write(out_w, b"late\n")
    os.close(out_w)
    os.close(err_w)
    assert done.wait(5)
    assert out.read("stdout", 0, 100) == b"early\nlate\n"


def test_pump_for_does_nothing_for_a_pump_already_in_a_thread(tmp_path: Path) -> None:
    out = Output(tmp_path / "a", lambda: None)
    out_r, out_w, err_r, err_w = pipes()
    done = threading.Event()
    thread = out.pump(out_r, err_r, done.set)
    assert thread is not None
    out.pump_for(0.05)  # must not read the pipes beside the thread
    os.write(out_w, b"x" * 10)
    os.close(out_w)
    os.close(err_w)
    thread.join(5)
    assert done.is_set() and out.read("stdout", 0, 100) == b"x" * 10


def test_a_pump_that_fails_in_the_waiting_thread_ends_the_pump_not_the_wait(tmp_path: Path) -> None:
    out, out_w, err_w, done = inline_pump(tmp_path)
    os.write(out_w, b"x")

    def broken(stream: str, data: bytes) -> None:
        raise RuntimeError("a bug in the pump")

    out._append = broken  # type: ignore[method-assign]
    out.pump_for(5.0)  # returns: the launch still answers
    assert done.is_set() and not pump_threads()
    os.close(out_w)
    os.close(err_w)
