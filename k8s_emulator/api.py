"""The emulator's HTTP API: the core/v1 REST paths the `kubernetes` client calls, served by aiohttp.

Paths: `/api/v1/namespaces/{ns}/{resource}[/{name}[/status|/eviction]]`, `/api/v1/{resource}[/{name}]`
(cluster-scoped nodes, or a list across namespaces); `/apis/{group}/{version}/...` serves the same
store (events.k8s.io events). Errors are `Status` objects, so the client raises `ApiException`
with the right code. Watches are streamed by `watching`; `Faults` injects errors.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from k8s_emulator import disruption, validation
from k8s_emulator.faults import VERBS, Faults
from k8s_emulator.objects import CLUSTER_SCOPED, KINDS, ApiError, Obj, Store
from k8s_emulator.rbac import Authorizer
from k8s_emulator.selectors import (
    Predicate,
    SelectorError,
    field_selector,
    json_patch,
    label_selector,
    merge_patch,
)
from k8s_emulator.watching import Watches

SUBRESOURCES = ("status", "eviction")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass
class Api:
    """The HTTP side of the emulator: routes over a `Store`, with `Faults` and open watches."""

    store: Store
    faults: Faults = field(default_factory=Faults)
    authorizer: Authorizer | None = None
    """None: every request is allowed, with or without a token; else a token table and RBAC."""
    bookmark_interval_s: float = 1.0
    """How often a watch with allowWatchBookmarks gets a BOOKMARK (the real server: about a minute)."""
    watches: Watches = field(init=False)

    def __post_init__(self) -> None:
        self.watches = Watches(self.store, self.bookmark_interval_s)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/version", self._version)
        app.router.add_get("/api", self._versions)
        app.router.add_get("/api/v1", self._resources)
        app.router.add_get("/api/v1/", self._resources)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    @property
    def open_watches(self) -> int:
        """Watch streams being served now (a closed client's goes at the next event or bookmark)."""
        return self.watches.open

    def drop_watches(self) -> int:
        """Cut every open watch stream mid-stream (no final chunk, as a dropped connection); returns how many."""
        return self.watches.drop()

    def expire_watches(self) -> int:
        """Compact, then end every open watch with an ERROR 410 Gone; returns how many."""
        return self.watches.expire()

    def silence_watches(self) -> int:
        """Open watch streams send nothing more (no event, no bookmark) with their connection left open;
        returns how many."""
        return self.watches.silence()

    async def _version(self, _request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "31", "gitVersion": "v1.31.0-firepool-emulator",
                                  "platform": "linux/amd64"})

    async def _versions(self, _request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})

    async def _resources(self, _request: web.Request) -> web.Response:
        resources = [{"name": name, "singularName": kind.lower(), "namespaced": name not in CLUSTER_SCOPED,
                      "kind": kind, "verbs": list(VERBS)} for name, kind in KINDS.items()]
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._route(request)
        except ApiError as exc:
            headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else {}
            return web.json_response(exc.status(), status=exc.code, headers=headers)
        except (SelectorError, ValueError, json.JSONDecodeError) as exc:
            return web.json_response(ApiError(400, "BadRequest", str(exc)).status(), status=400)

    async def _route(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        group = ""
        if parts[:2] == ["api", "v1"]:
            rest = parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, rest = parts[1], parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or rest[0] not in KINDS or len(rest) > 3 or (len(rest) == 3 and rest[2] not in SUBRESOURCES):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        if resource in CLUSTER_SCOPED:
            namespace = ""
        q = request.query
        verb = {"GET": "get" if name else ("watch" if q.get("watch") in ("true", "1") else "list"),
                "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(request.method)
        if verb == "delete" and not name:
            verb = "deletecollection"
        if verb == "create" and sub == "eviction" and resource == "pods":
            verb = "evict"
        if verb is None or (verb in ("update", "patch") and not name) or (verb == "create" and name):
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported on {request.path}")
        if verb == "create" and namespace is None:
            raise ApiError(405, "MethodNotAllowed", f"create {resource} needs a namespace")
        if self.authorizer is not None:  # authentication, then RBAC, before anything else is looked at
            identity = self.authorizer.identify(request.headers.get("Authorization"))
            self.authorizer.check(identity, "create" if verb == "evict" else verb, group,
                                  f"{resource}/{sub}" if sub else resource, namespace or None, name)
        stall = self.faults.take_stall(verb, resource)
        if stall is not None:
            await stall.hold(request)
            if request.transport is None or request.transport.is_closing():
                raise ApiError(504, "Timeout", f"{verb} {resource} held silent")  # read by no one: it hung up
        fault = self.faults.take(verb, resource)
        if fault is not None and not (verb == "watch" and fault.code == 410):
            raise fault
        if verb != "watch" and self.faults.take_loss(verb, resource):
            answer = await self._serve(request, verb, resource, namespace, name, sub, None)
            if request.transport is not None:  # done, but the answer never reaches the client
                request.transport.abort()
            return answer
        return await self._serve(request, verb, resource, namespace, name, sub, fault)

    async def _serve(self, request: web.Request, verb: str, resource: str, namespace: str | None, name: str | None,
                     sub: str | None, fault: ApiError | None) -> web.StreamResponse:
        q = request.query
        if verb == "watch":
            return await self.watches.serve(request, resource, namespace, _selector(q), expire=fault)
        if verb == "list":
            return web.json_response(self._list(resource, namespace, q))
        if verb == "deletecollection":
            body = await request.json() if request.can_read_body else {}
            for item in self._list(resource, namespace, q)["items"]:
                meta = item["metadata"]
                with contextlib.suppress(ApiError):  # gone meanwhile
                    self._delete(resource, meta.get("namespace", ""), meta["name"], body, q)
            return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        assert name is not None or verb == "create"
        ns = namespace or ""
        if verb == "get":
            return web.json_response(self._with_status(resource, self.store.get(resource, ns, name or "")))
        body = await request.json() if request.can_read_body else {}
        if verb == "create":
            return web.json_response(self._create(resource, ns, body), status=201)
        if verb == "evict":  # the Eviction API: a graceful delete, unless it breaks the pod's budget (429)
            disruption.check_eviction(self.store, ns, name or "")
            self._delete(resource, ns, name or "", body.get("deleteOptions") or {}, {})
            return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                      "code": 201}, status=201)
        if verb == "update":
            return web.json_response(self._update(resource, ns, name or "", sub, body))
        if verb == "patch":
            return web.json_response(self._patch(resource, ns, name or "", sub, body, request.content_type))
        return web.json_response(self._delete(resource, ns, name or "", body, q))

    # -- verbs ----------------------------------------------------------------------------------

    def _list(self, resource: str, namespace: str | None, q: Any) -> Obj:
        matches = _selector(q)
        items, rv = self.store.list(resource, namespace, matches)
        meta: Obj = {"resourceVersion": str(rv)}
        limit = int(q.get("limit", "0") or 0)
        token = q.get("continue")
        if token:
            try:
                list_rv, after = json.loads(base64.urlsafe_b64decode(token.encode()))
            except (ValueError, TypeError) as exc:
                raise ApiError(400, "BadRequest", f"invalid continue token: {exc}") from exc
            if list_rv < self.store.compacted:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to display a consistent "
                               "list result. You can start a new list without the continue parameter.")
            items = [i for i in items if _sort_key(i) > tuple(after)]
            meta["resourceVersion"] = str(list_rv)
        if limit and len(items) > limit:
            items = items[:limit]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                [int(meta["resourceVersion"]), list(_sort_key(items[-1]))]).encode()).decode()
            meta["remainingItemCount"] = 0  # unknown without a snapshot; the client only reads `continue`
        kind = KINDS[resource]
        items = [self._with_status(resource, item) for item in items]
        return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta, "items": items}

    def _with_status(self, resource: str, obj: Obj) -> Obj:
        """A PodDisruptionBudget's status as its controller keeps it, figured from the pods now."""
        if resource == disruption.RESOURCE:
            pods = self.store.list("pods", obj["metadata"].get("namespace", ""))[0]
            obj["status"] = {**disruption.status(obj, pods),
                             "observedGeneration": obj["metadata"].get("generation", 1)}
        return obj

    def _create(self, resource: str, namespace: str, body: Obj) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        meta = body.setdefault("metadata", {})
        if meta.get("namespace") and namespace and meta["namespace"] != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                           "sent on the request")
        name = meta.get("name")
        if name is not None and (len(name) > 253 or not _DNS_SUBDOMAIN.match(name)):
            raise ApiError(422, "Invalid", f'{KINDS[resource]} "{name}" is invalid: metadata.name: Invalid value: '
                           "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                           "'-' or '.'")
        if resource == "pods" and not (body.get("spec") or {}).get("containers"):
            raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: spec.containers: Required value')
        body.setdefault("kind", KINDS[resource])
        if resource == "pods":
            validation.default_pod(body)
        validation.check(body)
        if resource == "secrets":
            for key, value in (body.get("stringData") or {}).items():  # the server folds stringData into data
                body.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode()
            body.pop("stringData", None)
        return self.store.create(resource, namespace, body)

    def _update(self, resource: str, namespace: str, name: str, sub: str | None, body: Obj) -> Obj:
        expected = (body.get("metadata") or {}).get("resourceVersion")
        return self.store.update(resource, namespace, name, lambda old: _spliced(old, body, sub, resource),
                                 expected_rv=expected)

    def _patch(self, resource: str, namespace: str, name: str, sub: str | None, body: Any, content_type: str) -> Obj:
        def change(old: Obj) -> Obj:
            if content_type == "application/json-patch+json":
                patched = json_patch(old, body)
            elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                patched = merge_patch(old, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the patch type {content_type!r} is not supported")
            return _spliced(old, patched, sub, resource)

        expected = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        return self.store.update(resource, namespace, name, change, expected_rv=expected)

    def _delete(self, resource: str, namespace: str, name: str, body: Any, q: Any) -> Obj:
        options = body if isinstance(body, dict) else {}
        grace = options.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
        pre = options.get("preconditions") or {}
        return self.store.delete(resource, namespace, name, grace_s=None if grace is None else int(grace),
                                 uid=pre.get("uid"), rv=pre.get("resourceVersion"))

def _selector(q: Any) -> Predicate:
    labels = label_selector(q.get("labelSelector"))
    fields = field_selector(q.get("fieldSelector"))
    return lambda obj: labels(obj) and fields(obj)


def _sort_key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


def _spliced(old: Obj, new: Obj, sub: str | None, resource: str) -> Obj:
    """What a write may change: the status subresource only the status; the object all but its status."""
    if not isinstance(new, dict):
        raise ApiError(400, "BadRequest", "the body must be a JSON object")
    if sub == "status":
        result = {**old, "status": new.get("status", {})}
    elif resource in ("pods", "nodes"):
        result = {**new, "status": old.get("status", {})}
    else:
        result = new
    validation.check(result)
    return result

