"""A local pod's kept caches (per caller): in at the pod's first launch, out after each clean reset and at its
deletion, both while none of the pod's job processes run (`broker.backends.kept` moves the content).

A mixin of `LocalBackend`, and the agent client that calls it around launches and resets.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from broker.backends.kept import caller_store, check_in, check_out
from broker.backends.sandboxing import KEPT, PodDirs
from broker.errors import BackendError
from broker.ports.agent import AttemptStatus, LaunchRequest, ResetRequest, ResetResult
from broker.running.agent_http import HttpAgentClient

log = logging.getLogger("broker.backends.local")


class _Pods(Protocol):
    state_dir: Path
    pods_dir: Path
    _records: dict[str, dict[str, Any]]

    def _dirs(self, name: str) -> PodDirs: ...

    def _write(self, record: dict[str, Any]) -> None: ...


class _Keeper(Protocol):
    async def kept_in(self, name: str, caller: str) -> None: ...

    async def kept_out(self, name: str, record: Mapping[str, Any] | None = None) -> None: ...


def _has_entries(directory: str) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is not None
    except (FileNotFoundError, NotADirectoryError):
        return False


class KeptCacheAgent(HttpAgentClient):
    """A local pod's agent: its caller's kept caches go in at the pod's first launch, out after each clean
    reset (`broker.backends.kept`), both while none of the pod's job processes run."""

    def __init__(self, backend: _Keeper, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._backend = backend

    async def launch(self, request: LaunchRequest) -> AttemptStatus:
        await self._backend.kept_in(self.pod, request.env.get("FIREPOOL_CALLER", ""))
        status = await super().launch(request)
        if status.reset is not None and status.reset.clean:  # the reset came with the launch's answer
            await self._backend.kept_out(self.pod)
        return status

    async def reset(self, request: ResetRequest) -> ResetResult:
        result = await super().reset(request)
        if result.clean:
            await self._backend.kept_out(self.pod)
        return result


class KeptCaches:
    """Kept caches of the backend's pods (mixin)."""

    async def kept_in(self: _Pods, name: str, caller: str) -> None:
        """At a launch: a pod without a caller takes this one for life and gets its kept caches."""
        record = self._records.get(name)
        if record is None:
            raise BackendError(f"pod {name} is gone")
        owner = record.get("kept_caller")
        if owner is not None:
            if owner != caller:  # pods never change callers; a kept cache must not either
                raise BackendError(f"pod {name} belongs to another caller; refusing the launch")
            return
        if not caller:
            return  # a launch outside the claim path (a benchmark, a test of the agent): no caller's cache
        record["kept_caller"] = caller
        self._write(record)  # before any content moves: a restarted broker knows whose it is
        kept = self._dirs(name).kept
        slugs = (
            sorted(p.name for p in kept.iterdir() if p.is_dir() and not p.is_symlink())
            if kept.is_dir()
            else []
        )
        if slugs:
            added = await asyncio.to_thread(
                check_in, caller_store(self.state_dir, record["pool"], caller), kept, slugs
            )
            log.debug("pod %s: %d kept entries of its caller checked in", name, added)

    async def kept_out(self: _Pods, name: str, record: Mapping[str, Any] | None = None) -> None:
        """After a clean reset or at deletion: the pod's kept content back into its caller's store."""
        record = record if record is not None else self._records.get(name)
        caller = record.get("kept_caller") if record is not None else None
        if record is None or not caller or not record.get("keeps", True) \
                or not _has_entries(os.path.join(self.pods_dir, name, KEPT)):
            return  # nothing kept (a pool without keep_paths: no directory read, no worker-thread hop per reset)
        try:
            await asyncio.to_thread(
                check_out, self._dirs(name).kept, caller_store(self.state_dir, record["pool"], caller)
            )
        except OSError as exc:
            log.warning("pod %s: kept caches not saved for its caller: %s", name, exc)
