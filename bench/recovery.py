"""B13 `bench recovery`: SIGKILL the broker under load, restart it on the same store and state dir, and
count what the crashes cost (paper App. A.1, C.3, Table 7).

Repeats alternate W-Agent (3 callers, each a loop of short jobs in one session) and W-RL (a trainer
fanning out batches), each on a fresh MariaDB database (or SQLite) and state dir, with SIGKILLs at
random moments. Counted: lost jobs (acknowledged, never terminal), duplicated attempts (from the
agents' ledgers of started attempt ids: an id started twice, or two started attempts of a job that
allowed no retry), owner holds restored (held before the kill, still the owner's after the restart),
busy and idle pods kept, and the time from process start to dispatching and to the first claim.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from bench.common import Row, at_most, percentile, report
from bench.recovery_load import TERMINAL, CrashBroker, Load
from firepool_agent.ledger import read_ledger

MARIADB = "mysql+pymysql://root@127.0.0.1:3306"
BUSY = ("assigned", "running", "resetting")


def make_db(server: str, name: str, root: Path) -> str:
    """A fresh database for one repeat: `name` on the server, or a SQLite file when server is `sqlite`."""
    if server == "sqlite":
        return f"sqlite:///{root / 'jobs.db'}"
    engine = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    except sa.exc.DBAPIError as exc:
        raise SystemExit(f"bench recovery: cannot create a database on {server} ({exc.orig}); start MariaDB "
                         "there, or pass --db with another server URL, or --db sqlite") from None
    finally:
        engine.dispose()
    return f"{server}/{name}"


def drop_db(server: str, name: str) -> None:
    if server == "sqlite":
        return
    engine = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    engine.dispose()


def kept(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per class of pod seen just before a kill ([kept, seen]): held idle pods must still be their
    owner's (held, or busy with the owner's job), busy and unheld idle pods must still exist."""
    now_by_name = {p["name"]: p for p in after}
    out: dict[str, list[int]] = {"held": [0, 0], "idle": [0, 0], "busy": [0, 0]}
    for pod in before:
        kind = "busy" if pod["state"] in BUSY else "held" if pod.get("held") else "idle" \
            if pod["state"] == "idle" else ""
        if not kind:
            continue
        out[kind][1] += 1
        now = now_by_name.get(pod["name"])
        if now is None:
            continue
        if kind == "held" and (now.get("caller") != pod.get("caller") or
                               (now["state"] == "idle" and not now.get("held"))):
            continue
        out[kind][0] += 1
    return out


def audit(broker: CrashBroker, load: Load, drain_s: float) -> dict[str, Any]:
    """Every acknowledged job's end, and every attempt the agents started."""
    states: Counter[str] = Counter()
    lost: list[str] = []
    claims: list[float] = []
    clients = {c: broker.client(c) for c in broker.tokens}
    try:
        for job_id, caller in sorted(load.acknowledged.items()):
            view = None
            state = load.wait(clients[caller], job_id, limit_s=drain_s)
            try:
                r = clients[caller].get(f"/v1/jobs/{job_id}")
                view = r.json() if r.status_code == 200 else None
            except httpx.HTTPError:
                pass
            if state not in TERMINAL or view is None:
                lost.append(job_id)
                continue
            states[f"{view['state']}" + (f" {view.get('error_class')}" if view["state"] != "SUCCEEDED" else "")] += 1
            if "claimed_at" in view.get("timings", {}):
                claims.append(float(view["timings"]["claimed_at"]))
    finally:
        for client in clients.values():
            client.close()
    records = list(read_ledger((broker.state_dir / "ledger").glob("*.jsonl")))
    started = Counter(str(r["attempt"]) for r in records)
    by_job: dict[str, set[str]] = defaultdict(set)
    for attempt in started:
        by_job[attempt.rsplit(":", 1)[0]].add(attempt)
    twice = sorted(a for a, n in started.items() if n > 1)
    rerun = sorted(j for j, ids in by_job.items() if len(ids) > 1)
    return {"jobs": len(load.acknowledged), "states": dict(states), "lost": lost, "attempts_started": len(started),
            "started_twice": twice, "jobs_run_twice": rerun, "claims": claims, "refusals": load.refusals[:5]}


