"""Host pids of the processes a local pod's agent names by its sandbox pids.

A sandbox numbers its processes in its own pid namespace, and the pods of other brokers, run beside a test, reuse
the same small numbers: a process is the pod's only when it shares the pid namespace of that pod's agent.
"""

from __future__ import annotations

import os
from pathlib import Path


def prestarted_host_pids(sandbox_pid: int, pod: str) -> list[int]:
    """The host pids of `pod`'s pre-started kernel processes whose sandbox pid is `sandbox_pid` (one, or none)."""
    procs = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            namespace = os.readlink(f"/proc/{name}/ns/pid")
        except OSError:  # gone meanwhile
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(nspid) > 1:  # inside a pid namespace
            procs.append((int(name), int(nspid[-1]), cmdline, namespace))
    agent = f"--pod\0{pod}\0".encode()
    spaces = {ns for _, _, cmdline, ns in procs if b"firepool_agent" in cmdline and agent in cmdline}
    return [host for host, inner, cmdline, ns in procs
            if ns in spaces and inner == sandbox_pid and b"--prestarted" in cmdline]
