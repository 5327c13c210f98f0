"""What the executor adds to a job's launch for its pod: the HAMi memory limit and the agent session.

Memory limit: a pod on a shared card runs under a CUDA interception library (HAMi-core) that caps it
at its share; standbys keep that fractional cap in their pod spec. The job process alone gets the
whole card, `CUDA_DEVICE_MEMORY_LIMIT_<i>` per visible device as HAMi's device plugin names it, set
per launch and never in the pod spec (paper App. A.4). The agent adds the per-attempt shared-cache file.

Session: with `reuse_tag: boundary` the tag is part of the session, so a new tag starts on an emptied
workspace; with `reuse_tag: hint` the tag only routes claims and the workspace survives it.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence

from broker.jobs import Job
from broker.pools import PoolSpec
from broker.ports.backend import Device

MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT_{}"


def memory_limits(pod_gpus: Sequence[str], devices: Mapping[str, Device]) -> dict[str, str]:
    """The full card's framebuffer for each of the pod's devices, in HAMi's `<MiB>m` form."""
    env = {}
    for index, key in enumerate(pod_gpus):
        device = devices.get(key)
        if device is not None and device.memory_mb > 0:
            env[MEMORY_LIMIT.format(index)] = f"{device.memory_mb}m"
    return env


def agent_session(job: Job, spec: PoolSpec | None) -> str:
    """The opaque session the agent compares to decide whether the workspace survives."""
    return session_id(job.caller, job.spec.queue, job.spec.lease_tag, spec)


def session_id(caller: str, queue: str, tag: str, spec: PoolSpec | None) -> str:
    """`agent_session` of a (caller, queue, tag) session on a pod of `spec`'s pool (a terminal names it)."""
    return _session_hash(caller, queue, "" if spec is not None and spec.reuse_tag == "hint" else tag)


@functools.lru_cache(maxsize=4096)
def _session_hash(caller: str, queue: str, tag: str) -> str:
    """Remembered: every launch names its session, and a caller's sessions are few."""
    return hashlib.sha256("\x1f".join((caller, queue, tag)).encode()).hexdigest()[:24]