def first_claims(broker: CrashBroker, claims: list[float]) -> list[float]:
    """Per restart: its first claim, seconds after its process started."""
    out = []
    for life in broker.lives[1:]:
        if life.dispatching_at is None or life.dispatch_after_process_s is None:
            continue
        born = life.dispatching_at - life.dispatch_after_process_s
        window = [c for c in claims if c >= life.dispatching_at and (life.killed_at is None or c < life.killed_at)]
        if window:
            out.append(min(window) - born)
    return out


def run_repeat(n: int, workload: str, kills: int, gap: tuple[float, float], server: str, rng: random.Random,
               settle_s: float = 2.0, drain_s: float = 120.0, early: float = 0.0) -> dict[str, Any]:
    """One repeat: a fresh broker and database, `kills` SIGKILLs under load, then the audit. With chance
    `early`, a kill is followed by another while the restarted broker is still starting or recovering."""
    root = Path(tempfile.mkdtemp(prefix="fp-b13-"))
    db_name = f"firepool_bench_recovery_{os.getpid()}_{n}"
    callers = ("agent-1", "agent-2", "agent-3") if workload == "agent" else ("trainer",)
    broker = CrashBroker(root, make_db(server, db_name, root), callers)
    load = Load()
    pods: dict[str, list[int]] = {"held": [0, 0], "idle": [0, 0], "busy": [0, 0]}
    during_start = 0
    try:
        broker.start()
        load.start(broker, workload, callers, batch=6)
        made = 0
        while made < kills:
            time.sleep(rng.uniform(*gap))
            before = broker.pods()
            broker.kill()
            made += 1
            while made < kills and rng.random() < early:  # the next kill lands while the restart recovers
                startup = next((x.healthy_at - x.spawned_at for x in reversed(broker.lives) if x.healthy_at), 2.0)
                broker.spawn()
                time.sleep(rng.uniform(0.0, startup))
                broker.kill()
                made += 1
                during_start += 1
            broker.start()
            for kind, (k, seen) in kept(before, broker.pods()).items():
                pods[kind][0] += k
                pods[kind][1] += seen
        time.sleep(settle_s)
        load.finish()
        outcome = audit(broker, load, drain_s)
        broker.read_ready_lines()
    finally:
        load.stop.set()
        broker.stop()
        drop_db(server, db_name)
        shutil.rmtree(root, ignore_errors=True)
    lives = broker.lives
    return {"repeat": n, "workload": workload, "kills": kills, "kills_during_start": during_start, "pods": pods,
            **outcome,
            "first_claim_s": first_claims(broker, outcome.pop("claims")),
            "dispatch_after_process_s": [x.dispatch_after_process_s for x in lives[1:]
                                         if x.dispatch_after_process_s is not None],
            "dispatch_after_control_s": [x.dispatch_after_control_s for x in lives[1:]
                                         if x.dispatch_after_control_s is not None],
            "startup_s": [x.dispatch_after_process_s - x.dispatch_after_control_s for x in lives[1:]
                          if x.dispatch_after_process_s is not None and x.dispatch_after_control_s is not None],
            "api_after_kill_s": [b.healthy_at - a.killed_at for a, b in zip(lives, lives[1:], strict=False)
                                 if a.killed_at is not None and b.healthy_at is not None]}


def run(kills: int, per_repeat: int, gap: tuple[float, float], server: str, seed: int,
        early: float = 0.0) -> dict[str, Any]:
    """Repeats alternating W-Agent and W-RL until `kills` kills were made; the pooled outcome."""
    rng = random.Random(seed)
    repeats: list[dict[str, Any]] = []
    done = 0
    while done < kills:
        k = min(per_repeat, kills - done)
        repeats.append(run_repeat(len(repeats), ("agent", "rl")[len(repeats) % 2], k, gap, server, rng, early=early))
        done += k
    pooled: dict[str, Any] = {"kills": done, "repeats": repeats}
    for key in ("lost", "started_twice", "jobs_run_twice", "first_claim_s", "dispatch_after_process_s",
                "dispatch_after_control_s", "startup_s", "api_after_kill_s"):
        pooled[key] = [x for r in repeats for x in r[key]]
    pooled["jobs"] = sum(r["jobs"] for r in repeats)
    pooled["kills_during_start"] = sum(r["kills_during_start"] for r in repeats)
    pooled["states"] = dict(sum((Counter(r["states"]) for r in repeats), Counter()))
    pooled["pods"] = {kind: [sum(r["pods"][kind][i] for r in repeats) for i in (0, 1)] for kind in ("held", "idle",
                                                                                                     "busy")}
    return pooled


