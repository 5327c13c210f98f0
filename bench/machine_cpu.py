"""Where the whole machine's CPU went while a benchmark phase ran, per job: the broker process, its pods' agents,
the jobs the agents ran, this process (the benchmark's own clients) and what stayed idle.

Read from /proc before and after the phase: each process's utime + stime; an agent's reaped children's
cutime + cstime are its jobs (the agent is PID 1 of its sandbox and reaps every process of it); /proc/stat's
idle + iowait over all its time for the idle share. An agent is a process below the broker whose command is a
Python interpreter running `-m firepool_agent` (its sandbox's bwrap runs the same words as arguments). On a
machine whose cores are all busy, a phase's jobs/s is about the cores' busy time over this total, so two
phases' totals bound how far apart their rates can be.

`process_start_ms` is the floor every job pays on both paths: the CPU of starting and reaping one `true` here,
outside any sandbox. Where the C library's start-up probe of the CPU traps to a hypervisor (CPUID exits on a
nested VM) it dwarfs what the program itself does.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sample:
    broker_s: float
    agents_s: dict[int, tuple[float, float]]
    """Agent pid -> (its own CPU seconds, its reaped children's)."""
    bench_s: float
    idle_s: float
    all_s: float


@dataclass(frozen=True)
class Split:
    """Milliseconds of CPU per job, and the idle share of the machine's time (0..1)."""

    broker_ms: float
    agents_ms: float
    jobs_ms: float
    clients_ms: float
    idle: float

    @property
    def total_ms(self) -> float:
        return self.broker_ms + self.agents_ms + self.jobs_ms + self.clients_ms

    def describe(self) -> str:
        return (f"broker {self.broker_ms:.2f} + agents {self.agents_ms:.2f} + jobs {self.jobs_ms:.2f} + clients "
                f"{self.clients_ms:.2f} ms; {100 * self.idle:.0f} % idle")


def _stat(pid: int) -> tuple[int, list[str]] | None:
    """(parent pid, the fields after the command name) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields


def _cpu(fields: list[str], at: int) -> float:
    """Seconds of the two tick counts from `at` of a stat line's fields (utime + stime at 11, the children's at 13)."""
    return (int(fields[at]) + int(fields[at + 1])) / _TICK


def _is_agent(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return os.path.basename(argv[0]).startswith(b"python") and b"firepool_agent" in argv[1:4]


def sample(broker_pid: int) -> Sample:
    procs = {int(e): s for e in os.listdir("/proc") if e.isdigit() and (s := _stat(int(e))) is not None}
    below, frontier = {broker_pid}, {broker_pid}
    while frontier:
        frontier = {pid for pid, (ppid, _) in procs.items() if ppid in frontier} - below
        below |= frontier
    agents = {pid: (_cpu(procs[pid][1], 11), _cpu(procs[pid][1], 13)) for pid in below - {broker_pid} if _is_agent(pid)}
    broker = procs.get(broker_pid)
    own = os.times()
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:9]]
    return Sample(broker_s=_cpu(broker[1], 11) if broker else 0.0, agents_s=agents,
                  bench_s=own.user + own.system, idle_s=(ticks[3] + ticks[4]) / _TICK, all_s=sum(ticks) / _TICK)


def split(before: Sample, after: Sample, jobs: int) -> Split:
    """The phase between two samples, per job; an agent started meanwhile counts from zero."""
    n = max(jobs, 1) / 1000
    agents = jobs_s = 0.0
    for pid, (own, reaped) in after.agents_s.items():
        own0, reaped0 = before.agents_s.get(pid, (0.0, 0.0))
        agents += own - own0
        jobs_s += reaped - reaped0
    elapsed = after.all_s - before.all_s
    return Split(broker_ms=(after.broker_s - before.broker_s) / n, agents_ms=agents / n, jobs_ms=jobs_s / n,
                 clients_ms=(after.bench_s - before.bench_s) / n,
                 idle=(after.idle_s - before.idle_s) / elapsed if elapsed > 0 else 0.0)


def process_start_ms(program: str = "true", starts: int = 200) -> float:
    """CPU milliseconds (the child's and this process's) to start `program` and reap it, the mean of `starts`."""
    path = shutil.which(program)
    if path is None:
        raise FileNotFoundError(program)
    before = os.times()
    for _ in range(starts):
        os.waitpid(os.posix_spawn(path, [path], {}), 0)
    after = os.times()
    spent = (after.user + after.system + after.children_user + after.children_system
             - before.user - before.system - before.children_user - before.children_system)
    return 1000 * spent / starts
