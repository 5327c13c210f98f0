"""Admission: turn a verified caller's request into a QUEUED job, or a typed error that stores nothing.

Every size and character limit is checked here, against the one set the agent checks too
(firepool_agent.limits), so a stored job can always be sent to an agent and exec'd. Malformed input
(NUL, lone surrogates, an invalid variable name, an over-long value) is refused with InvalidRequest.
Well-formed variables that could steer the pod agent, the dynamic loader, the GPU binding or a gang's
topology are dropped instead (not refused), and the job records which and why in `dropped_env`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from broker.claiming.tracking import confined
from broker.errors import InvalidRequest, UnknownPool, Unschedulable
from broker.fleet.quotas import QuotaTree
from broker.images import admit_image
from broker.jobs import Job, JobSpec, JobState, new_job_id, transition
from broker.pools import PoolSpec
from broker.running.topology import TOPOLOGY_NAMES, TOPOLOGY_PREFIXES
from broker.warmth.placing import never_fits
from firepool_agent import limits

_DROPPED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("LD_", "dynamic-loader variable: could inject code into the job or agent before it starts"),
    ("FIREPOOL_", "reserved: the broker injects FIREPOOL_* (the verified caller and the job's identity)"),
    ("NVIDIA_", "GPU binding belongs to the pod, not the job"),
    ("CUDA_DEVICE_MEMORY_", "GPU memory limits are set by the agent per attempt"),
    ("CUDA_DEVICE_SM_LIMIT", "GPU share limits are set by the pod"),
)
_DROPPED_NAMES: Mapping[str, str] = {
    "CUDA_VISIBLE_DEVICES": "GPU binding belongs to the pod, not the job",
    "GCONV_PATH": "dynamic-loader variable: could load code through iconv modules",
    "MASTER_ADDR": "topology is injected by the executor",
    "MASTER_PORT": "topology is injected by the executor",
    "RANK": "topology is injected by the executor",
    "WORLD_SIZE": "topology is injected by the executor",
    "LOCAL_RANK": "topology is injected by the executor",
    "LOCAL_WORLD_SIZE": "topology is injected by the executor",
    "NODE_RANK": "topology is injected by the executor",
    "GROUP_RANK": "topology is injected by the executor",
}


def filter_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Split `env` into what the job may set and what is dropped (with a reason each)."""
    kept: dict[str, str] = {}
    dropped: list[dict[str, str]] = []
    _checked(limits.check_env, env)
    for name in env:
        reason = _DROPPED_NAMES.get(name)
        if reason is None:
            reason = next((why for prefix, why in _DROPPED_PREFIXES if name.startswith(prefix)), None)
        if reason is None and (name in TOPOLOGY_NAMES or name.startswith(TOPOLOGY_PREFIXES)):
            reason = "topology is injected by the executor"
        if reason is None:
            kept[name] = env[name]
        else:
            dropped.append({"name": name, "reason": reason})
    return kept, dropped


def _checked(check: Callable[..., None], *args: Any) -> None:
    try:
        check(*args)
    except limits.LimitError as exc:
        details: dict[str, Any] = {"field": exc.field}
        if exc.limit is not None:
            details["limit"] = exc.limit
        raise InvalidRequest(exc.message, details) from None


def check_spec(spec: JobSpec) -> None:
    """Sizes and characters of every caller-given string, as the store, the agent and execve take them."""
    _checked(limits.check_argv, spec.command)
    _checked(limits.check_env, spec.env)
    _checked(limits.check_exec, spec.command, spec.env, limits.MAX_CALLER_EXEC_BYTES)
    for field, value in (("lease_tag", spec.lease_tag), ("queue", spec.queue), ("pool", spec.pool),
                         ("idempotency_key", spec.idempotency_key or "")):
        _checked(limits.check_name, field, value)
    for key, value in spec.extra.items():
        if isinstance(value, str):
            problem = limits.text_problem(value)
            if problem is not None:
                raise InvalidRequest(f"{key} {problem}", {"field": key})


def admit(spec: JobSpec, caller: str, pools: Mapping[str, PoolSpec], now: float, quotas: QuotaTree | None = None,
          runs_images: bool = False, set_ceilings: Mapping[str, Mapping[str, int]] | None = None,
          set_largest: Mapping[str, Mapping[str, str]] | None = None) -> Job:
    """Check `spec` against the catalog (and the team quotas) and return the job as it will be inserted (QUEUED).

    `runs_images`: the backend can run a job's custom image (broker.images); else naming one is refused.
    `set_ceilings`: the most pods one node (domain) of each pool can hold, where the backend's nodes tell
    (broker.warmth.placing): a gang confined to one node (domain) that none can hold is refused, naming the
    largest (`set_largest`)."""
    check_spec(spec)
    pool = pools.get(spec.pool)
    if pool is None:
        known = sorted(pools)
        raise UnknownPool(f"no pool named {spec.pool!r}; pools here: {', '.join(known) or 'none'}",
                          {"pool": spec.pool, "known": known})
    if not spec.command:
        raise InvalidRequest("command must name at least the program to run", {"field": "command"})
    if spec.pods > pool.max_count:
        raise Unschedulable(f"{spec.pods} pods can never fit pool {pool.name!r} (ceiling {pool.max_count})",
                            {"pool": pool.name, "pods": spec.pods, "max_count": pool.max_count})
    if set_ceilings and (where := confined(spec.topology, pool, spec.pods)):
        why = never_fits(set_ceilings, pool, spec.pods, where, set_largest)
        if why is not None:
            raise Unschedulable(why, {"pool": pool.name, "pods": spec.pods, "topology": where,
                                      "largest": set_ceilings[pool.name][where]})
    if quotas is not None and pool.gpus:
        why = quotas.never_fits(caller, spec.pods * pool.gpus, bool(spec.extra.get("preemptible")))
        if why is not None:
            raise Unschedulable(f"team quota: {why}", {"pool": pool.name, "gpus": spec.pods * pool.gpus})
    if spec.image:
        admit_image(spec.image, pool.name, pool.images, runs_images)
    env, dropped = filter_env(spec.env)
    job = Job(id=new_job_id(now), caller=caller, spec=dataclasses.replace(spec, env=env) if dropped else spec,
              dropped_env=tuple(dropped), timings={"submitted_at": now})
    return transition(job, JobState.QUEUED, now)
