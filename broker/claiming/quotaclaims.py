"""Team quotas inside the tracker: what each lease holds in quota or on loan, and who is reclaiming.

broker.fleet.quotas decides (pure); this module is the lock-held side: a claim's lease records whether it
borrowed, its GPUs count in the quota use until it is released, and a queued in-quota job that made
borrowers yield holds its GPUs out of what other teams may borrow until it is placed (or leaves), so a
re-queued borrower cannot take back the room freed for the owner.
"""

from __future__ import annotations

from broker.claiming.tracking import Lease, TrackerState
from broker.fleet.quotas import Kind, QuotasSpec, QuotaTree, QuotaUse, Verdict


class QuotaClaims:
    """Quota bookkeeping over the tracker's state; `use_quota` and `adopt_quota` expect the lock held, the others
    take it."""

    __slots__ = ("state",)

    def __init__(self, state: TrackerState) -> None:
        self.state = state

    def use_quota(self, lease: Lease) -> None:
        assert self.state.quotas is not None
        path = self.state.quotas.path(lease.caller)
        if path is not None:
            self.state.quota_use.add(path, lease.gpus, lease.borrowed)
            if self.state.reclaims:
                self.state.end_reclaim(lease.job_id)

    def adopt_quota(self, lease: Lease) -> None:
        """Recovery: a restarted broker cannot know how the job was placed; it counts in quota while it fits."""
        assert self.state.quotas is not None
        path = self.state.quotas.path(lease.caller)
        if path is not None:
            lease.borrowed = self.state.quotas.classify(lease.caller, lease.gpus, True, self.state.quota_use).kind is Kind.BORROWED
            self.state.quota_use.add(path, lease.gpus, lease.borrowed)

    def set_quotas(self, quotas: QuotasSpec | None) -> None:
        """A catalog reload: swap the tree and recount what the running leases hold under it, in one step under
        the lock. Each lease keeps its kind (in quota or borrowed); a caller the new tree does not name (its
        team was removed) is outside quotas from now on: no guarantee, nothing counted."""
        tree = QuotaTree(quotas) if quotas is not None and quotas.orgs else None
        use = QuotaUse()
        with self.state.lock:
            if tree is not None:
                for lease in self.state.leases.values():
                    path = tree.path(lease.caller)
                    if path is not None:
                        use.add(path, lease.gpus, lease.borrowed)
                for job_id, (team, gpus) in list(self.state.reclaims.items()):
                    if team in tree.guarantees:
                        use.reclaiming[team] = use.reclaiming.get(team, 0) + gpus
                    else:
                        del self.state.reclaims[job_id]
            else:
                self.state.reclaims.clear()
            self.state.quotas, self.state.quota_use = tree, use

    def leases(self) -> list[Lease]:
        """Every claimed pod set (a list copy), for the preemption decision outside the lock."""
        with self.state.lock:
            return list(self.state.leases.values())

    def quota_verdict(self, caller: str, gpus: int, preemptible: bool) -> Verdict | None:
        """How a job of `gpus` would be placed by quota now; None without quotas."""
        with self.state.lock:
            if self.state.quotas is None:
                return None
            return self.state.quotas.classify(caller, gpus, preemptible, self.state.quota_use)

    def reclaim(self, job_id: str, caller: str, gpus: int) -> None:
        """A queued in-quota job preempted borrowers: its GPUs stop being lendable until it is placed or leaves."""
        with self.state.lock:
            path = self.state.quotas.path(caller) if self.state.quotas is not None else None
            if path is None or job_id in self.state.reclaims:
                return
            self.state.reclaims[job_id] = (path.team, gpus)
            self.state.quota_use.reclaiming[path.team] = self.state.quota_use.reclaiming.get(path.team, 0) + gpus

    def drop_reclaim(self, job_id: str) -> None:
        """The job left the queue without being placed."""
        with self.state.lock:
            self.state.end_reclaim(job_id)

    def quota_view(self) -> dict[str, dict[str, int]]:
        """GPUs held in quota per quota node and borrowed per team (for /v1/pools and tests)."""
        with self.state.lock:
            return {"in_quota": dict(self.state.quota_use.in_quota), "borrowed": dict(self.state.quota_use.borrowed)}
