"""A pod's agent client that reports a lost pod as unreachable, so its attempt ends `PodLost`.

Deleting a pod kills the agent's job first: the agent may still answer "killed by a signal" before it
dies itself. Such an answer waits briefly for the watch; if the pod is lost, the pod is to blame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from broker.errors import AgentError
from broker.fencing import Term
from broker.ports.agent import AgentClient, AttemptStatus
from broker.running.agent_http import HttpAgentClient

AgentFactory = Callable[[str, str, str], AgentClient]
"""(endpoint, secret, pod) -> the pod's agent client."""
LOST_GRACE_S = 0.5
"""How long a signal-killed attempt waits for the watch to say whether its pod was deleted from outside."""


def http_agent(endpoint: str, secret: str, pod: str, term: Term | None = None) -> AgentClient:
    return HttpAgentClient(endpoint, secret, pod=pod, term=term)


class PodAgent:
    """Every call goes to `inner`; an attempt's status from a lost pod raises AgentError instead."""

    def __init__(self, inner: AgentClient, pod: str, lost: Callable[[], str]) -> None:
        self._inner = inner
        self._pod = pod
        self._lost = lost

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _checked(self, status: AttemptStatus | None) -> AttemptStatus | None:
        if status is not None and not status.running and status.signal is not None and not self._lost():
            for _ in range(int(LOST_GRACE_S / 0.05)):
                await asyncio.sleep(0.05)
                if self._lost():
                    break
        if self._lost():
            raise AgentError(f"pod {self._pod} was lost: {self._lost()}")
        return status

    async def wait(self, attempt_id: str, timeout_s: float) -> AttemptStatus:
        status = await self._checked(await self._inner.wait(attempt_id, timeout_s))
        assert status is not None
        return status

    async def status(self, attempt_id: str) -> AttemptStatus | None:
        return await self._checked(await self._inner.status(attempt_id))
