"""Team quotas inside the tracker: what each lease holds in quota or on loan, and who is reclaiming.

broker.fleet.quotas decides (pure); this module is the lock-held side: a claim's lease records whether it
borrowed, its GPUs count in the quota use until it is released, and a queued in-quota job that made
borrowers yield holds its GPUs out of what other teams may borrow until it is placed (or leaves), so a
re-queued borrower cannot take back the room freed for the owner.
"""

from __future__ import annotations

from broker.claiming.gangclaims import GangClaims
from broker.claiming.tracking import Lease
from broker.fleet.quotas import Kind, QuotasSpec, QuotaTree, QuotaUse, Verdict


class QuotaClaims(GangClaims):
    """Quota bookkeeping; the public methods take the tracker lock, the private ones expect it held."""

    def _use_quota(self, lease: Lease) -> None:
        assert self._quotas is not None
        path = self._quotas.path(lease.caller)
        if path is not None:
            self._quota_use.add(path, lease.gpus, lease.borrowed)
            if self._reclaims:
                self._end_reclaim(lease.job_id)

    def _adopt_quota(self, lease: Lease) -> None:
        """Recovery: a restarted broker cannot know how the job was placed; it counts in quota while it fits."""
        assert self._quotas is not None
        path = self._quotas.path(lease.caller)
        if path is not None:
            lease.borrowed = self._quotas.classify(lease.caller, lease.gpus, True, self._quota_use).kind is Kind.BORROWED
            self._quota_use.add(path, lease.gpus, lease.borrowed)

    def set_quotas(self, quotas: QuotasSpec | None) -> None:
        """A catalog reload: swap the tree and recount what the running leases hold under it, in one step under
        the lock. Each lease keeps its kind (in quota or borrowed); a caller the new tree does not name (its
        team was removed) is outside quotas from now on: no guarantee, nothing counted."""
        tree = QuotaTree(quotas) if quotas is not None and quotas.orgs else None
        use = QuotaUse()
        with self._lock:
            if tree is not None:
                for lease in self._leases.values():
                    path = tree.path(lease.caller)
                    if path is not None:
                        use.add(path, lease.gpus, lease.borrowed)
                for job_id, (team, gpus) in list(self._reclaims.items()):
                    if team in tree.guarantees:
                        use.reclaiming[team] = use.reclaiming.get(team, 0) + gpus
                    else:
                        del self._reclaims[job_id]
            else:
                self._reclaims.clear()
            self._quotas, self._quota_use = tree, use

    def leases(self) -> list[Lease]:
        """Every claimed pod set (a list copy), for the preemption decision outside the lock."""
        with self._lock:
            return list(self._leases.values())

    def quota_verdict(self, caller: str, gpus: int, preemptible: bool) -> Verdict | None:
        """How a job of `gpus` would be placed by quota now; None without quotas."""
        with self._lock:
            if self._quotas is None:
                return None
            return self._quotas.classify(caller, gpus, preemptible, self._quota_use)

    def reclaim(self, job_id: str, caller: str, gpus: int) -> None:
        """A queued in-quota job preempted borrowers: its GPUs stop being lendable until it is placed or leaves."""
        with self._lock:
            path = self._quotas.path(caller) if self._quotas is not None else None
            if path is None or job_id in self._reclaims:
                return
            self._reclaims[job_id] = (path.team, gpus)
            self._quota_use.reclaiming[path.team] = self._quota_use.reclaiming.get(path.team, 0) + gpus

    def drop_reclaim(self, job_id: str) -> None:
        """The job left the queue without being placed."""
        with self._lock:
            self._end_reclaim(job_id)

    def quota_view(self) -> dict[str, dict[str, int]]:
        """GPUs held in quota per quota node and borrowed per team (for /v1/pools and tests)."""
        with self._lock:
            return {"in_quota": dict(self._quota_use.in_quota), "borrowed": dict(self._quota_use.borrowed)}
