"""The emulator's object store: namespaced objects, one global resourceVersion, and a retained event log.

Every write bumps the global resourceVersion, stores a deep copy and appends an event (ADDED,
MODIFIED, DELETED with the object before and after) to a bounded log that watches replay from.
`compact()` forgets the log, as etcd compaction does: a watch from an older version gets 410 Gone.
Thread-safe (one lock): the HTTP server's loop, the kubelet and the test's thread all write here.
"""

from __future__ import annotations

import copy
import datetime
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from k8s_emulator.selectors import Predicate

Obj = dict[str, Any]
Key = tuple[str, str, str]
"""(resource, namespace, name); cluster-scoped objects have namespace ""."""

KINDS = {"pods": "Pod", "secrets": "Secret", "nodes": "Node", "events": "Event", "configmaps": "ConfigMap",
         "namespaces": "Namespace", "services": "Service", "podgroups": "PodGroup",
         "poddisruptionbudgets": "PodDisruptionBudget"}
CLUSTER_SCOPED = {"nodes", "namespaces"}
EVENTS_KEPT = 10_000


def now_iso() -> str:
    """An RFC 3339 timestamp with microseconds (the real server keeps seconds; ready records want ms)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    """An error the API answers with a `Status` object (kind Status, code, reason, message)."""

    def __init__(self, code: int, reason: str, message: str, *, retry_after_s: int | None = None,
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message
        self.retry_after_s = retry_after_s
        self.details = dict(details or {})

    def status(self) -> Obj:
        body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": self.message, "reason": self.reason, "code": self.code}
        if self.details or self.retry_after_s is not None:
            body["details"] = {**self.details, **({"retryAfterSeconds": self.retry_after_s}
                                                  if self.retry_after_s is not None else {})}
        return body


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', details={"name": name, "kind": resource})


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    resource: str
    namespace: str
    obj: Obj
    prev: Obj | None
    """The object before a MODIFIED or DELETED (a selector watch turns leaving into DELETED)."""


Listener = Callable[[Event], None]


class Store:
    def __init__(self, window: int = 100_000) -> None:
        self._lock = threading.RLock()
        self._rv = 0
        self._compacted = 0
        """Events at or below this version are gone: a watch from an older version gets 410."""
        self._objects: dict[Key, Obj] = {}
        self._log: deque[Event] = deque(maxlen=window)
        self._listeners: list[Listener] = []
        self._event_keys: deque[Key] = deque()
        """Event objects oldest first: past `EVENTS_KEPT` the oldest go, as the server's event TTL does."""
        self.graceful_pods = False
        """Set while a kubelet runs: a bound pod's graceful delete marks it Terminating for the kubelet to end."""

    # -- versions, log, listeners ---------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def compact(self) -> int:
        """Forget every retained event, as etcd compaction does; returns the compacted version."""
        with self._lock:
            self._log.clear()
            self._compacted = self._rv
            return self._rv

    @property
    def compacted(self) -> int:
        with self._lock:
            return self._compacted

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` (under the store's lock, so it must not block) on every event; returns an unsubscribe."""
        with self._lock:
            self._listeners.append(listener)
        return self.unsubscriber(listener)

    def unsubscriber(self, listener: Listener) -> Callable[[], None]:
        """A function that stops calling `listener` (harmless when it never subscribed)."""

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def snapshot(self, resource: str, namespace: str | None, listener: Listener) -> tuple[list[Obj], int]:
        """The objects of `resource` now, with `listener` subscribed atomically (a watch from "now")."""
        with self._lock:
            items, rv = self.list(resource, namespace)
            self._listeners.append(listener)
            return items, rv

    def replay(self, resource: str, since: int, listener: Listener) -> int:
        """Feed `listener` the retained events of `resource` after `since`, then subscribe it; atomic,
        so no event falls between the two. Raises 410 when `since` is older than the retained log."""
        with self._lock:
            if since < self._compacted or (self._log and since < self._log[0].rv - 1):
                raise ApiError(410, "Expired", f"too old resource version: {since} ({self._rv})")
            for event in self._log:
                if event.rv > since and event.resource == resource:
                    listener(event)
            self._listeners.append(listener)
            return self._rv

    def _emit(self, kind: str, key: Key, obj: Obj, prev: Obj | None) -> None:
        event = Event(self._rv, kind, key[0], key[1], copy.deepcopy(obj), prev)
        if len(self._log) == self._log.maxlen:
            self._compacted = self._log[0].rv
        self._log.append(event)
        for listener in list(self._listeners):
            listener(event)

    def _bump(self, obj: Obj) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    # -- reads ----------------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> Obj:
        with self._lock:
            obj = self._objects.get((resource, namespace, name))
            if obj is None:
                raise not_found(resource, name)
            return copy.deepcopy(obj)

    def list(self, resource: str, namespace: str | None, matches: Predicate = lambda _o: True) -> tuple[list[Obj], int]:
        """Matching objects (all namespaces when `namespace` is None) in name order, and the list's version."""
        with self._lock:
            chosen = [(key, obj) for key, obj in self._objects.items()
                      if key[0] == resource and (namespace is None or key[1] == namespace) and matches(obj)]
            chosen.sort(key=lambda pair: pair[0])  # sort only what is returned: events outnumber pods
            return [copy.deepcopy(obj) for _key, obj in chosen], self._rv

    # -- writes ---------------------------------------------------------------------------------

    def create(self, resource: str, namespace: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        with self._lock:
            name = meta.get("name") or ""
            if not name and meta.get("generateName"):
                name = f"{meta['generateName']}{secrets.token_hex(3)[:5]}"
            if not name:
                raise ApiError(422, "Invalid", f"{resource}: metadata.name: Required value")
            key = (resource, namespace, name)
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{resource} "{name}" already exists',
                               details={"name": name, "kind": resource})
            meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_iso())
            if namespace:
                meta["namespace"] = namespace
            obj.setdefault("kind", KINDS.get(resource, resource.capitalize()))
            obj.setdefault("apiVersion", "v1")
            meta.pop("deletionTimestamp", None)
            if resource == "pods":
                obj["status"] = {"phase": "Pending", "conditions": [], "qosClass": "BestEffort"}
            self._bump(obj)
            self._objects[key] = copy.deepcopy(obj)
            self._emit("ADDED", key, obj, None)
            if resource == "events":
                self._expire_events(key)
            return copy.deepcopy(obj)

    def update(self, resource: str, namespace: str, name: str, change: Callable[[Obj], Obj],
               *, expected_rv: str | None = None) -> Obj:
        """Replace an object by `change(copy)`; 409 Conflict when `expected_rv` is stale. Identity stays."""
        with self._lock:
            key = (resource, namespace, name)
            current = self._objects.get(key)
            if current is None:
                raise not_found(resource, name)
            if expected_rv and expected_rv != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": the object '
                               "has been modified; please apply your changes to the latest version and try again",
                               details={"name": name, "kind": resource})
            new = change(copy.deepcopy(current))
            meta = new.setdefault("metadata", {})
            for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                          "deletionGracePeriodSeconds"):
                if field in current["metadata"]:
                    meta[field] = current["metadata"][field]
                else:
                    meta.pop(field, None)
            meta["resourceVersion"] = current["metadata"]["resourceVersion"]
            if new == current:
                return copy.deepcopy(current)  # a no-op write keeps its version, as the real server does
            self._bump(new)
            self._objects[key] = copy.deepcopy(new)
            self._emit("MODIFIED", key, new, current)
            return copy.deepcopy(new)

    def delete(self, resource: str, namespace: str, name: str, *, grace_s: int | None = None,
               uid: str | None = None, rv: str | None = None) -> Obj:
        """Delete now, or for a bound pod under a running kubelet, mark it Terminating (the kubelet
        finishes it with `remove`). Preconditions on uid or resourceVersion answer 409 when they fail."""
        with self._lock:
            key = (resource, namespace, name)
            current = self._objects.get(key)
            if current is None:
                raise not_found(resource, name)
            meta = current["metadata"]
            if (uid and uid != meta["uid"]) or (rv and rv != meta["resourceVersion"]):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": '
                               f"Precondition failed: UID in precondition: {uid}, UID in object meta: {meta['uid']}")
            bound = resource == "pods" and bool(current.get("spec", {}).get("nodeName"))
            if self.graceful_pods and bound and grace_s != 0:
                if meta.get("deletionTimestamp"):
                    return copy.deepcopy(current)
                new = copy.deepcopy(current)
                default = current.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                new["metadata"].update(deletionTimestamp=now_iso(),
                                       deletionGracePeriodSeconds=default if grace_s is None else grace_s)
                self._bump(new)
                self._objects[key] = copy.deepcopy(new)
                self._emit("MODIFIED", key, new, current)
                return new
            return self._remove(key, current)

    def _expire_events(self, key: Key) -> None:
        self._event_keys.append(key)
        while len(self._event_keys) > EVENTS_KEPT:
            old = self._event_keys.popleft()
            if old in self._objects:
                self._remove(old, self._objects[old])

    def remove(self, resource: str, namespace: str, name: str) -> None:
        """The end of a Terminating pod (the kubelet's call once its processes are gone)."""
        with self._lock:
            current = self._objects.get((resource, namespace, name))
            if current is not None:
                self._remove((resource, namespace, name), current)

    def _remove(self, key: Key, current: Obj) -> Obj:
        gone = copy.deepcopy(current)
        self._bump(gone)
        del self._objects[key]
        self._emit("DELETED", key, gone, current)
        return gone
