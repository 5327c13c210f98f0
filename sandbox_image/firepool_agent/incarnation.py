"""The agent's incarnation: a counter that grows by one every time an agent starts for a pod.

The broker records the incarnation it first saw for each pod; an agent that answers with another one is
not the agent the broker bound work to (it restarted, or a different pod took the name), so nothing bound
to the old one is trusted (R5: identity is an epoch, not a name). The counter is persisted like the
attempt ledger: on the host, outside every sandbox (the local backend's launcher bumps it and passes
`--incarnation`), or in a state directory of the agent's own (`--state-dir`, e.g. a volume that survives
container restarts). Written to a temporary file, fsync'd and renamed, so a crash leaves the old value or
the new one, never a torn one, and the value never goes back.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE = "incarnation"


def next_incarnation(path: str | Path) -> int:
    """Bump and return the counter persisted in the file `path` (1 on the first start); durable on return."""
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        current = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        current = 0
    value = current + 1
    temp = directory / f".{path.name}.{os.getpid()}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{value}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return value
