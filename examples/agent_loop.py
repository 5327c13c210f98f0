"""An agent loop through Firepool: 2 agents, each its own session (lease_tag), 3 iterations of 2-4 short
tool calls with think pauses in between (the paper's W-Agent shape, scaled down for a demo).

Every call after an agent's first should report the acquisition path `warm`: the agent's own pod,
kept for it between calls.

    python examples/agent_loop.py [--url URL] [--token TOKEN] [--pool cpu]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _failing import run_main  # noqa: E402
from _table import LoopProgress, print_table  # noqa: E402

from broker.client import Client, JobInfo  # noqa: E402

TOOL = ("import os, time, pathlib; time.sleep({body}); p = pathlib.Path('notes.txt');"
        " p.write_text(p.read_text() + 'x' if p.exists() else 'x');"
        " print('step', {step}, 'pid', os.getpid(), 'notes', len(p.read_text()))")


def agent(fp: Client, name: str, pool: str, rows: list[tuple[str, JobInfo]], lock: threading.Lock,
          rng: random.Random, plan: list[int], think: float, progress: LoopProgress,
          failures: list[BaseException]) -> None:
    try:
        agent_steps(fp, name, pool, rows, lock, rng, plan, think, progress)
    except Exception as exc:  # the main thread reports it once (a thread's own traceback would not stop the loop)
        failures.append(exc)


def agent_steps(fp: Client, name: str, pool: str, rows: list[tuple[str, JobInfo]], lock: threading.Lock,
                rng: random.Random, plan: list[int], think: float, progress: LoopProgress) -> None:
    tag = f"{name}-{rng.randrange(1 << 30):x}"
    step = 0
    for iteration, calls in enumerate(plan):
        for call in range(calls):
            body = round(rng.uniform(0.2, 0.5), 2)
            job = fp.run(["python3", "-c", TOOL.format(body=body, step=step)], pool=pool, lease_tag=tag,
                         timeout_s=60)
            with lock:
                rows.append((f"{name} i{iteration}c{call}", job))
            progress.done(f"{name} i{iteration}c{call}", job)
            step += 1
            time.sleep(rng.uniform(0.2, 0.6) * think)
        time.sleep(1.0 * think)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--token")
    parser.add_argument("--pool", default="cpu")
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--think", type=float, default=1.0, help="scale of the think pauses")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rows: list[tuple[str, JobInfo]] = []
    lock = threading.Lock()
    rngs = [random.Random(args.seed + i) for i in range(args.agents)]
    plans = [[rng.randint(2, 4) for _ in range(3)] for rng in rngs]  # tool calls per iteration, drawn up front
    total = sum(map(sum, plans))
    failures: list[BaseException] = []
    with Client(args.url, args.token) as fp:
        fp.whoami()  # no broker, or a refused token: one error here, before any thread starts
        with LoopProgress(f"agent loop: {args.agents} agents", total) as progress:
            threads = [threading.Thread(target=agent, args=(fp, f"agent{i}", args.pool, rows, lock, rngs[i],
                                                            plans[i], args.think, progress, failures))
                       for i in range(args.agents)]
            started = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            makespan = time.monotonic() - started
    if failures:
        raise failures[0]
    rows.sort(key=lambda r: r[1].timings.get("submitted_at", 0.0))
    print_table(f"agent loop: {args.agents} agents, makespan {makespan:.1f} s", rows)
    firsts = {r[1].raw.get("lease_tag") for r in rows}
    later = [job for label, job in rows if not label.endswith("i0c0")]
    cold_later = [job.id for job in later if job.path != "warm"]
    failed = [job.id for _, job in rows if job.state != "SUCCEEDED"]
    print(f"sessions: {len(firsts)}; steps after each agent's first that were not warm: {len(cold_later)}")
    return 1 if failed or cold_later else 0


if __name__ == "__main__":
    run_main(main)
