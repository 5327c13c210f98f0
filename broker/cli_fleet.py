"""`firepool pools`, `pods`, `events` and `quarantine`: the fleet as a caller (or an operator) sees it."""

from __future__ import annotations

import argparse
import time

from broker.cli_commands import UsageError, client_of
from broker.cli_output import print_table, printed_json


def cmd_pools(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        pools = fp.pools()
    if printed_json(args.json, pools):
        return 0
    keys = ("name", "gpus", "min_count", "max_idle_count", "max_count", "idle_timeout", "physical", "idle",
            "held", "starting", "busy", "standby", "stale", "borrowed", "queued_demand")
    header = [k.upper() for k in keys] + ["PLACEABLE 1/2/4/8/NODE"]
    print_table([[p.get(k) for k in keys] + [placeable_cell(p.get("largest_placeable"))] for p in pools], header,
                right=header[1:])
    for p in pools:  # R2: a gang that cannot fill says so (docs/quotas.md)
        for a in p.get("capacity_alerts") or ():
            print(f"capacity alert: pool {p['name']}: gang {a['job']} holds {a['held']} of {a['pods']} pods "
                  f"after {a['waiting_s']:.0f} s")
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        events = fp.events(since=args.since, limit=args.limit)
    if printed_json(args.json, events):
        return 0
    rows = [(e["id"], time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e["at"])), e["kind"], e["subject"],
             e.get("caller") or "", "" if e.get("cost_gpu_s") is None else f"{e['cost_gpu_s']:.0f}", e["why"])
            for e in events]
    print_table(rows, ("ID", "AT (UTC)", "KIND", "SUBJECT", "CALLER", "GPU-S", "WHY"), right=("ID", "GPU-S"))
    return 0


def placeable_cell(placeable: dict[str, int] | None) -> str:
    """`largest_placeable` as one cell: 1/2/4/8-GPU allocations and whole nodes placeable now; - without nodes."""
    if not placeable:
        return "-"
    return "/".join(str(placeable.get(k, 0)) for k in ("1", "2", "4", "8", "node"))


def cmd_pods(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        pods = fp.pods(args.pool)
        if args.pool and not pods:
            names = [p["name"] for p in fp.pools()]
            if args.pool not in names:
                raise UsageError(f"--pool {args.pool}: no such pool (pools: {', '.join(names)})")
    if printed_json(args.json, pods):
        return 0
    now = time.time()
    rows = [(p["name"], p["pool"], p["state"] + (" (held)" if p.get("held") else "")
             + (" (standby)" if p.get("standby") else ""), p.get("caller"),
             p.get("lease_tag"), ",".join(p.get("gpus", [])), p.get("job"),
             f"{max(0.0, p['hold_until'] - now):.0f}s" if p.get("held") and p.get("hold_until") else "",
             "yes" if p.get("isolated") else "NO (--unisolated)", p.get("node") or "") for p in pods]
    print_table(rows, ("POD", "POOL", "STATE", "CALLER", "TAG", "GPUS", "JOB", "HOLD", "ISOLATED", "NODE"))
    return 0


def cmd_quarantine_list(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        records = fp.quarantine()
    if printed_json(args.json, records):
        return 0
    rows = [(r["key"], r["kind"], r["node"], r["failures"], "QUARANTINED" if r["quarantined"] else "counting",
             r["reason"]) for r in records]
    print_table(rows, ("KEY", "KIND", "NODE", "FAILURES", "STATE", "LAST FAILURE"), right=("FAILURES",))
    return 0


def cmd_quarantine_release(args: argparse.Namespace) -> int:
    with client_of(args) as fp:
        record = fp.release_quarantine(args.key)
    print(f"{record['key']}: released by {record['released_by']}; it is placed again")
    return 0
