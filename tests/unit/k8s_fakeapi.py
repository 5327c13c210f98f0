"""An in-memory stand-in for `KubeApi` (pods and Secrets of one namespace) for the backend's unit tests:
resourceVersions, label selection, a watch fed from a history, injected 410s and 429s, and a hand-driven
kubelet. The integration tests use the HTTP emulator instead."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any

from broker.backends.kubernetes.kubeapi import Conflict, NotFound
from broker.backends.kubernetes.ratelimit import Retryable
from broker.backends.kubernetes.watching import Gone


def _matches(obj: Mapping[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (part.split("=", 1) for part in selector.split(",") if part))


class FakeKubeApi:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 0
        self.history: list[tuple[int, dict[str, Any]]] = []
        self.changed = asyncio.Condition()
        self.uids = itertools.count(1)
        self.fail_next: list[int] = []
        """HTTP statuses the next calls answer (429, 500, ...) before succeeding."""
        self.calls: list[str] = []
        self.fail_nodes: list[int] = []
        """HTTP statuses the next node lists answer before succeeding."""
        self.gone_once = False
        self.lose_next: list[str] = []
        """Kinds whose next create is stored, then answered with a dropped connection (a Retryable)."""
        self.graceful = False
        """A pod delete marks the pod Terminating (MODIFIED); `finish` removes it (DELETED), as a kubelet does."""

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        if obj.get("kind") == "Pod":
            self.history.append((self.rv, {"type": kind, "object": copy.deepcopy(obj)}))

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def _maybe_fail(self, what: str) -> None:
        self.calls.append(what)
        if self.fail_next:
            status = self.fail_next.pop(0)
            raise Retryable(status, f"{what}: HTTP {status}")

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        self._maybe_fail(f"create {obj['kind']}")
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            raise Conflict(f"{key} already exists", details={"status": 409})
        obj["metadata"]["uid"] = f"uid-{next(self.uids)}"
        if obj["kind"] == "Pod":
            obj["status"] = {"phase": "Pending"}
        self._bump(obj)
        self.objects[key] = obj
        self._record("ADDED", obj)
        await self._notify()
        if obj["kind"] in self.lose_next:
            self.lose_next.remove(obj["kind"])
            raise Retryable(0, f"create {obj['kind']}: connection dropped before the answer")
        return copy.deepcopy(obj)

    async def patch(self, kind: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._maybe_fail(f"patch {kind}")
        obj = self.objects.get((kind, name))
        if obj is None:
            raise NotFound(f"{kind} {name}")
        obj["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        self._bump(obj)
        self._record("MODIFIED", obj)
        await self._notify()
        return copy.deepcopy(obj)

    async def delete(self, kind: str, name: str, uid: str | None = None) -> bool:
        self._maybe_fail(f"delete {kind}")
        if self.graceful and kind == "Pod" and (kind, name) in self.objects:
            pod = self.objects[(kind, name)]
            if not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = "now"
                self._bump(pod)
                self._record("MODIFIED", pod)
                await self._notify()
            return True
        obj = self.objects.pop((kind, name), None)
        if obj is None:
            return False
        self._bump(obj)
        self._record("DELETED", obj)
        await self._notify()
        return True

    async def nodes(self) -> list[dict[str, Any]]:
        """Node objects put in `objects` under ("Node", name) (tests add them; none by default)."""
        if self.fail_nodes:
            status = self.fail_nodes.pop(0)
            raise Retryable(status, f"list nodes: HTTP {status}")
        return [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == "Node"]

    async def create_custom(self, group: str, version: str, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.create(body)

    async def delete_custom(self, group: str, version: str, plural: str, name: str) -> bool:
        return await self.delete("PodGroup", name)

    async def list_custom(self, group: str, version: str, plural: str, selector: str) -> list[dict[str, Any]]:
        return (await self.list("PodGroup", selector))[0]

    async def read(self, kind: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {kind}")
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj else None

    async def list(self, kind: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        items = [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind and _matches(o, selector)]
        return items, str(self.rv)

    async def watch(self, selector: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        seen = int(resource_version or 0)
        while True:
            if self.gone_once:
                self.gone_once = False
                raise Gone("injected 410")
            for rv, event in self.history:
                if rv > seen:
                    seen = rv
                    if _matches(event["object"], selector):
                        yield copy.deepcopy(event)
            async with self.changed:
                if not any(rv > seen for rv, _ in self.history) and not self.gone_once:
                    await self.changed.wait()

    def close(self) -> None:
        pass

    # -- the kubelet, by hand --------------------------------------------------------------------

    async def finish(self, name: str) -> None:
        """The end of a Terminating pod: its object goes."""
        obj = self.objects.pop(("Pod", name))
        self._bump(obj)
        self._record("DELETED", obj)
        await self._notify()

    def pod(self, name: str) -> dict[str, Any]:
        return self.objects[("Pod", name)]

    async def run_pod(self, name: str, ip: str = "10.0.0.7", allocated: str = "") -> None:
        pod = self.pod(name)
        pod["spec"]["nodeName"] = "node-1"
        if allocated:
            pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = allocated
        pod["status"] = {"phase": "Running", "podIP": ip, "containerStatuses": [
            {"name": "agent", "imageID": "sha256:abc", "state": {"running": {"startedAt": "now"}}}]}
        self._bump(pod)
        self._record("MODIFIED", pod)
        await self._notify()

    async def fail_pull(self, name: str) -> None:
        pod = self.pod(name)
        pod["status"] = {"phase": "Pending", "containerStatuses": [{"name": "agent", "state": {"waiting": {
            "reason": "ErrImagePull", "message": "manifest unknown"}}}]}
        self._bump(pod)
        self._record("MODIFIED", pod)
        await self._notify()

    async def replace_pod(self, name: str) -> None:
        """Someone deletes the pod and creates another under the same name (a new UID)."""
        old = copy.deepcopy(self.pod(name))
        await self.delete("Pod", name)
        old["metadata"]["uid"] = f"uid-{next(self.uids)}"
        self._bump(old)
        self.objects[("Pod", name)] = old
        self._record("ADDED", old)
        await self._notify()
