"""Free TCP ports on this host for gang rendezvous, never handing out the same port twice in a row.

The kernel picks a free port (bind to port 0); the socket closes at once and rank 0 binds the port
moments later. The few ports handed out last are remembered so two gangs starting together never get
the same one, even when the kernel would offer a just-closed port again.
"""

from __future__ import annotations

import socket
from collections import deque

DEFAULT_MASTER_PORT = 29500
"""torch.distributed's default, for a rank 0 alone in its own network namespace."""


class FreePorts:
    def __init__(self, host: str = "127.0.0.1", remember: int = 256) -> None:
        self.host = host
        self._recent: deque[int] = deque(maxlen=remember)

    def take(self) -> int:
        """A port nothing listens on now and that was not handed out recently."""
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((self.host, 0))
                port = int(s.getsockname()[1])
            if port not in self._recent:
                self._recent.append(port)
                return port
        raise OSError("no free port that was not handed out recently")
