"""B6: the cost of a verified reset on the local backend, by what the job left behind.

Each case runs a job in a real bubblewrap pod, waits for it to exit, then times the agent's reset
(kill the tree, verify through /proc, wipe /pkg, /dev/shm and the per-attempt files, verify). The
residue case runs through a broker: a wipe path the agent cannot empty makes the reset unclean, the
pod is deleted, and the next job lands on a new pod.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from bench.broker_proc import BenchBroker
from bench.common import Row, at_most, median, report
from broker.backends.local import LocalBackend
from broker.clock import RealClock
from broker.pods import Origin
from broker.pools import PoolSpec
from broker.ports.agent import LaunchRequest, ResetRequest
from broker.ports.backend import PodRequest

CASES = {
    "clean": ["true"],
    "10k files": ["python3", "-c", "import os\nos.makedirs('/pkg/scratch')\n"
                  "for i in range(10000):\n    open(f'/pkg/scratch/f{i}', 'w').write('x')"],
    "1 GiB /dev/shm": ["sh", "-c", "head -c 1073741824 /dev/zero > /dev/shm/big"],
    "leftover processes": ["sh", "-c", "for i in 1 2 3 4 5; do setsid sleep 300 & done; sleep 0.1"],
}


async def reset_costs(repeats: dict[str, int]) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="fp-bench-reset-") as tmp:
        backend = LocalBackend(Path(tmp), RealClock())
        info = await backend.create(PodRequest(name="bench-reset", pool=PoolSpec(name="cpu"), origin=Origin.WARM))
        agent = backend.agent(info.name)
        out: dict[str, list[float]] = {}
        n = 0
        try:
            for case, argv in CASES.items():
                out[case] = []
                for _ in range(repeats[case]):
                    n += 1
                    aid = f"jbench:{n}"
                    await agent.launch(LaunchRequest(attempt_id=aid, argv=argv, env={}, session="bench"))
                    status = await agent.wait(aid, 120)
                    assert not status.running and status.exit_code == 0, status
                    result = await agent.reset(ResetRequest())
                    assert result.clean, result.problems
                    out[case].append(result.duration_s)
        finally:
            await backend.delete(info.name)
            await backend.close()
        return out


def residue_recycling(trials: int) -> tuple[list[float], int]:
    """Seconds from an unclean job's finish to its pod's deletion; how many next jobs got a new pod."""
    residue = Path(tempfile.mkdtemp(prefix="fp-bench-residue-"))
    (residue / "cannot-remove").write_text("x")
    residue.chmod(0o755)
    pools = ("pools:\n  - name: cpu\n    max_count: 4\n    wipe_paths: [/scratch]\n"
             f"    template: {{binds: [{{src: '{residue}', dst: /scratch, ro: true}}]}}\n")
    recycle, fresh = [], 0
    with BenchBroker(pools=pools) as broker, broker.client() as c:
        previous = None
        for _ in range(trials):
            job = c.post("/v1/jobs", json={"pool": "cpu", "command": ["true"], "lease_tag": "r"}).json()
            job = c.get(f"/v1/jobs/{job['id']}", params={"wait_s": 60}).json()
            pod = job["acquisition"][0]["pod"]
            if previous is not None and pod != previous and job["acquisition"][0]["path"] == "new":
                fresh += 1
            while any(p["name"] == pod for p in c.get("/v1/pods").json()["pods"]):
                time.sleep(0.002)
            recycle.append(time.time() - job["timings"]["finished_at"])
            previous = pod
    return recycle, fresh


def main(argv: list[str], json_out: bool = False) -> int:
    parser = argparse.ArgumentParser(prog="firepool bench reset", description=__doc__)
    parser.add_argument("--repeats", type=int, default=30, help="clean resets timed")
    parser.add_argument("--trials", type=int, default=5, help="unclean residue trials")
    args = parser.parse_args(argv)
    costs = asyncio.run(reset_costs({"clean": args.repeats, "10k files": 5, "1 GiB /dev/shm": 3,
                                     "leftover processes": 5}))
    recycle, fresh = residue_recycling(args.trials)
    ms = {case: median(v) * 1000 for case, v in costs.items()}
    rows = [
        Row("B6", f"reset, clean job (median of {args.repeats})", ms["clean"], "ms", "9.3 ms", "<= 5 ms",
            at_most(ms["clean"], 5)),
        Row("B6", "reset, 10,000 scratch files (median of 5)", ms["10k files"], "ms", "187 ms", "<= 150 ms",
            at_most(ms["10k files"], 150)),
        Row("B6", "reset, 1 GiB in /dev/shm (median of 3)", ms["1 GiB /dev/shm"], "ms", "1.35 s (8 GiB)"),
        Row("B6", "reset, 5 leftover daemonised processes (median of 5)", ms["leftover processes"], "ms",
            "~110 ms"),
        Row("B6", "unremovable residue: finish -> pod deleted (median)", median(recycle) * 1000, "ms", "17 ms"),
        Row("B6", f"unremovable residue: next job on a new pod ({args.trials - 1} chances)", fresh, "jobs",
            "5/5", f"= {args.trials - 1}", fresh == args.trials - 1),
    ]
    return report("reset", rows, json_out=json_out)
