"""Waiting for a new pod: running with an IP on the watch cache, then its agent answering at that IP.

A mixin of `KubernetesBackend` (its create path). A pull error blocks the pool's template (or the custom
image) for a doubling pause, so a broken image is not retried in a storm; the pool's `start_timeout_s`
and the agent timeout end a wait that would otherwise hang.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from broker.backends.kubernetes import podstatus
from broker.backends.kubernetes.records import PodRecord
from broker.backends.kubernetes.settings import KubernetesSettings
from broker.backends.kubernetes.watching import PodCache
from broker.clock import Clock
from broker.errors import AgentError, BackendError
from broker.ports.agent import AgentClient


class LaunchError(BackendError):
    """A pod cannot start (its image cannot be pulled, ...); `details.reason` says why. Not retried at once."""

    retryable = False


class _Backend(Protocol):
    clock: Clock
    cache: PodCache
    settings: KubernetesSettings
    _pull_block: dict[str, tuple[float, float, str]]

    def agent(self, name: str) -> AgentClient: ...

    def _block(self, key: str, reason: str) -> None: ...


class Starting:
    """The waits of a create (mixin)."""

    async def _wait_running(
        self: _Backend, rec: PodRecord, image: str, pull_key: str, start_timeout_s: float
    ) -> dict[str, Any]:
        """Until the watch shows the pod running with an IP; a pull error, failure, deletion or the pool's
        start timeout ends the wait with an error (the caller deletes the pod, releasing its budget)."""
        deadline = self.clock.now() + start_timeout_s
        while True:
            rec.changed.clear()
            pod = self.cache.pods.get(rec.name)
            if rec.lost:
                raise BackendError(f"pod {rec.name} {rec.lost} while starting")
            if pod is not None and podstatus.uid(pod) == rec.uid:
                if podstatus.running(pod):
                    rec.ip = podstatus.pod_ip(pod)
                    return dict(pod)
                reason = podstatus.pull_error(pod)
                if reason:
                    self._block(pull_key, reason)
                    raise LaunchError(
                        f"pod {rec.name}: image {image} cannot be pulled: {reason}",
                        details={"reason": reason.split(":", 1)[0], "image": image},
                    )
                why = podstatus.ended(pod)
                if why:
                    raise BackendError(f"pod {rec.name} ended while starting: {why}")
            left = deadline - self.clock.now()
            if left <= 0:
                raise BackendError(
                    f"pod {rec.name} still not running after {start_timeout_s:.0f} s "
                    f"(pool start_timeout_s); deleted",
                    details={"ready": rec.ready.view()},
                )
            await self.clock.wait(rec.changed, left)

    def _block(self: _Backend, key: str, reason: str) -> None:
        """No retry storm: creates of this template (or custom image) fail at once for a while, doubling."""
        previous = self._pull_block.get(key)
        pause = min(previous[1] * 2, 600.0) if previous else self.settings.pull_backoff_s
        self._pull_block[key] = (self.clock.now() + pause, pause, reason)

    async def _wait_agent(self: _Backend, rec: PodRecord) -> None:
        client = self.agent(rec.name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.agent_timeout_s
        pause = 0.005
        while True:
            try:
                await client.health()
                rec.ready.answered(self.clock.now())
                return
            except AgentError as exc:
                if rec.lost:
                    raise BackendError(f"pod {rec.name} {rec.lost} while starting") from exc
                if loop.time() > deadline:
                    raise BackendError(
                        f"pod {rec.name}'s agent at {rec.ip} did not answer within "
                        f"{self.settings.agent_timeout_s:.0f} s"
                    ) from exc
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.1)
