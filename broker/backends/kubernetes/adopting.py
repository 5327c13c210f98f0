"""Creates that survive their own retries: a 409 AlreadyExists for an object this very create made is adopted.

A create whose answer was lost (a read timeout, a dropped connection, a 5xx from a proxy after the API
server stored the object) is retried, and the retry meets the object the first try made. It is ours when
it carries our labels and what only this create wrote: the pod its `firepool.io/created-at` annotation
(this create's own clock reading), the Secret its bearer secret (random, made for this pod). Anything
else under the name (another broker's pod, a leftover of an earlier pod) stays an error, and is never
deleted by the failed create's cleanup.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from broker.backends.kubernetes.kubeapi import Conflict
from broker.backends.kubernetes.manifests import ANN_CREATED

log = logging.getLogger("firepool.k8s")


class NotOurs(Conflict):
    """The name is taken by an object this create did not make."""


class _Api(Protocol):
    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def read(self, kind: str, name: str) -> dict[str, Any] | None: ...


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def is_ours(found: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Did the create of `body` make `found`? Our labels, and this create's own mark."""
    want, have = _meta(body), _meta(found)
    labels = have.get("labels") or {}
    if any(labels.get(k) != v for k, v in (want.get("labels") or {}).items()):
        return False
    if body.get("kind") == "Pod":
        mark = (want.get("annotations") or {}).get(ANN_CREATED)
        return bool(mark) and (have.get("annotations") or {}).get(ANN_CREATED) == mark
    mine, theirs = body.get("data") or {}, found.get("data") or {}
    return bool(mine) and mine.keys() == theirs.keys() and all(
        hmac.compare_digest(str(mine[k]).encode(), str(theirs[k]).encode()) for k in mine)


async def create_or_adopt(api: _Api, body: Mapping[str, Any]) -> dict[str, Any]:
    """`api.create(body)`; on a 409 the object under that name when this create made it, else `NotOurs`."""
    kind, name = str(body["kind"]), str(_meta(body)["name"])
    try:
        return await api.create(body)
    except Conflict as exc:
        found = await api.read(kind, name)
        if found is None or not is_ours(found, body):
            raise NotOurs(f"create {kind.lower()} {name}: the name is taken by an object this broker did not "
                          "make here; left alone", details={"status": 409}) from exc
        log.info("create %s %s: AlreadyExists, made by this create's earlier try: adopted", kind.lower(), name)
        return found
