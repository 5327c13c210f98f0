"""Byte streams into a caller's session sandbox: the pod a (caller, queue, tag) session holds, reached
through its agent (`/v1/tunnel` to a port, a terminal). Owner-only by construction: the session key holds
the caller, so another caller's tag names no pod of theirs and gets the same 404 as a tag never used."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from broker.errors import NotFound
from broker.jobs import Job
from broker.pods import Pod, PodState
from broker.ports.agent import AgentClient

LIVE = frozenset({PodState.IDLE, PodState.ASSIGNED, PodState.RUNNING})
"""A session's pod in these states still holds its sandbox (resetting and retiring ones are on their way out)."""


class Pods(Protocol):
    def snapshot(self) -> Iterable[Pod]: ...


class Agents(Protocol):
    def agent(self, name: str) -> AgentClient: ...


class SessionStreams:
    def __init__(self, pods: Pods, agents: Agents, live: Mapping[str, Job] | None = None) -> None:
        self.pods = pods
        self.agents = agents
        self.live = live if live is not None else {}
        """The job book's live jobs: a pod running a job carries no session key until the job ends (the
        release sets it), so a running pod's session is its job's."""

    def _key(self, pod: Pod) -> tuple[str, str, str] | None:
        if pod.job is not None:
            job = self.live.get(pod.job)
            if job is not None:
                return (job.caller, job.spec.queue, job.spec.lease_tag)
        return pod.key

    def pod(self, caller: str, tag: str, queue: str = "default") -> Pod:
        """The session's pod: the one running its job if any, else the one it last used."""
        key = (caller, queue, tag)
        mine = [p for p in self.pods.snapshot() if p.state in LIVE and not p.standby and self._key(p) == key]
        if not mine:
            raise NotFound(f"no live session {tag!r} of yours (in queue {queue!r}): run a job with "
                           f"lease_tag {tag!r} first", {"tag": tag, "queue": queue})
        return max(mine, key=lambda p: (p.state is not PodState.IDLE, p.idle_since))

    async def open(self, caller: str, tag: str, path: str, params: dict[str, Any], protocol: str,
                   queue: str = "default") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """An upgraded stream to the session pod's agent (AgentError carries the agent's refusal status)."""
        return await self.agents.agent(self.pod(caller, tag, queue).name).upgrade(path, params, protocol)
