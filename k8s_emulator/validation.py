"""The API server's checks that a manifest schema does not catch, answered 422 Invalid as it does.

Label keys and values, annotation keys and their total size, and extended resources (any resource
name with a domain outside kubernetes.io, such as nvidia.com/gpu): they cannot be overcommitted,
so a request needs an equal limit. Also the defaults the server fills in on a new pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from k8s_emulator.objects import ApiError, Obj

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ANNOTATIONS_MAX_BYTES = 256 * 1024


def _invalid(obj: Obj, field: str, value: Any, why: str) -> ApiError:
    meta = obj.get("metadata") or {}
    return ApiError(422, "Invalid", f'{obj.get("kind", "object")} "{meta.get("name", "")}" is invalid: '
                    f"{field}: Invalid value: {value!r}: {why}", details={"name": meta.get("name", "")})


def _key_error(key: Any) -> str | None:
    if not isinstance(key, str):
        return "a key must be a string"
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "a key's prefix must be a lowercase DNS subdomain of at most 253 characters"
    if len(name) > 63 or not _NAME.match(name):
        return ("a key's name must be at most 63 alphanumeric characters, '-', '_' or '.', starting and ending "
                "with an alphanumeric character")
    return None


def check(obj: Obj) -> None:
    """Raise 422 Invalid where the API server would refuse `obj`."""
    meta = obj.get("metadata") or {}
    for key, value in (meta.get("labels") or {}).items():
        why = _key_error(key)
        if why:
            raise _invalid(obj, "metadata.labels", key, why)
        if not isinstance(value, str) or len(value) > 63 or not _VALUE.match(value):
            raise _invalid(obj, "metadata.labels", value, "a label value must be at most 63 alphanumeric characters, "
                           "'-', '_' or '.', starting and ending with an alphanumeric character")
    annotations = meta.get("annotations") or {}
    for key, value in annotations.items():
        why = _key_error(key) or (None if isinstance(value, str) else "an annotation value must be a string")
        if why:
            raise _invalid(obj, "metadata.annotations", key, why)
    if sum(len(k) + len(v) for k, v in annotations.items()) > ANNOTATIONS_MAX_BYTES:
        raise _invalid(obj, "metadata.annotations", "...", f"may not be more than {ANNOTATIONS_MAX_BYTES} bytes")
    if obj.get("kind") == "Pod":
        for i, container in enumerate((obj.get("spec") or {}).get("containers") or []):
            _check_extended(obj, f"spec.containers[{i}].resources", container.get("resources") or {})


def _extended(name: str) -> bool:
    domain = name.split("/", 1)[0] if "/" in name else ""
    return bool(domain) and not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def _check_extended(obj: Obj, field: str, resources: Mapping[str, Any]) -> None:
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for name, value in requests.items():
        if not _extended(name):
            continue
        if name not in limits:
            raise _invalid(obj, f"{field}.limits[{name}]", None, "Limit must be set for non overcommitable resources")
        if str(limits[name]) != str(value):
            raise _invalid(obj, f"{field}.requests[{name}]", value, f"must be equal to {name} limit of {limits[name]}")


def default_pod(pod: Obj) -> None:
    """Fill in what the API server defaults on a new pod (the fields a reader may rely on)."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    for container in spec.get("containers") or []:
        image = str(container.get("image", ""))
        latest = image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]
        container.setdefault("imagePullPolicy", "Always" if latest and "@" not in image else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        if limits:  # a limit without a request requests the limit
            resources["requests"] = {**limits, **(resources.get("requests") or {})}
