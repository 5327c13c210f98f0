"""Team quotas with borrowing: the catalog's `quotas:` tree (org -> team -> caller) and who may take what.

Each node may guarantee GPUs. A job fits its guarantee when every guaranteed node on its caller's path
still has room for the job's GPUs; it then runs *in quota* (never preempted when it is not preemptible).
A job beyond its guarantee may run only when it says `preemptible: true`: it then borrows other teams'
unused guarantee (design §7, "borrowed capacity is on loan") and is the first to yield when an owner
reclaims. A non-preemptible job beyond its guarantee waits. Callers the tree does not name are outside
quotas: only `caller_limits` apply to them. Everything here is pure; the tracker calls `classify` and
keeps a `QuotaUse` under its lock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import ConfigDict, Field, Strict

Gpus = Annotated[int, Strict(), Field(ge=0)]
Pct = Annotated[float, Strict(), Field(ge=0, le=100)]
Seconds = Annotated[float, Strict(), Field(ge=0)]


@dataclass(frozen=True)
class CallerQuota:
    """One caller's share of its team's guarantee."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    guaranteed_gpus: Gpus | None = None
    """GPUs this caller's non-preemptible jobs may hold within its team's guarantee; null: the team's."""


@dataclass(frozen=True)
class TeamQuota:
    __pydantic_config__ = ConfigDict(extra="forbid")

    guaranteed_gpus: Gpus = 0
    """GPUs the team's jobs hold in quota: never preempted, lent to other teams while unused."""
    max_gpus: Gpus | None = None
    """Cap on what the team holds, guaranteed and borrowed together; null: no cap beyond what is lendable."""
    callers: Mapping[str, CallerQuota] = field(default_factory=dict)


@dataclass(frozen=True)
class OrgQuota:
    __pydantic_config__ = ConfigDict(extra="forbid")

    guaranteed_gpus: Gpus | None = None
    """GPUs the org's teams hold in quota together; null: the sum of its teams'."""
    teams: Mapping[str, TeamQuota] = field(default_factory=dict)


@dataclass(frozen=True)
class PreemptionBudget:
    """R6's tiers: share of running GPU-seconds preempted per hour."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    warn_pct: Pct = 10.0
    """At or above this rate preemption goes on, with a `preemption.warn` event."""
    limit_pct: Pct = 25.0
    """At or above this rate only guaranteed (non-preemptible, in quota) jobs preempt; others queue."""


@dataclass(frozen=True)
class QuotasSpec:
    """The catalog's `quotas:` section."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    orgs: Mapping[str, OrgQuota] = field(default_factory=dict)
    preemption_grace_s: Seconds = 15.0
    """SIGTERM -> SIGKILL deadline of a preempted job (design §5.4: checkpoint size / storage bandwidth × 3)."""
    min_runtime_before_preempt: Seconds = 600.0
    """A job is not preempted within this many seconds of its start (design §7, thrash guard)."""
    preemption_budget: PreemptionBudget = PreemptionBudget()


class QuotaProblem(ValueError):
    """A rule across the tree that a field type cannot say; the catalog wraps it in a CatalogError."""


def check(spec: QuotasSpec) -> None:
    """Each caller in one team; guarantees of children within their parent's; warn at or below the limit."""
    seen: dict[str, str] = {}
    for org_name, org in spec.orgs.items():
        teams_total = sum(t.guaranteed_gpus for t in org.teams.values())
        if org.guaranteed_gpus is not None and teams_total > org.guaranteed_gpus:
            raise QuotaProblem(f"orgs.{org_name}: its teams guarantee {teams_total} GPUs, more than the org's "
                               f"guaranteed_gpus {org.guaranteed_gpus}")
        for team_name, team in org.teams.items():
            where = f"orgs.{org_name}.teams.{team_name}"
            if team.max_gpus is not None and team.max_gpus < team.guaranteed_gpus:
                raise QuotaProblem(f"{where}: max_gpus {team.max_gpus} is below guaranteed_gpus {team.guaranteed_gpus}")
            shares = sum(c.guaranteed_gpus or 0 for c in team.callers.values())
            if shares > team.guaranteed_gpus:
                raise QuotaProblem(f"{where}: its callers guarantee {shares} GPUs, more than the team's "
                                   f"guaranteed_gpus {team.guaranteed_gpus}")
            for caller in team.callers:
                if caller in seen:
                    raise QuotaProblem(f"{where}.callers.{caller}: caller {caller!r} is already in team {seen[caller]!r}")
                seen[caller] = f"{org_name}/{team_name}"
    b = spec.preemption_budget
    if b.warn_pct > b.limit_pct:
        raise QuotaProblem(f"preemption_budget: warn_pct {b.warn_pct:g} is above limit_pct {b.limit_pct:g}")


class Kind(enum.StrEnum):
    OUTSIDE = "outside"
    """The caller is in no team: quotas do not apply."""
    IN_QUOTA = "in_quota"
    BORROWED = "borrowed"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: Kind
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Path:
    """A caller's place in the tree: the node keys from org to caller, with each node's guarantee."""

    org: str
    team: str
    caller: str
    limits: tuple[tuple[str, int], ...]
    """(node key, guaranteed GPUs) for every node on the path that guarantees a number."""
    max_gpus: int | None