def rows(out: dict[str, Any]) -> list[Row]:
    def p(key: str, q: float) -> float | None:
        return percentile(out[key], q) if out[key] else None

    held, idle, busy = (out["pods"][k] for k in ("held", "idle", "busy"))
    dispatch = p("dispatch_after_process_s", 50)
    return [
        Row("B13", "broker SIGKILLs under load", out["kills"], "", "30", ">= 30", out["kills"] >= 30),
        Row("B13", "  of which while the restarted broker was starting", out["kills_during_start"], "", "-"),
        Row("B13", "jobs acknowledged", out["jobs"], "", "-"),
        Row("B13", "lost jobs", len(out["lost"]), "", "0", "0", not out["lost"]),
        Row("B13", "attempts executed twice (ledger)", len(out["started_twice"]) + len(out["jobs_run_twice"]), "",
            "0", "0", not out["started_twice"] and not out["jobs_run_twice"]),
        Row("B13", f"owner holds restored ({held[0]}/{held[1]})", held[0], "", "90/90", "all", held[0] == held[1]),
        Row("B13", f"unheld idle pods kept ({idle[0]}/{idle[1]})", idle[0], "", "92/92", "all", idle[0] == idle[1]),
        Row("B13", f"busy pods kept ({busy[0]}/{busy[1]})", busy[0], "", "27/27", "all", busy[0] == busy[1]),
        Row("B13", "process start -> dispatching, p50", dispatch, "s", "0.045", "<= 0.1 s", at_most(dispatch, 0.1)),
        Row("B13", "process start -> dispatching, p90", p("dispatch_after_process_s", 90), "s", "0.068"),
        Row("B13", "  of which interpreter, imports, DB connect, p50", p("startup_s", 50), "s", "-"),
        Row("B13", "control-plane start -> dispatching (recovery), p50", p("dispatch_after_control_s", 50), "s",
            "-", "<= 0.1 s", at_most(p("dispatch_after_control_s", 50), 0.1)),
        Row("B13", "process start -> first claim, p50", p("first_claim_s", 50), "s", "3.0"),
        Row("B13", "kill -> API answers, p50", p("api_after_kill_s", 50), "s", "20 (k8s)"),
    ]


def main(argv: list[str], *, json_out: bool = False) -> int:
    ap = argparse.ArgumentParser(prog="firepool bench recovery", description=__doc__)
    ap.add_argument("--kills", type=int, default=30, help="SIGKILLs in all (paper: 30 over 10 repeats)")
    ap.add_argument("--kills-per-repeat", type=int, default=3)
    ap.add_argument("--gap", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN", "MAX"),
                    help="seconds of load before each kill, drawn uniformly")
    ap.add_argument("--early", type=float, default=0.2,
                    help="chance that a kill is followed by another while the restart is still recovering")
    ap.add_argument("--db", default=MARIADB, help="server URL without a database (a fresh one per repeat), "
                    "or `sqlite`")
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args(argv)
    if args.kills < 1 or args.kills_per_repeat < 1:
        ap.error("--kills and --kills-per-repeat must be at least 1")
    if not 0.0 <= args.early < 1.0:
        ap.error("--early must be in [0, 1)")
    out = run(args.kills, args.kills_per_repeat, (args.gap[0], args.gap[1]), args.db.rstrip("/"), args.seed,
              args.early)
    summary = {k: v for k, v in out.items() if k != "repeats"}
    summary["dispatch_after_process_median_s"] = statistics.median(out["dispatch_after_process_s"]) \
        if out["dispatch_after_process_s"] else None
    return report("recovery", rows(out), json_out=json_out, extra={"summary": summary, "repeats": out["repeats"]})
