"""B13 `bench failover`: three brokers on one store, the leader SIGKILLed or SIGSTOPped under load, and what
each fail-over costs (docs/ha.md).

Per database (MariaDB, PostgreSQL; a scratch database each, dropped after): three `firepool serve` on it and
on one state dir, the local backend, a cpu pool whose pods bind a host file. W-Agent (3 callers, tagged
sessions) and W-RL (a trainer's batches) run through the SDK with the three URLs in one list. At random
moments the leader is SIGKILLed (`--kills`): the time from its death to a standby's /healthz saying
`leader` (polled every 5 ms) is the fail-over (of which the election: until the standby's log says it took
the store's lock and the next term; the rest is its recovery before it dispatches); the killed broker is restarted (a standby now). Or it is
SIGSTOPped (`--pauses`) until a standby has taken over (longer than the lease) and a while more, then
SIGCONTed: it must learn it was deposed and exit (status 75, log line `deposed:`) without anything it had in
flight landing; its refused writes and agent commands are counted from the logs (`deposed:` in the
brokers', `stale term refused` in the agents'). At the end: jobs lost (acknowledged, never terminal),
attempts executed twice (each job appends `S <job id>` to the bound file), holds restored, and whether two
brokers ever led the same term at once (sampled every 20 ms).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import Row, at_most, percentile, report
from bench.failover_cluster import SERVERS, Brokers, ScratchDatabase
from bench.failover_load import AGENTS, TRAINER, Load, pods
from bench.recovery import kept

DEPOSED_EXIT = 75
DEPOSED_LINE = "deposed:"
STALE_LINE = "stale term refused"


def serve_lease_s() -> float:
    """`firepool serve --lease-s`'s default: how long a silent leader keeps the store's lock."""
    import argparse as ap

    from broker.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, ap._SubParsersAction))
    action = sub.choices["serve"]._option_string_actions.get("--lease-s")
    if action is None:
        raise SystemExit("bench failover: this `firepool serve` has no --lease-s (no leader election)")
    return float(action.default)


class LeaderWatch:
    """Samples every broker's role and term in the background: two that claim the same term at once would
    be a split brain; an old term still claimed beside a newer one is a deposed leader not yet gone."""

    def __init__(self, brokers: Brokers, every_s: float = 0.02) -> None:
        self.brokers, self.every_s = brokers, every_s
        self.samples = 0
        self.same_term: list[dict[int, tuple[str, int]]] = []
        self.stale_beside_new = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader watch", daemon=True)

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            roles = self.brokers.roles()
            terms = [term for role, term in roles.values() if role == "leader"]
            self.samples += 1
            if len(terms) != len(set(terms)):
                self.same_term.append(roles)
            elif len(terms) > 1:
                self.stale_beside_new += 1


def run_database(kind: str, kills: int, pauses: int, gap: tuple[float, float], lease_s: float,
                 rng: random.Random, drain_s: float = 90.0, server: str | None = None,
                 keep: bool = False) -> dict[str, Any]:
    """One database: three brokers, the kills and pauses in random order under load, then the audit."""
    root = Path(tempfile.mkdtemp(prefix="fp-failover-"))
    events = ["kill"] * kills + ["pause"] * pauses
    rng.shuffle(events)
    out: dict[str, Any] = {"database": kind, "kills": 0, "pauses": 0, "failover_s": [], "takeover_after_pause_s": [],
                           "paused_s": [], "deposed_exits": [], "pods": {"held": [0, 0], "idle": [0, 0],
                                                                         "busy": [0, 0]}}
    agent_refusals: set[str] = set()
    kills_at: dict[int, float] = {}
    """The term a kill handed over -> when the kill was sent (epoch seconds)."""
    with ScratchDatabase(kind, server) as db:
        brokers = Brokers(root, db.url, callers=(*AGENTS, TRAINER), lease_s=lease_s)
        load = Load(brokers.urls, brokers.tokens)
        try:
            brokers.start()
            brokers.wait_leader()
            with LeaderWatch(brokers) as watch:
                load.start()
                for event in events:
                    time.sleep(rng.uniform(*gap))
                    leader, term, _ = brokers.wait_leader()
                    before = pods(brokers.urls, brokers.tokens)
                    others = [i for i in range(brokers.count) if i != leader]
                    if event == "kill":
                        killed_at, killed_wall = time.monotonic(), time.time()
                        brokers.kill(leader)
                        _, new_term, _ = brokers.wait_leader(others, after_term=term)
                        out["failover_s"].append(time.monotonic() - killed_at)
                        kills_at[new_term] = killed_wall
                        out["kills"] += 1
                    else:
                        paused_at = time.monotonic()
                        brokers.pause(leader)
                        brokers.wait_leader(others, after_term=term, timeout_s=lease_s * 4 + 30)
                        out["takeover_after_pause_s"].append(time.monotonic() - paused_at)
                        time.sleep(rng.uniform(0.5, 1.5))  # the new leader works while the old one sleeps
                        out["paused_s"].append(time.monotonic() - paused_at)
                        brokers.resume(leader)
                        code = brokers.wait_exit(leader, 30.0)
                        out["deposed_exits"].append(code)
                        if code is None:  # it did not step down: end it, the audit shows what it did
                            brokers.kill(leader, "paused")
                        agent_refusals |= set(brokers.agent_log_lines(STALE_LINE))
                        out["pauses"] += 1
                    brokers.spawn(leader)
                    brokers.wait_up(leader)
                    for key, (k, seen) in kept(before, pods(brokers.urls, brokers.tokens)).items():
                        out["pods"][key][0] += k
                        out["pods"][key][1] += seen
                time.sleep(1.0)
                load.finish()
                states = load.audit(drain_s)
            agent_refusals |= set(brokers.agent_log_lines(STALE_LINE))
            executions = Counter(brokers.executions())
            taken = brokers.terms_taken()
            out["elected_s"] = [taken[term] - at for term, at in kills_at.items() if term in taken]
            out.update(
                jobs=len(states), states=dict(Counter(states.values())),
                lost=sorted(j for j, s in states.items() if s == "LOST"),
                executed_twice=sorted(j for j, n in executions.items() if n > 1),
                succeeded_unexecuted=sorted(j for j, s in states.items() if s == "SUCCEEDED" and j not in executions),
                broker_refusals=len(brokers.log_lines(DEPOSED_LINE)), agent_refusals=len(agent_refusals),
                same_term_leaders=watch.same_term[:5], same_term_samples=len(watch.same_term),
                stale_beside_new_samples=watch.stale_beside_new, watch_samples=watch.samples,
                caller_refusals=load.refusals[:5])
        finally:
            load.stop.set()
            brokers.stop()
            if keep or set(out.get("states", {})) - {"SUCCEEDED"} or out.get("executed_twice") or \
                    out.get("succeeded_unexecuted"):
                out["kept_dir"] = str(root)  # the brokers' and agents' logs, to see what went wrong
            else:
                shutil.rmtree(root, ignore_errors=True)
    return out


def rows(runs: list[dict[str, Any]], kills: int, pauses: int) -> list[Row]:
    out: list[Row] = []
    for r in runs:
        db = r["database"]
        failover = percentile(r["failover_s"], 50) if r["failover_s"] else None
        held = r["pods"]["held"]
        exits = r["deposed_exits"]
        out += [
            Row("B13", f"{db}: leader SIGKILLs under load", r["kills"], "", "-", f">= {kills}", r["kills"] >= kills),
            Row("B13", f"{db}: leader SIGSTOPs longer than the lease", r["pauses"], "", "-", f">= {pauses}",
                r["pauses"] >= pauses),
            Row("B13", f"{db}: jobs acknowledged", r["jobs"], "", "-"),
            Row("B13", f"{db}: lost jobs", len(r["lost"]), "", "0", "0", not r["lost"]),
            Row("B13", f"{db}: jobs that did not succeed", sum(n for s, n in r["states"].items() if s != "SUCCEEDED")
                - len(r["lost"]), "", "-", "0", not set(r["states"]) - {"SUCCEEDED", "LOST"}),
            Row("B13", f"{db}: attempts executed twice (bound log)", len(r["executed_twice"]), "", "0", "0",
                not r["executed_twice"]),
            Row("B13", f"{db}: succeeded without executing", len(r["succeeded_unexecuted"]), "", "0", "0",
                not r["succeeded_unexecuted"]),
            Row("B13", f"{db}: owner holds restored ({held[0]}/{held[1]})", held[0], "", "all", "all",
                held[0] == held[1]),
            Row("B13", f"{db}: leader death -> standby leads, p50", failover, "s", "-", "<= 0.1 s",
                at_most(failover, 0.1)),
            Row("B13", f"{db}:   of which death -> store lock and term taken, p50",
                percentile(r["elected_s"], 50) if r["elected_s"] else None, "s", "-"),
            Row("B13", f"{db}: leader death -> standby leads, p90",
                percentile(r["failover_s"], 90) if r["failover_s"] else None, "s", "-"),
            Row("B13", f"{db}: pause -> standby leads, p50",
                percentile(r["takeover_after_pause_s"], 50) if r["takeover_after_pause_s"] else None, "s", "-"),
            Row("B13", f"{db}: paused leaders that exited {DEPOSED_EXIT} on waking ({exits.count(DEPOSED_EXIT)}/"
                f"{len(exits)})", exits.count(DEPOSED_EXIT), "", "-", "all", exits.count(DEPOSED_EXIT) == len(exits)),
            Row("B13", f"{db}: old-term writes refused (broker `{DEPOSED_LINE}`)", r["broker_refusals"], "", "-"),
            Row("B13", f"{db}: old-term agent commands refused", r["agent_refusals"], "", "-"),
            Row("B13", f"{db}: samples with two leaders of one term", r["same_term_samples"], "", "0", "0",
                r["same_term_samples"] == 0),
        ]
    return out


def main(argv: list[str], *, json_out: bool = False) -> int:
    ap = argparse.ArgumentParser(prog="firepool bench failover", description=__doc__)
    ap.add_argument("--kills", type=int, default=30, help="leader SIGKILLs per database")
    ap.add_argument("--pauses", type=int, default=10, help="leader SIGSTOPs per database, each longer than the lease")
    ap.add_argument("--db", choices=[*SERVERS, "both"], default="both", help="the store's server")
    ap.add_argument("--gap", type=float, nargs=2, default=(1.0, 3.0), metavar=("MIN", "MAX"),
                    help="seconds of load before each kill or pause, drawn uniformly")
    ap.add_argument("--lease-s", type=float, default=None, help="the brokers' --lease-s (default: serve's)")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--keep", action="store_true", help="keep the brokers' dir with their logs (kept anyway when a "
                    "job did not succeed or ran twice)")
    args = ap.parse_args(argv)
    if args.kills < 0 or args.pauses < 0 or args.kills + args.pauses == 0:
        ap.error("--kills and --pauses must not be negative, and not both 0")
    lease_s = args.lease_s if args.lease_s is not None else serve_lease_s()
    rng = random.Random(args.seed)
    kinds = list(SERVERS) if args.db == "both" else [args.db]
    runs = [run_database(kind, args.kills, args.pauses, (args.gap[0], args.gap[1]), lease_s, rng, keep=args.keep)
            for kind in kinds]
    return report("failover", rows(runs, args.kills, args.pauses), json_out=json_out,
                  extra={"lease_s": lease_s, "runs": runs})
