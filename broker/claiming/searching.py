"""The search order inside a pool: which idle pod a claim takes, and why a warmer one was not used.

The session's own idle pod (warm) -> with `reuse_tag: hint`, the caller's pod of another tag on the same
queue (warm) -> a never-used idle pod (warm when it was ready before the job came, new when the job
waited for it) -> the caller's idle pod of another session (recycled; only when the claim may recycle and
the pool's `reuse_tag` is `retire` or `hint`) -> a zero-VRAM standby on an active GPU (standby: promoted at the per-GPU gate) -> at the pool's
ceiling or budget with no pod starting, the caller's least recently used session's pod (recycled, a
takeover; in a `boundary` pool the only way one session empties another's pod) -> nothing: the
shortfall is demand for the pool controller, and the caller waits for a new pod. Neither a recycle nor
a takeover takes the pod of a session whose own next job is queued (`queued_sessions`, set by the
dispatcher each pass): that job runs on it warm in the same pass, where taking it would cost the session
a pod start (and, with `reuse_tag: retire`, the pod itself).

Runs under the tracker lock (broker.claiming.tracker): no I/O, no logging, small allocations only.
"""

from __future__ import annotations

from broker.claiming.tracking import (
    ASSIGNED,
    IDLE,
    REASON_IMAGE_NEW,
    REASON_IMAGE_STARTING,
    REASON_NO_IDLE,
    REASON_NO_SESSION_POD,
    REASON_SESSION_RESETTING,
    REASON_SINGLE_USE,
    REASON_STANDBY,
    REASON_TAG_HINT,
    REASON_TAKEOVER,
    RESETTING,
    RUNNING,
    Bucket,
    Claim,
    Pick,
    Shortfall,
    TrackerState,
)
from broker.images import pinned
from broker.pods import Path, Pod


