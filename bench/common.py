"""Rows, percentiles, tables and result files shared by every benchmark.

A row is one figure: {"id", "metric", "ours", "unit", "paper", "target", "met"}; `met` is None when
the figure has no target. Results go to bench/results/<name>.json with the machine and date.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Row:
    id: str
    metric: str
    ours: float | None
    unit: str
    paper: str
    target: str = ""
    met: bool | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), as the paper computes them."""
    if not values:
        return float("nan")
    data = sorted(values)
    k = (len(data) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def machine() -> dict[str, Any]:
    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}


def _fmt(value: float | None, unit: str) -> str:
    if value is None or value != value:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}"


def report(name: str, rows: Sequence[Row], *, json_out: bool, extra: dict[str, Any] | None = None) -> int:
    """Print the table (or one JSON object) and write bench/results/<name>.json."""
    payload = {"benchmark": name, "machine": machine(), "rows": [asdict(r) for r in rows], **(extra or {})}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    if json_out:
        print(json.dumps(payload))
        return 0
    header = f"{'id':<4} {'metric':<52} {'ours':>14} {'paper':>22} {'target':>16}  met"
    print(header)
    print("-" * len(header))
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        print(f"{r.id:<4} {r.metric:<52} {_fmt(r.ours, r.unit):>14} {r.paper:>22} {r.target:>16}  {met}")
    print(f"(raw results: {RESULTS / (name + '.json')}; machine: {payload['machine']['cpus']} CPUs, "
          f"Python {payload['machine']['python']})")
    return 0


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ for the block (the SDK and Jupyter read them), then what was there before."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