class QuotaUse:
    """GPUs held in quota per node key, and borrowed per team; the tracker changes it under its lock."""

    __slots__ = ("in_quota", "borrowed", "reclaiming")

    def __init__(self) -> None:
        self.in_quota: dict[str, int] = {}
        self.borrowed: dict[str, int] = {}
        self.reclaiming: dict[str, int] = {}
        """team key -> GPUs of its queued in-quota jobs that preempted borrowers: no longer lendable."""

    def add(self, path: Path, gpus: int, borrowed: bool) -> None:
        if borrowed:
            self.borrowed[path.team] = self.borrowed.get(path.team, 0) + gpus
            return
        for key, _ in path.limits:  # the team's key is always on the path
            self.in_quota[key] = self.in_quota.get(key, 0) + gpus

    def remove(self, path: Path, gpus: int, borrowed: bool) -> None:
        self.add(path, -gpus, borrowed)


class QuotaTree:
    """The tree, indexed by caller; `classify` is the one decision."""

    def __init__(self, spec: QuotasSpec) -> None:
        self.spec = spec
        self.paths: dict[str, Path] = {}
        self.guarantees: dict[str, int] = {}
        """team key -> guaranteed GPUs (what it lends while unused)."""
        for org_name, org in spec.orgs.items():
            org_key = f"org:{org_name}"
            for team_name, team in org.teams.items():
                team_key = f"team:{org_name}/{team_name}"
                self.guarantees[team_key] = team.guaranteed_gpus
                for caller, share in team.callers.items():
                    limits = [(team_key, team.guaranteed_gpus)]
                    if org.guaranteed_gpus is not None:
                        limits.insert(0, (org_key, org.guaranteed_gpus))
                    if share.guaranteed_gpus is not None:
                        limits.append((f"caller:{caller}", share.guaranteed_gpus))
                    self.paths[caller] = Path(org_name, team_key, caller, tuple(limits), team.max_gpus)

    def path(self, caller: str) -> Path | None:
        return self.paths.get(caller)

    def lendable(self, use: QuotaUse, team: str) -> int:
        """Unused guarantee of the other teams, less what is already borrowed from it."""
        unused = sum(max(0, g - use.in_quota.get(t, 0) - use.reclaiming.get(t, 0))
                     for t, g in self.guarantees.items() if t != team)
        borrowed_elsewhere = sum(n for t, n in use.borrowed.items() if t != team)
        return max(0, unused - borrowed_elsewhere - use.borrowed.get(team, 0))

    def never_fits(self, caller: str, gpus: int, preemptible: bool) -> str | None:
        """Why a job of `gpus` could never run under the tree even on an idle cluster; None when it could."""
        path = self.paths.get(caller)
        if path is None or gpus <= 0:
            return None
        key, limit = min(path.limits, key=lambda kl: kl[1])
        if path.max_gpus is not None and gpus > path.max_gpus:
            return f"{gpus} GPUs exceed {_name(path.team)}'s max_gpus {path.max_gpus}"
        if not preemptible and gpus > limit:
            return (f"{gpus} GPUs exceed {_name(key)}'s guarantee of {limit}; only a preemptible job may borrow "
                    "beyond it")
        lendable = sum(g for t, g in self.guarantees.items() if t != path.team)
        if gpus > limit + lendable:
            return f"{gpus} GPUs exceed {_name(key)}'s guarantee of {limit} plus every other team's ({lendable})"
        return None

    def classify(self, caller: str, gpus: int, preemptible: bool, use: QuotaUse) -> Verdict:
        """In quota, borrowed, refused (with why), or outside quotas."""
        path = self.paths.get(caller)
        if path is None or gpus <= 0:
            return Verdict(Kind.OUTSIDE)
        full = next(((key, limit) for key, limit in path.limits if use.in_quota.get(key, 0) + gpus > limit), None)
        held = use.in_quota.get(path.team, 0) + use.borrowed.get(path.team, 0)
        if path.max_gpus is not None and held + gpus > path.max_gpus:
            return Verdict(Kind.REFUSED, f"team quota: {_name(path.team)} holds {held} GPUs, max_gpus {path.max_gpus}")
        if full is None:
            return Verdict(Kind.IN_QUOTA)
        key, limit = full
        if not preemptible:
            return Verdict(Kind.REFUSED, f"team quota: {_name(key)} holds {use.in_quota.get(key, 0)} of its {limit} "
                                         f"guaranteed GPUs; only a preemptible job may borrow beyond it")
        lendable = self.lendable(use, path.team)
        if gpus > lendable:
            return Verdict(Kind.REFUSED, f"team quota: {_name(key)} is at its guarantee and other teams lend only "
                                         f"{lendable} unused GPUs")
        return Verdict(Kind.BORROWED)


def _name(key: str) -> str:
    kind, _, name = key.partition(":")
    return f"{kind} {name!r}"
