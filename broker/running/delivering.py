"""Package delivery at launch: push the job's code package to every pod of its set, or fail the launch.

The broker pushes over each agent's own connection (local sandboxes may have no network), all pods
at once, under the store's push timeout. The launch fails as a whole (`PackageError`) when any pod
could not take it, and no rank starts: a gang never runs with code on only some of its pods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from broker.errors import FirepoolError
from broker.ports.agent import AgentClient
from broker.running.packages import PackageStore

log = logging.getLogger("firepool.delivering")


@dataclass(frozen=True)
class Delivery:
    """What delivering one job's package did: an error message, or the times it took."""

    error: str | None
    push_s: float = 0.0
    unpack_s: float = 0.0
    """The slowest pod's unpack."""


class PackageDelivery:
    def __init__(self, store: PackageStore) -> None:
        self.store = store

    async def deliver(self, caller: str, digest: str, agents: Sequence[AgentClient]) -> Delivery:
        """Push `digest` (a package `caller` uploaded) to every agent; the error names the first failure."""
        path = await asyncio.to_thread(self.store.path, caller, digest)
        if path is None:
            return Delivery(f"package {digest} is not stored for {caller} (upload it first)")
        limits = self.store.limits
        began = time.perf_counter()

        async def push(agent: AgentClient) -> float | str:
            try:
                done = await asyncio.wait_for(
                    agent.put_package(digest, str(path), limits.max_extracted, limits.push_timeout_s),
                    limits.push_timeout_s)
                return done.unpack_s
            except TimeoutError:
                return f"pushing package {digest[:12]} took longer than {limits.push_timeout_s:.0f} s"
            except FirepoolError as exc:
                return exc.message

        results = await asyncio.gather(*(push(a) for a in agents))
        push_s = time.perf_counter() - began
        failed = [r for r in results if isinstance(r, str)]
        if failed:
            log.warning("package %s could not be delivered: %s", digest[:12], failed[0])
            return Delivery(f"the package could not be delivered to {len(failed)} of {len(agents)} pod(s): "
                            f"{failed[0]}", push_s)
        return Delivery(None, push_s, max(r for r in results if isinstance(r, float)))
