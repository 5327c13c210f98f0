"""The search for a gang that must stay together: all its pods on one node, or within one topology domain.

A gang whose topology (its own, else its pool's) is `node` or `domain` takes its whole set from one group
(a node, or the nodes of one domain) or nothing: it never runs split. Within a group the usual order
holds: pods made for it (the pool controller creates a waiting set's pods on one node, reserved for it,
the way single-use sets are made), the session's own pods, `reuse_tag: hint` pods, never-used pods, then
the caller's pods of other sessions when it may recycle. A caller's held pod on another node is not
taken; standbys and ceiling takeovers are left to unconfined claims. Pods whose node is unknown (a
backend that reports none, a CPU pool) form one group: nothing says they are apart.

Runs under the tracker lock: the groups are read off the per-node index of never-used pods (one pass over
the nodes that hold any) and the caller's own few pods; the node -> domain map is computed outside the
lock and swapped in whole (`set_domains`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from broker.claiming.searching import Search
from broker.claiming.tracking import (
    REASON_NO_IDLE,
    REASON_NO_SESSION_POD,
    REASON_TAG_HINT,
    Bucket,
    Claim,
    Pick,
    Shortfall,
)
from broker.pods import Origin, Path, Pod, PodState

REASON_NO_SET = "no node holds the whole set"
"""Prefix of a confined gang's shortfall: the pool controller is asked for a set on one node (or domain)."""


class SetSearch(Search):
    """The lock-held pick of a confined gang; `set_domains` is the one method that needs no lock."""

    def set_domains(self, domains: Mapping[str, str]) -> None:
        """node id -> topology domain, as the backend reports nodes (the pool controller sets it each pass)."""
        self._domains = dict(domains)  # one reference swap: a claim reads either the old map or the new one

    def _pick_set(self, bucket: Bucket, want: Claim, where: str) -> list[Pick] | Shortfall:
        """The whole set from one group (`where`: node or domain), warmest group first, or a shortfall."""
        domains = self._domains if where == "domain" else None

        def group(node: str) -> str:
            return domains.get(node, node) if domains is not None else node

        warm: dict[str, int] = {}
        for pod, _, _ in self._warm(bucket, want):
            g = group(pod.node)
            warm[g] = warm.get(g, 0) + 1
        fresh: dict[str, int] = {}
        placed = 0
        for node, on in bucket.fresh_by_node.items():
            g = group(node)
            fresh[g] = fresh.get(g, 0) + len(on)
            placed += len(on)
        if len(bucket.fresh) > placed:
            fresh[""] = fresh.get("", 0) + len(bucket.fresh) - placed
        fits = [g for g in {*warm, *fresh} if warm.get(g, 0) + fresh.get(g, 0) >= want.pods]
        # Warmest group first; among equals the one with the fewest never-used pods (best-fit: whole
        # nodes of idle pods stay whole for the next set).
        fits.sort(key=lambda g: (-warm.get(g, 0), fresh.get(g, 0), g))
        for g in fits:
            picked = self._pick_in(bucket, want, g, group)
            if picked is not None:
                return picked
        return Shortfall(f"{REASON_NO_SET} ({where} topology)", want.pods)

    def _warm(self, bucket: Bucket, want: Claim) -> Iterator[Pick]:
        """The pods this claim may take before never-used ones: made for it, its session's, hint, recycled."""
        made = self._reserved.get(want.job_id)
        for pod in made or ():
            new = pod.idle_since >= want.since
            yield pod, Path.NEW if new else Path.WARM, REASON_NO_IDLE if new else REASON_NO_SESSION_POD
        key = (want.caller, want.queue, want.tag)
        own = bucket.by_key.get(key)
        for pod in reversed(own.values()) if own else ():
            yield pod, Path.WARM, None
        mine = bucket.by_caller.get(want.caller)
        hint = bucket.hint
        if mine and hint:
            for pod in reversed(mine.values()):
                if pod.key is not None and pod.key != key and pod.key[1] == want.queue:
                    yield pod, Path.WARM, REASON_TAG_HINT
        if mine and want.recycle:
            reason = bucket.recycled_reason()
            for pod in mine.values():  # least recently released first, as in the unconfined search
                if pod.key != key and not (hint and pod.key is not None and pod.key[1] == want.queue):
                    yield pod, Path.RECYCLED, reason

    def _fresh_in(self, bucket: Bucket, want: Claim, g: str, group: Callable[[str], str]) -> Iterator[Pick]:
        if g == "":
            pods: list[Pod] = [p for p in bucket.fresh.values() if not p.node]
        else:
            pods = [p for node, on in bucket.fresh_by_node.items() if group(node) == g for p in on.values()]
        for pod in reversed(pods):
            new = pod.idle_since >= want.since
            yield pod, Path.NEW if new else Path.WARM, REASON_NO_IDLE if new else REASON_NO_SESSION_POD

    def _pick_in(self, bucket: Bucket, want: Claim, g: str, group: Callable[[str], str]) -> list[Pick] | None:
        """The whole set from group `g` in search order (never two pods on one card), or None."""
        picked: list[Pick] = []
        taken: set[str] = set()
        cards: set[str] = set()
        for sources in (self._warm(bucket, want), self._fresh_in(bucket, want, g, group)):
            for pod, path, reason in sources:
                if (
                    pod.name in taken
                    or group(pod.node) != g
                    or not self._gate_open(pod)
                    or not cards.isdisjoint(pod.gpus)
                ):
                    continue
                picked.append((pod, path, reason))
                taken.add(pod.name)
                cards.update(pod.gpus)
                if len(picked) == want.pods:
                    return picked
        return None

    def _settle_set(self, want: Claim, picked: Sequence[Pick]) -> None:
        """After a confined claim: its pods are nobody's reservation now, and pods made for it that it did not
        need go back to the pool as never-used pods."""
        for pod, _, _ in picked:
            pod.reserved_for = None
        for pod in self._reserved.pop(want.job_id, ()):
            pod.reserved_for = None
            self._index_idle(pod)

    def unreserve(self, pods: Iterable[Pod]) -> None:
        """Pods made for a confined set whose job no longer waits (placed elsewhere, cancelled): they join the
        pool as never-used pods, starting or idle (a set's pods are plain pool pods, unlike single-use ones)."""
        with self._lock:
            for pod in pods:
                if (
                    pod.reserved_for is None
                    or pod.origin is not Origin.DEMAND
                    or self.pods.get(pod.name) is not pod
                ):
                    continue
                if pod.state is PodState.IDLE:
                    self._unindex_idle(pod)
                    pod.reserved_for = None
                    self._index_idle(pod)
                elif pod.state is PodState.STARTING:
                    pod.reserved_for = None
