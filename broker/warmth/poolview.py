"""What an operator sees of one pool: its knobs, its pods by what they can do, demand and the last plan.

`GET /v1/pools` returns these dicts and `/metrics` publishes the numeric fields as gauges, so the two
never disagree. Everything is derived from the scaler's counts; nothing here is stored.
"""

from __future__ import annotations

from typing import Any

from broker.pools import PoolSpec
from broker.warmth.budgets import Ledger, units_of
from broker.warmth.scaling import Counts, Plan

GAUGE_FIELDS = ("min_count", "max_idle_count", "max_count", "idle_timeout", "caller_hold_seconds", "physical",
                "eligible", "idle", "held", "starting", "busy", "assigned", "running", "resetting", "retiring",
                "standby", "stale", "borrowed", "single_use", "queued_demand", "holds_broken")
"""Numeric per-pool fields exported as `firepool_pool_<field>` gauges (an unbounded knob is +Inf)."""


def pool_view(spec: PoolSpec, c: Counts, queued_demand: int, plan: Plan | None, borrowed: int, holds_broken: int,
              ledger: Ledger) -> dict[str, Any]:
    """One pool as `GET /v1/pools` shows it."""
    return {
        "name": spec.name, "gpus": spec.gpus, "accelerator": spec.accelerator,
        "min_count": spec.min_count, "max_idle_count": spec.max_idle_count, "max_count": spec.max_count,
        "idle_timeout": spec.idle_timeout, "caller_hold_seconds": spec.caller_hold_seconds
        if spec.caller_hold_seconds is not None else spec.idle_timeout,
        "standbys_per_active": spec.standbys_per_active, "step": spec.step, "reuse_tag": spec.reuse_tag,
        "drain_budget": spec.drain_budget, "borrow": spec.borrow, "template": spec.template_hash,
        "physical": c.physical, "eligible": c.eligible, "starting": c.starting, "idle": c.idle,
        "held": c.held, "held_by": dict(c.held_by), "busy": c.busy,
        "assigned": c.assigned, "running": c.running, "resetting": c.resetting, "retiring": c.retiring,
        "standby": c.standby, "stale": c.stale, "borrowed": borrowed, "single_use": c.single_use,
        "queued_demand": queued_demand, "holds_broken": holds_broken,
        "budget": {"accelerator": spec.accelerator, "units_per_pod": units_of(spec),
                   "limit": ledger.limit(spec.accelerator), "used": ledger.used(spec.accelerator)},
        "last_plan": {"create": plan.create, "retire": len(plan.retire), "reason": plan.reason} if plan else None,
    }


def caller_pool_view(view: dict[str, Any], caller: str) -> dict[str, Any]:
    """A pool as a non-admin caller sees it: pool-wide totals stay, holds by owner shrink to the caller's own."""
    mine = view["held_by"].get(caller)
    out = {**view, "held_by": {caller: mine} if mine else {}}
    for key in ("reservations", "capacity_alerts"):  # another caller's gangs are not this caller's business
        if key in out:
            out[key] = [r for r in out[key] if r.get("caller") == caller]
    return out
