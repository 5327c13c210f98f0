"""The search for a gang that must stay together: all its pods on one node, or within one topology domain.

A gang whose topology (its own, else its pool's) is `node` or `domain` takes its whole set from one group
(a node, or the nodes of one domain) or nothing: it never runs split. Within a group the usual order
holds: pods made for it (the pool controller creates a waiting set's pods on one node, reserved for it,
the way single-use sets are made), the session's own pods, `reuse_tag: hint` pods, never-used pods, then
the caller's pods of other sessions when it may recycle. A caller's held pod on another node is not
taken; standbys and ceiling takeovers are left to unconfined claims. When the pool's pods report no
node (a CPU pool, a backend without nodes) they form one group: nothing says they are apart.

Runs under the tracker lock: a gang whose warm pods (made for it, its own) hold the set needs no pass over
the nodes; otherwise the group is read off the per-node index of never-used pods in one pass, as the
unconfined gang search does. The node -> domain map is computed outside the lock and swapped in whole
(`set_domains`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Reversible, Sequence

from broker.claiming.tracking import (
    REASON_NO_IDLE,
    REASON_NO_SESSION_POD,
    REASON_TAG_HINT,
    REASON_TAKEOVER,
    Bucket,
    Claim,
    Pick,
    Shortfall,
    TrackerState,
)
from broker.pods import Origin, Path, Pod, PodState

REASON_NO_SET = "no node holds the whole set"
"""Prefix of a confined gang's shortfall: the pool controller is asked for a set on one node (or domain)."""


class SetSearch:
    """The lock-held pick of a confined gang over the tracker's state; `set_domains` is the one method that needs
    no lock, `unreserve` takes it."""

    __slots__ = ("state",)

    def __init__(self, state: TrackerState) -> None:
        self.state = state

    def set_domains(self, domains: Mapping[str, str]) -> None:
        """node id -> topology domain, as the backend reports nodes (the pool controller sets it each pass)."""
        self.state.domains = dict(domains)  # one reference swap: a claim reads either the old map or the new one

    def pick_set(self, bucket: Bucket, want: Claim, where: str) -> list[Pick] | Shortfall:
        """The whole set from one group (`where`: node or domain), warmest group first, or a shortfall."""
        domains = self.state.domains if where == "domain" else None

        def group(node: str) -> str:
            return domains.get(node, node) if domains is not None else node

        n = want.pods
        warm: dict[str, int] = {}
        for pod, _, _ in self._warm(bucket, want):
            g = group(pod.node)
            warm[g] = warm.get(g, 0) + 1
        # The groups that hold warm pods first, warmest first, topped up with never-used pods there: a gang
        # that ran before finds its own pods without a pass over the nodes.
        for g in sorted(warm, key=warm.__getitem__, reverse=True):
            if warm[g] + self._fresh_count(bucket, g, group, domains is not None) >= n:
                picked = self._pick_in(bucket, want, g, group)
                if picked is not None:
                    return picked
        # Never-used pods only: the group with the fewest that still holds the set (best-fit: whole nodes of
        # idle pods stay whole for the next set), found in one pass over the per-node index.
        if domains is None:
            fits = [
                (len(on), node)
                for node, on in bucket.fresh_by_node.items()
                if len(on) >= n and node not in warm
            ]
        else:
            counts: dict[str, int] = {}
            for node, on in bucket.fresh_by_node.items():
                g = group(node)
                counts[g] = counts.get(g, 0) + len(on)
            fits = [(c, g) for g, c in counts.items() if c >= n and g not in warm]
        if not bucket.fresh_by_node and len(bucket.fresh) >= n and "" not in warm:
            fits.append((len(bucket.fresh), ""))  # no pod reports a node: one group
        while fits:
            best = min(fits)
            fits.remove(best)
            picked = self._pick_in(bucket, want, best[1], group)
            if picked is not None:
                return picked
        return Shortfall(f"{REASON_NO_SET} ({where} topology)", n)

    @staticmethod
    def _fresh_count(bucket: Bucket, g: str, group: Callable[[str], str], domain: bool) -> int:
        """Never-used idle pods in group `g` ("": pods whose node is unknown)."""
        if g == "":
            return len(bucket.fresh) - sum(len(on) for on in bucket.fresh_by_node.values())
        if domain:
            return sum(len(on) for node, on in bucket.fresh_by_node.items() if group(node) == g)
        on = bucket.fresh_by_node.get(g)
        return len(on) if on else 0

    def _warm(self, bucket: Bucket, want: Claim) -> Iterator[Pick]:
        """The pods this claim may take before never-used ones: made for it, its session's, hint, recycled."""
        made = self.state.reserved.get(want.job_id)
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
        if mine and want.recycle and (not bucket.keeps or self.state.full(bucket)):  # live sessions kept below the ceiling
            reason = REASON_TAKEOVER if bucket.keeps else bucket.recycled_reason()
            for pod in mine.values():  # least recently released first, as in the unconfined search
                if pod.key != key and pod.key not in self.state.queued_sessions \
                        and not (hint and pod.key is not None and pod.key[1] == want.queue):
                    yield pod, Path.RECYCLED, reason

    def _fresh_in(self, bucket: Bucket, want: Claim, g: str, group: Callable[[str], str]) -> Iterator[Pick]:
        pods: Reversible[Pod]
        if g == "":
            pods = [p for p in bucket.fresh.values() if not p.node]
        elif (on := bucket.fresh_by_node.get(g)) is not None and group(g) == g:  # a node: its own index
            pods = on.values()
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
                    or not self.state.gate_open(pod)
                    or not cards.isdisjoint(pod.gpus)
                ):
                    continue
                picked.append((pod, path, reason))
                taken.add(pod.name)
                cards.update(pod.gpus)
                if len(picked) == want.pods:
                    return picked
        return None

    def settle_set(self, want: Claim, picked: Sequence[Pick]) -> None:
        """After a confined claim: its pods are nobody's reservation now, and pods made for it that it did not
        need go back to the pool as never-used pods."""
        for pod, _, _ in picked:
            pod.reserved_for = None
        for pod in self.state.reserved.pop(want.job_id, ()):
            pod.reserved_for = None
            self.state.index_idle(pod)

    def unreserve(self, pods: Iterable[Pod]) -> None:
        """Pods made for a confined set whose job no longer waits (placed elsewhere, cancelled): they join the
        pool as never-used pods, starting or idle (a set's pods are plain pool pods, unlike single-use ones)."""
        with self.state.lock:
            for pod in pods:
                if (
                    pod.reserved_for is None
                    or pod.origin is not Origin.DEMAND
                    or self.state.pods.get(pod.name) is not pod
                ):
                    continue
                if pod.state is PodState.IDLE:
                    self.state.unindex_idle(pod)
                    pod.reserved_for = None
                    self.state.index_idle(pod)
                elif pod.state is PodState.STARTING:
                    pod.reserved_for = None