class Search:
    """The lock-held pick steps of a claim over the tracker's state (the fast path itself stays inline in
    Tracker.claim)."""

    __slots__ = ("state",)

    def __init__(self, state: TrackerState) -> None:
        self.state = state

    def over_limit(self, want: Claim, gpus_per_pod: int) -> bool:
        limits = self.state.limits.get(want.caller) or self.state.limits.get("default")
        if limits is None:
            return False
        held_gpus, held_pods = self.state.usage.get(want.caller) or (0, 0)
        return ((limits.max_pods is not None and held_pods + want.pods > limits.max_pods)
                or (limits.max_gpus is not None and held_gpus + want.pods * gpus_per_pod > limits.max_gpus))

    def pick(self, bucket: Bucket, want: Claim) -> list[Pick] | Shortfall:
        """The general search: whole set in search order, or a shortfall that takes nothing."""
        n = want.pods
        key = (want.caller, want.queue, want.tag)
        picked: list[Pick] = []
        taken: set[str] = set()
        cards: set[str] = set()
        """Devices of the pods picked so far: a set never puts two of its pods on one card."""

        def usable(pod: Pod) -> bool:
            return pod.name not in taken and self.state.gate_open(pod) and cards.isdisjoint(pod.gpus)

        def take(pod: Pod, path: str, reason: str | None) -> bool:
            picked.append((pod, path, reason))
            taken.add(pod.name)
            cards.update(pod.gpus)
            return len(picked) == n

        own = bucket.by_key.get(key)
        if own:
            for pod in reversed(own.values()):
                if usable(pod) and take(pod, Path.WARM, None):
                    return picked
        mine = bucket.by_caller.get(want.caller)
        if bucket.hint and mine:
            for pod in reversed(mine.values()):
                if pod.key is not None and pod.key[1] == want.queue and usable(pod) \
                        and take(pod, Path.WARM, REASON_TAG_HINT):
                    return picked
        def fresh(pod: Pod) -> bool:
            """Take a never-used (or unheld) idle pod: `new` when it was made after the job queued."""
            path = Path.NEW if pod.idle_since >= want.since else Path.WARM
            return take(pod, path, REASON_NO_IDLE if path is Path.NEW else REASON_NO_SESSION_POD)

        if n > 1:  # a gang first takes the pods made beside each other for it (the cluster's pod affinity)
            for pod in reversed(bucket.fresh.values()):
                if pod.gang == want.job_id and usable(pod) and fresh(pod):
                    return picked
        need = n - len(picked)
        if need > 1 and len(bucket.fresh_by_node) > 1:
            # A gang's never-used pods from one node: the node with the fewest that still holds the rest
            # (best-fit, so whole nodes of idle pods stay whole); one pass over the per-node index.
            best: dict[str, Pod] | None = None
            for on in bucket.fresh_by_node.values():
                if need <= len(on) and (best is None or len(on) < len(best)):
                    best = on
            for pod in reversed(best.values()) if best is not None else ():
                if usable(pod) and fresh(pod):
                    return picked
        for pod in reversed(bucket.fresh.values()):
            if usable(pod) and fresh(pod):
                return picked
        waiting = self.state.queued_sessions  # a session whose job is queued comes back now: its pod is not given up
        # `boundary` pools keep a caller's live sessions: another session recycles none while a pod can be made.
        recycles = want.recycle and not bucket.keeps
        if mine and recycles:
            # Least recently released first: the session least likely to come back gives its pod up.
            reason = bucket.recycled_reason()
            for pod in list(mine.values()):
                if usable(pod) and pod.key not in waiting and take(pod, Path.RECYCLED, reason):
                    return picked
        if bucket.standby:
            # A standby may wait at the gate for its card's job: that wait is the handover. Cards nobody
            # else needs come first (the caller's own card it is leaving, an empty one), then cards another
            # caller is between steps on, then cards still running or about to run a job.
            for pod in sorted(bucket.standby.values(), key=lambda p: self.card_rank(p, want.caller)):
                if pod.name in taken or not cards.isdisjoint(pod.gpus) \
                        or (self.state.unverified and not self.state.unverified.isdisjoint(pod.gpus)):
                    continue
                if take(pod, Path.STANDBY, REASON_STANDBY):
                    return picked
        if mine and not recycles and self.state.full(bucket):
            # A live session gives way only at the ceiling (or the budget) with no pod starting: the caller's
            # least recently used session hands its pod over (the agent empties the workspace at the session
            # change), and its next claim is told so (Tracker._tell_taken).
            reason = bucket.recycled_reason() if bucket.retire else REASON_TAKEOVER
            for pod in list(mine.values()):
                if usable(pod) and pod.key not in waiting and take(pod, Path.RECYCLED, reason):
                    return picked
        return Shortfall("no idle pod", n - len(picked))

    def session_pod_resetting(self, want: Claim) -> Shortfall | None:
        """A session whose own pod is still resetting waits the few ms for it rather than take another
        pod: the result is committed while the reset runs, so a quick next call must not lose its warm
        workspace (a failed reset retires the pod and the next pass takes another)."""
        if self.state.returning_keys.get((want.caller, want.queue, want.tag)):
            return Shortfall(REASON_SESSION_RESETTING, want.pods)
        return None

    def card_rank(self, pod: Pod, caller: str) -> int:
        """How soon a standby on this card can run, and whether taking it crowds another caller's card.

        0: nobody else needs the card (no other pod on it, or the caller's own, or one that retires);
        1: another caller's pod is resetting or held there between its steps: its next step wants the card;
        2: a job runs there, or one was claimed there and takes the gate at launch.
        The card's users are the gate's holder and the pod last claimed on it (recovery adopts a running
        pod through the gate alone)."""
        rank = 0
        for g in pod.gpus:
            for name in (self.state.gate.get(g), self.state.claimed.get(g)):
                other = self.state.pods.get(name) if name else None
                if other is None or other is pod:
                    continue
                if other.state is ASSIGNED or other.state is RUNNING:
                    return 2
                if (other.state is IDLE or other.state is RESETTING) and not other.retire \
                        and other.caller != caller:
                    rank = 1
        return rank

    def pick_reserved(self, want: Claim) -> list[Pick] | Shortfall:
        ready = self.state.reserved.get(want.job_id, [])
        if len(ready) < want.pods:
            return Shortfall("single-use pod starting", want.pods - len(ready))
        del self.state.reserved[want.job_id]
        return [(pod, Path.NEW, REASON_SINGLE_USE) for pod in ready[: want.pods]]

    def pick_image(self, bucket: Bucket, want: Claim) -> list[Pick] | Shortfall:
        """A custom-image job: the caller's idle pods of its digest-pinned image first (reuse), then pods made
        for it; a mutable tag (or `single_use`) only the pods made for it. Never a shared pod."""
        picked: list[Pick] = []
        cards: set[str] = set()
        mine = bucket.images.get((want.caller, want.image)) if pinned(want.image) and not want.single_use else None
        if mine:
            for pod in reversed(mine.values()):
                if self.state.gate_open(pod) and cards.isdisjoint(pod.gpus):
                    picked.append((pod, Path.CUSTOM_IMAGE, None))
                    cards.update(pod.gpus)
                    if len(picked) == want.pods:
                        return picked
        ready = self.state.reserved.get(want.job_id, [])
        made = [p for p in ready if cards.isdisjoint(p.gpus)][: want.pods - len(picked)]
        if len(picked) + len(made) < want.pods:
            return Shortfall(REASON_IMAGE_STARTING, want.pods - len(picked) - len(made))
        for pod in made:
            ready.remove(pod)
        if not ready:
            self.state.reserved.pop(want.job_id, None)
        return picked + [(pod, Path.CUSTOM_IMAGE, REASON_IMAGE_NEW) for pod in made]
