"""HAMi-style GPU-share variables for the job process, never for the pod (App. A.4 of the paper).

On a shared card the scheduler caps each pod's memory through a CUDA interception library (HAMi-core)
configured by environment variables. The broker passes the full card's limit per attempt
(CUDA_DEVICE_MEMORY_LIMIT_<i>); the agent points CUDA_DEVICE_MEMORY_SHARED_CACHE, the library's
usage-accounting file, at a fresh file per attempt under the run dir, which every reset empties, so a
reused pod never inherits an earlier attempt's limit or usage. The agent itself loads no CUDA library.
"""

from __future__ import annotations

import os

SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
CACHE_DIR = "vgpu"
"""Under the agent's run dir, which reset empties: the per-attempt GPU accounting files."""


def shared_cache_path(run_dir: str, attempt_dir_name: str) -> str:
    """The accounting file of one attempt (distinct attempt ids give distinct files)."""
    return os.path.join(run_dir, CACHE_DIR, attempt_dir_name + ".cache")


def attempt_env(run_dir: str, cuda_visible_devices: str, attempt_dir_name: str) -> dict[str, str]:
    """What the agent adds to a GPU job's environment; nothing for a pod without GPUs."""
    if not cuda_visible_devices:
        return {}
    path = shared_cache_path(run_dir, attempt_dir_name)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    return {SHARED_CACHE: path}
