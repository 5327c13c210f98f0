"""What each dashboard page shows, computed from the control plane's own views and the job store.

Nothing here decides anything: pools come from `ControlPlane.pools_view`, pods from `pods_view`, jobs
from the store's paged `list_jobs` (newest first, by id) and `job_view`. A caller sees its own jobs,
pods and sessions only; an admin sees every caller's.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from broker.api.auth import Identity
from broker.api.schemas import job_view
from broker.control import ControlPlane
from broker.jobs import Job, JobState
from broker.stats import LATENCY_BUCKETS
from broker.ui.live import job_row, scope, shown_command

PAGE = 50
PODS_PAGE = 200
PATH_SCAN = 2000
"""Most jobs read to fill one page filtered by acquisition path (the path is not a column)."""
LATENCY_JOBS = 2000
"""The Latency page summarises the caller's (or, for an admin, everyone's) newest jobs."""
QUANTILES = (50, 90, 99)
"""Start-latency percentiles the Latency page gives per acquisition path."""
PATHS = ("warm", "recycled", "standby", "new", "custom_image")
PHASES = (("accept", "submitted_at", "queued_at"), ("dispatch", "queued_at", "committed_at"),
          ("hand-off", "committed_at", "handed_off_at"), ("first instruction", "handed_off_at", "first_instruction_at"),
          ("run", "first_instruction_at", "finished_at"))


@dataclass(frozen=True)
class JobFilter:
    state: JobState | None = None
    caller: str | None = None
    pool: str | None = None
    tag: str | None = None
    path: str | None = None

    def query(self) -> dict[str, str]:
        out = {"state": str(self.state) if self.state else "", "caller": self.caller or "", "pool": self.pool or "",
               "tag": self.tag or "", "path": self.path or ""}
        return {k: v for k, v in out.items() if v}


def pools(cp: ControlPlane, who: Identity) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = scope({"pools": cp.pools_view()}, who)["pools"]
    return out


def held_pods(cp: ControlPlane, who: Identity) -> dict[str, list[dict[str, Any]]]:
    """pool -> its held pods (owner, tag, hold deadline): every owner's for an admin, the caller's own else."""
    now = cp.clock.now()
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in cp.tracker.snapshot():
        if pod.held(now) and (who.admin or pod.caller == who.caller):
            out.setdefault(pod.pool, []).append({"name": pod.name, "caller": pod.caller,
                                                 "tag": pod.key[2] if pod.key else "", "hold_until": pod.hold_until})
    for pods in out.values():
        pods.sort(key=lambda p: p["name"])
    return out


async def jobs_page(cp: ControlPlane, who: Identity, f: JobFilter, before: str | None) -> tuple[list[dict[str, Any]],
                                                                                            str | None]:
    """One page of job rows, newest first, and the cursor of the next page (None at the end)."""
    caller = f.caller if who.admin else who.caller
    states = [f.state] if f.state else None
    rows: list[dict[str, Any]] = []
    scanned, cursor = 0, before
    batch = PAGE if f.path is None else 500
    while True:
        found = await cp.book.io(partial(cp.store.list_jobs, caller=caller, states=states, limit=batch,
                                         before=cursor, pool=f.pool, lease_tag=f.tag))
        for j in found:
            cursor = j.id
            row = job_row(j, cp.waiting_reason(j.id))
            if f.path is None or row["path"] == f.path:
                rows.append(row)
                if len(rows) == PAGE:
                    return rows, cursor
        scanned += len(found)
        if len(found) < batch:
            return rows, None
        if scanned >= PATH_SCAN:  # a rare path: show what this scan found and let the reader page on
            return rows, cursor


def job_detail(cp: ControlPlane, j: Job) -> dict[str, Any]:
    view = job_view(j, cp.waiting_reason(j.id))
    timings = view.get("timings", {})
    start = timings.get("submitted_at")
    end = max(timings.values()) if timings else None
    phases = []
    for name, a, b in PHASES:
        if a in timings and b in timings and start is not None and end is not None:
            span = max(end - start, 1e-9)
            phases.append({"name": name, "seconds": timings[b] - timings[a],
                           "left": 100 * (timings[a] - start) / span,
                           "width": max(0.5, 100 * (timings[b] - timings[a]) / span)})
    view["phases"] = phases
    return view


def pods_page(cp: ControlPlane, who: Identity, pool: str | None, state: str | None,
              page: int) -> tuple[list[dict[str, Any]], int]:
    """One page of pods with their last reset proofs; (rows, total)."""
    views: list[dict[str, Any]] = scope({"pods": cp.pods_view(pool)}, who)["pods"]
    if state:
        views = [v for v in views if v["state"] == state]
    start = page * PODS_PAGE
    rows = views[start:start + PODS_PAGE]
    proofs = cp.stats.reset_proofs
    for row in rows:
        row["resets"] = list(proofs.get(str(row["name"]), []))
        job = cp.book.live.get(str(row["job"])) if row.get("job") else None
        row["command"] = shown_command(job.spec.command) if job is not None else None
    return rows, len(views)


def sessions(cp: ControlPlane, who: Identity) -> list[dict[str, Any]]:
    """Live lease tags (caller, queue, tag) -> their pods, last use and hold deadline."""
    now = cp.clock.now()
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for pod in cp.tracker.snapshot():
        if pod.key is None or not pod.key[2] or (not who.admin and pod.key[0] != who.caller):
            continue
        g = groups.setdefault(pod.key, {"caller": pod.key[0], "queue": pod.key[1], "tag": pod.key[2], "pods": [],
                                        "last_use": 0.0, "hold_until": 0.0, "jobs": []})
        g["pods"].append({"name": pod.name, "state": pod.state.value, "pool": pod.pool, "held": pod.held(now)})
        g["last_use"] = max(g["last_use"], pod.idle_since)
        g["hold_until"] = max(g["hold_until"], pod.hold_until)
        if pod.job:
            job = cp.book.live.get(pod.job)
            g["jobs"].append({"id": pod.job, "command": shown_command(job.spec.command) if job else None})
    for g in groups.values():
        g["workspace_bytes"] = None
    return sorted(groups.values(), key=lambda g: -g["last_use"])


def workspace_sizes(cp: ControlPlane, groups: list[dict[str, Any]]) -> None:
    """Fill each session's workspace size where the backend measures one (blocking: run on a thread)."""
    size = getattr(cp.backend, "workspace_bytes", None)
    if size is None:
        return
    for g in groups:
        sizes = [size(p["name"]) for p in g["pods"]]
        known = [n for n in sizes if n is not None]
        g["workspace_bytes"] = sum(known) if known else None


