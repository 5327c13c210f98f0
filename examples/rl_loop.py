"""An RL loop through Firepool: 4 barrier-synchronised iterations of 8 parallel rollouts, 2 evaluations
and 1 policy update (the paper's W-RL shape, scaled down). The slowest pod start in a stage delays the
whole iteration, so after the first iteration every job should land on a warm pod. Each stage is one
`fp.map` (one batch request for all its jobs, one watch for their ends).

    python examples/rl_loop.py [--url URL] [--token TOKEN] [--pool cpu]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _failing import run_main  # noqa: E402
from _table import LoopProgress, print_table  # noqa: E402

from broker.client import Client, JobInfo  # noqa: E402

BODY = "import time, random; time.sleep({body}); print('{kind}', {i}, 'reward', round(random.random(), 3))"


def stage(fp: Client, pool: str, tag: str, kind: str, n: int, rng: random.Random, it: int,
          progress: LoopProgress) -> list[JobInfo]:
    bodies = [round(rng.uniform(0.3, 0.8), 2) for _ in range(n)]
    commands = [["python3", "-c", BODY.format(body=body, kind=kind, i=i)] for i, body in enumerate(bodies)]
    jobs = []
    for i, job in enumerate(fp.map(commands, pool, lease_tag=tag, timeout_s=120)):  # in the stage's order
        progress.done(f"it{it} {kind}{i}", job)
        jobs.append(job)
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--token")
    parser.add_argument("--pool", default="cpu")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    tag = f"rl-run-{rng.randrange(1 << 30):x}"
    rows: list[tuple[str, JobInfo]] = []
    started = time.monotonic()
    total = args.iterations * (args.rollouts + 3)
    with Client(args.url, args.token) as fp:
        fp.whoami()  # no broker, or a refused token: one error before the loop starts
        with LoopProgress(f"RL loop: {args.iterations} iterations", total) as progress:
            for it in range(args.iterations):
                for kind, n in (("rollout", args.rollouts), ("eval", 2), ("update", 1)):
                    for i, job in enumerate(stage(fp, args.pool, tag, kind, n, rng, it, progress)):
                        rows.append((f"it{it} {kind}{i}", job))
    makespan = time.monotonic() - started
    print_table(f"RL loop: {args.iterations} iterations x ({args.rollouts} rollouts, 2 evals, 1 update), "
                f"makespan {makespan:.1f} s", rows)
    later = [job for label, job in rows if not label.startswith("it0 ")]
    cold_later = [job.id for job in later if job.path != "warm"]
    failed = [job.id for _, job in rows if job.state != "SUCCEEDED"]
    print(f"jobs after the first iteration that were not warm: {len(cold_later)}")
    return 1 if failed or cold_later else 0


if __name__ == "__main__":
    run_main(main)
