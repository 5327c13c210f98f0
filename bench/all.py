"""`firepool bench all`: every registered benchmark in sequence, one combined table.

Each benchmark runs in its own process (`firepool bench NAME --json`), so one that crashes or hangs costs
only its own rows: it gets one row saying so, marked a miss. With `--json` the output is one object whose
`rows` are every benchmark's rows concatenated, in registry order; each benchmark still writes its own
bench/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import Row, report


def _registry() -> tuple[str, ...]:
    from broker.cli_commands import BENCHMARKS

    return tuple(b for b in BENCHMARKS if b != "all")


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def run_one(name: str, timeout_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One benchmark's rows and how its run went (exit code, wall time, the tail of stderr on failure)."""
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "broker.cli", "bench", name, "--json"], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        wall = time.monotonic() - began
        return [_failed(name, f"ran past {timeout_s:.0f} s")], {"rc": None, "wall_s": round(wall, 1)}
    wall = round(time.monotonic() - began, 1)
    payload = _last_json(done.stdout)
    status: dict[str, Any] = {"rc": done.returncode, "wall_s": wall}
    if payload is None or not isinstance(payload.get("rows"), list) or not payload["rows"]:
        status["stderr"] = done.stderr[-800:]
        return [_failed(name, f"exit {done.returncode}, no rows")], status
    return list(payload["rows"]), status


def _failed(name: str, why: str) -> dict[str, Any]:
    return {"id": "-", "metric": f"bench {name}: {why}", "ours": None, "unit": "", "paper": "",
            "target": "runs", "met": False}


def main(argv: Sequence[str], json_out: bool = False) -> int:
    registry = _registry()
    parser = argparse.ArgumentParser(prog="firepool bench all", description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated benchmarks to run (default: all of them)")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark may run")
    args = parser.parse_args(list(argv))
    only = [n for n in args.only.split(",") if n]
    skip = {n for n in args.skip.split(",") if n}
    unknown = sorted((set(only) | skip) - set(registry))
    if unknown:
        parser.error(f"unknown benchmarks {unknown} (registered: {', '.join(registry)})")
    names = [n for n in (only or registry) if n not in skip]
    rows: list[Row] = []
    runs: dict[str, Any] = {}
    for name in names:
        print(f"bench {name} ...", file=sys.stderr, flush=True)
        got, status = run_one(name, args.timeout)
        runs[name] = status
        rows += [Row(id=str(r.get("id", "")), metric=str(r.get("metric", "")), ours=r.get("ours"),
                     unit=str(r.get("unit", "")), paper=str(r.get("paper", "")), target=str(r.get("target") or ""),
                     met=r.get("met")) for r in got]
        print(f"bench {name}: {len(got)} rows, exit {status['rc']}, {status['wall_s']} s", file=sys.stderr, flush=True)
    return report("all", rows, json_out=json_out, extra={"benchmarks": runs})
