"""B7's picture (paper Fig. 4): submit → first instruction CDF per arm, one panel per workload, all repeats
pooled, circles at p50 and triangles at p90; the paper's H200 p50/p90 (Table 5) overlaid at the run's scale."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from broker.sim.stats import percentile
from broker.sim.workloads import ARMS

COLOURS = {"reuse-on": "tab:blue", "reuse-off": "tab:orange", "fresh-pod": "tab:red"}
LABELS = {"reuse-on": "Reuse On", "reuse-off": "Reuse Off", "fresh-pod": "fresh pod per job"}


def plot_cdfs(runs: list[dict[str, Any]], workloads: list[str], scale: float, path: Path,
              paper_starts: Mapping[tuple[str, str], tuple[float, float]]) -> Path:
    """Draw the CDFs to `path`; `paper_starts` is bench.loops' table, passed in so this module needs nothing above it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(workloads), figsize=(5.2 * len(workloads), 4.2), squeeze=False)
    for ax, name in zip(axes[0], workloads, strict=True):
        for arm in ARMS:
            starts = sorted(s for r in runs if r["workload"] == name and r["arm"] == arm for s in r["starts"])
            if not starts:
                continue
            ys = [(i + 1) / len(starts) for i in range(len(starts))]
            p50, p90 = percentile(starts, 50), percentile(starts, 90)
            ax.step(starts, ys, where="post", color=COLOURS[arm],
                    label=f"{LABELS[arm]}: p50 {p50:.2f}, p90 {p90:.2f} s")
            ax.plot([p50], [0.5], "o", color=COLOURS[arm])
            ax.plot([p90], [0.9], "^", color=COLOURS[arm])
            paper = paper_starts.get((name, arm))
            if paper:
                ax.plot([paper[0] * scale], [0.5], "o", mfc="none", ms=10, color=COLOURS[arm])
                ax.plot([paper[1] * scale], [0.9], "^", mfc="none", ms=10, color=COLOURS[arm],
                        label=f"paper (H200, x{scale:g}): p50 {paper[0] * scale:.2f}, p90 {paper[1] * scale:.2f} s")
        ax.set_xscale("log")
        ax.set_xlabel("submit → first instruction (s, log)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(name)
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"B7 start latency, local backend, H200 cold start x{scale:g} (filled: ours; hollow: paper Table 5)",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
