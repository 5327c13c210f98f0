"""The Firepool pod agent: PID 1 of every sandbox; runs attempts, streams their logs, resets the pod.

Standard library only, and it never imports a CUDA library, so it starts in tens of milliseconds in
any image. `python -m firepool_agent --help` lists the flags; `server` holds the HTTP API.
"""

__version__ = "0.1.0"