async def latency(cp: ControlPlane, who: Identity) -> dict[str, Any]:
    """Start latency (submit -> first instruction) per acquisition path, and warm share over time."""
    caller = None if who.admin else who.caller
    found = await cp.book.io(lambda: cp.store.list_jobs(caller=caller, limit=LATENCY_JOBS))
    bounds = [*map(str, LATENCY_BUCKETS), "+Inf"]
    hist: dict[str, list[int]] = {p: [0] * len(bounds) for p in PATHS}
    samples: dict[str, list[float]] = {}
    points: list[tuple[float, bool]] = []
    for j in found:
        t = j.timings
        if "first_instruction_at" not in t or "submitted_at" not in t or not j.acquisition:
            continue
        path = str(j.acquisition[0].path)
        if path not in hist:
            hist[path] = [0] * len(bounds)
        seconds = t["first_instruction_at"] - t["submitted_at"]
        hist[path][bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        samples.setdefault(path, []).append(seconds)
        points.append((t["submitted_at"], path == "warm"))
    share: dict[str, list[float]] = {"at": [], "warm": [], "n": []}
    if points:
        points.sort()
        lo, hi = points[0][0], points[-1][0]
        n_buckets = 12
        width = max((hi - lo) / n_buckets, 1e-9)
        counts = [[0, 0] for _ in range(n_buckets)]
        for at, warm in points:
            b = min(n_buckets - 1, int((at - lo) / width))
            counts[b][0] += 1
            counts[b][1] += warm
        for i, (n, w) in enumerate(counts):
            if n:
                share["at"].append(round(lo + (i + 0.5) * width, 1))
                share["warm"].append(round(100 * w / n, 1))
                share["n"].append(n)
    order = {p: i for i, p in enumerate(PATHS)}
    quantiles = [{"path": p, "n": len(xs), **{f"p{q}": percentile(xs, q) for q in QUANTILES}}
                 for p, xs in sorted(samples.items(), key=lambda kv: (order.get(kv[0], len(PATHS)), kv[0]))]
    return {"bounds": bounds, "hist": {p: h for p, h in hist.items() if any(h)}, "share": share,
            "jobs": len(points), "read": len(found), "quantiles": quantiles}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (a value that occurred: p99 of 10 jobs is the slowest)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
