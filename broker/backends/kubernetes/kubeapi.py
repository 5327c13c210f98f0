"""The few API calls the backend makes, on the official `kubernetes` client, as raw JSON.

Every call runs in a worker thread (`asyncio.to_thread`) so the event loop never blocks on the API
server; responses are read raw (`_preload_content=False`) and parsed with `json`, skipping the generated
models on the hot list/watch paths. Errors are translated here, once: 404 → None or NotFound, 429 and
5xx → `Retryable`, 410 → `Gone`, anything else → `BackendError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as _k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _k8s_watch

from broker.backends.kubernetes.ratelimit import Retryable
from broker.backends.kubernetes.watching import Gone
from broker.errors import BackendError

T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"
k8s_config: Any = _k8s_config  # untyped module: called with raw dicts and kwargs only
iter_resp_lines: Callable[[Any], Iterator[str]] = _k8s_watch.iter_resp_lines


class NotFound(BackendError):
    status = 404
    retryable = False


class Conflict(BackendError):
    """409: AlreadyExists on a create, or a failed precondition."""

    status = 409
    retryable = False


@dataclass(frozen=True)
class ApiTimeouts:
    connect_s: float = 5.0
    """TCP (and TLS) connect to the API server."""
    read_s: float = 30.0
    """Silence allowed while waiting for one answer (a list page, a create)."""
    watch_s: int = 240
    """The watch's server-side `timeoutSeconds`: the server ends the stream, the watch resumes."""
    watch_read_s: float = 90.0
    """Silence allowed on an open watch; above the API server's bookmark period (about a minute), so
    only a dead connection trips it."""

    def call(self) -> tuple[float, float]:
        return (self.connect_s, self.read_s)


@dataclass(frozen=True)
class Connection:
    namespace: str = "default"
    kubeconfig: str | None = None
    """A kubeconfig file; None: in-cluster config when in a pod, else the default kubeconfig."""
    context: str | None = None


def api_client(conn: Connection) -> k8s.ApiClient:
    """An ApiClient from a kubeconfig file or the in-cluster service account."""
    cfg = k8s.Configuration()
    try:
        if conn.kubeconfig is None:
            try:
                k8s_config.load_incluster_config(client_configuration=cfg)
            except k8s_config.ConfigException:
                k8s_config.load_kube_config(context=conn.context, client_configuration=cfg)
        else:
            k8s_config.load_kube_config(config_file=conn.kubeconfig, context=conn.context, client_configuration=cfg)
    except (k8s_config.ConfigException, OSError) as exc:
        raise BackendError(f"cannot load the Kubernetes configuration ({conn.kubeconfig or 'in-cluster'}): {exc}") \
            from exc
    return k8s.ApiClient(cfg)


def _translate(exc: Exception, what: str) -> Exception:
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        reason = _reason(exc)
        if status == 404:
            return NotFound(f"{what}: not found")
        if status == 410:
            return Gone(reason)
        if status == 409:
            return Conflict(f"{what}: HTTP 409 {reason}", details={"status": 409})
        if status == 429 or status >= 500:
            after = (exc.headers or {}).get("Retry-After") if exc.headers else None
            return Retryable(status, f"{what}: HTTP {status} {reason}",
                             float(after) if after and str(after).isdigit() else None)
        return BackendError(f"{what}: HTTP {status} {reason}", details={"status": status})
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return Retryable(0, f"{what}: {exc!r}")
    return BackendError(f"{what}: {exc!r}")


def _reason(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or b"{}")
        return str(body.get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)


def _json(resp: Any) -> Any:
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()


class KubeApi:
    """Pods and Secrets of one namespace."""

    def __init__(self, api: k8s.ApiClient, namespace: str, timeouts: ApiTimeouts = ApiTimeouts()) -> None:
        self.api = api
        # Any: bodies go as raw dicts and answers come back raw, past the generated models' types.
        self.core: Any = k8s.CoreV1Api(api)
        self.custom: Any = k8s.CustomObjectsApi(api)
        self.namespace = namespace
        self.timeouts = timeouts
        self._bound = timeouts.call()

    async def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except Exception as exc:  # noqa: BLE001 - translated into the one error tree above
            raise _translate(exc, what) from exc

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(body["kind"])
        name = str(body["metadata"]["name"])
        create = self.core.create_namespaced_pod if kind == "Pod" else self.core.create_namespaced_secret
        result: dict[str, Any] = await self._call(f"create {kind.lower()} {name}", lambda: _json(
            create(self.namespace, dict(body), _preload_content=False, _request_timeout=self._bound)))
        return result

    async def patch(self, kind: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        patch = self.core.patch_namespaced_pod if kind == "Pod" else self.core.patch_namespaced_secret
        result: dict[str, Any] = await self._call(f"patch {kind.lower()} {name}", lambda: _json(
            patch(name, self.namespace, dict(body), _content_type=MERGE_PATCH, _preload_content=False,
                  _request_timeout=self._bound)))
        return result

    async def delete(self, kind: str, name: str, uid: str | None = None) -> bool:
        """Delete one object (only that incarnation when `uid` is given); False when it was gone."""
        remove = self.core.delete_namespaced_pod if kind == "Pod" else self.core.delete_namespaced_secret
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            # No grace period given: a pod gets its own (spec.terminationGracePeriodSeconds, the pool's
            # `termination_grace_s`): SIGTERM, then SIGKILL at its end; the object goes only after that.
            await self._call(f"delete {kind.lower()} {name}", lambda: remove(
                name, self.namespace, body=body, _preload_content=False, _request_timeout=self._bound).release_conn())
        except NotFound:
            return False
        return True

    async def create_custom(self, group: str, version: str, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a namespaced custom object (Volcano's PodGroup)."""
        name = str(body["metadata"]["name"])
        result: dict[str, Any] = await self._call(f"create {plural} {name}", lambda: _json(
            self.custom.create_namespaced_custom_object(group, version, self.namespace, plural, dict(body),
                                                        _request_timeout=self._bound, _preload_content=False)))
        return result

    async def delete_custom(self, group: str, version: str, plural: str, name: str) -> bool:
        """Delete a namespaced custom object; False when it was gone."""
        try:
            await self._call(f"delete {plural} {name}", lambda: self.custom.delete_namespaced_custom_object(
                group, version, self.namespace, plural, name, _request_timeout=self._bound,
                _preload_content=False).release_conn())
        except NotFound:
            return False
        return True

    async def list_custom(self, group: str, version: str, plural: str, selector: str) -> list[dict[str, Any]]:
        """The namespaced custom objects matching `selector`."""
        page: dict[str, Any] = await self._call(f"list {plural}", lambda: _json(
            self.custom.list_namespaced_custom_object(group, version, self.namespace, plural, label_selector=selector,
                                                      _request_timeout=self._bound, _preload_content=False)))
        return list(page.get("items") or [])

    async def read(self, kind: str, name: str) -> dict[str, Any] | None:
        """One Pod or Secret, None when there is none (a 409's object, to adopt when ours)."""
        reader = self.core.read_namespaced_pod if kind == "Pod" else self.core.read_namespaced_secret
        try:
            result: dict[str, Any] = await self._call(f"get {kind.lower()} {name}", lambda: _json(
                reader(name, self.namespace, _preload_content=False, _request_timeout=self._bound)))
        except NotFound:
            return None
        return result

    async def node(self, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call(f"get node {name}", lambda: _json(
                self.core.read_node(name, _preload_content=False, _request_timeout=self._bound)))
        except NotFound:
            return None
        return result

    async def nodes(self) -> list[dict[str, Any]]:
        """Every Node object of the cluster (for placement: broker.backends.kubernetes.nodes)."""
        page: dict[str, Any] = await self._call("list nodes", lambda: _json(
            self.core.list_node(_preload_content=False, _request_timeout=self._bound)))
        return list(page.get("items") or [])

    async def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """Every pod on `node`, in every namespace (the card sweep: who else holds a share)."""
        page: dict[str, Any] = await self._call(f"list pods on {node}", lambda: _json(
            self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _preload_content=False,
                                                 _request_timeout=self._bound)))
        return list(page.get("items") or [])

    async def list(self, kind: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        """Every object matching `selector` (pages followed) and the list's resourceVersion."""
        lister = self.core.list_namespaced_pod if kind == "Pod" else self.core.list_namespaced_secret
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page: dict[str, Any] = await self._call(f"list {kind.lower()}s", functools.partial(
                self._page, lister, selector, token))
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                return items, str(meta.get("resourceVersion", ""))

    def _page(self, lister: Any, selector: str, token: str | None) -> dict[str, Any]:
        page: dict[str, Any] = _json(lister(self.namespace, label_selector=selector, limit=500, _continue=token,
                                            _preload_content=False, _request_timeout=self._bound))
        return page

    async def watch(self, selector: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        """Pod events from `resource_version`, bookmarks on; read in a thread, handed over through a queue.
        The server ends the stream after `watch_s`; silence past `watch_read_s` ends it here (a Retryable)."""
        bound = self.timeouts
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()
        holder: list[Any] = []

        def pump() -> None:
            try:
                resp = self.core.list_namespaced_pod(
                    self.namespace, label_selector=selector, watch=True, resource_version=resource_version or None,
                    allow_watch_bookmarks=True, timeout_seconds=bound.watch_s, _preload_content=False,
                    _request_timeout=(bound.connect_s, bound.watch_read_s))
                holder.append(resp)
                for line in iter_resp_lines(resp):
                    if stop.is_set():
                        break
                    if line:
                        loop.call_soon_threadsafe(queue.put_nowait, ("event", json.loads(line)))
                loop.call_soon_threadsafe(queue.put_nowait, ("end", None))
            except Exception as exc:  # noqa: BLE001 - crosses the thread boundary, raised below
                if not stop.is_set():
                    loop.call_soon_threadsafe(queue.put_nowait, ("error", exc))
            finally:
                if holder:
                    holder[0].release_conn()

        thread = threading.Thread(target=pump, name="firepool-k8s-watch", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = await queue.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise _translate(value, "watch pods")
                yield value
        finally:
            stop.set()
            if holder:  # unblocks the reading thread, which then ends
                with contextlib.suppress(Exception):
                    holder[0].close()

    def close(self) -> None:
        closing: Any = self.api.close
        closing()
