"""Plots of the simulator's results (matplotlib, PNG beside the JSON they are drawn from, in bench/results/).

Axes carry units; the paper's points are overlaid where the paper gives them (App. C.1, C.5, Fig. 5–7).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=float) + "\n")
    return path


COLORS = {"steady": "tab:blue", "bursty": "tab:red", "diurnal": "tab:green"}


def frontier_plot(table: dict[str, Any], path: Path) -> Path:
    """Fig. 6b: held processor-time ÷ always-on peak pool against start latency (Δp50 and p90), per pattern."""
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for pattern, data in table["patterns"].items():
        c = COLORS.get(pattern, "black")
        cells = data["cells"]
        taus = [k for k in cells if k.replace(".", "").isdigit()]
        grid = [k for k in cells if k.startswith("floor")]
        for axis, key in ((ax, "dp50"), (bx, "p90")):
            axis.plot([cells[k]["held"] for k in taus], [cells[k][key] for k in taus], "o-", color=c,
                      label=f"ours, {pattern}: keep-alive 15–900 s")
            for k in taus:
                axis.annotate(f"{k} s", (cells[k]["held"], cells[k][key]), fontsize=7, color=c, xytext=(3, 3),
                              textcoords="offset points")
            axis.plot([cells["fresh"]["held"]], [cells["fresh"][key]], "s", color=c, mfc="none", ms=8,
                      label=f"ours, {pattern}: fresh pod per job")
            if grid:
                axis.plot([cells[k]["held"] for k in grid], [cells[k][key] for k in grid], "^", color=c,
                          label=f"ours, {pattern}: floor × idle cap, 60 s")
        paper = table["paper"][pattern]
        pts = [(v[0], v[1]) for v in paper.values() if v[1] is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "x", color=c, ms=8, label=f"paper App. C.1, {pattern}")
    for axis in (ax, bx):
        axis.axvline(1.0, color="grey", lw=0.8, ls="--")
        axis.set_xscale("log")
        axis.set_xlabel("held processor-time ÷ always-on pool at peak (×, log)")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_ylim(-0.05, 60)
    ax.set_ylabel("Δ p50 start latency vs always-on pool (s, symlog)")
    ax.set_title("(a) median start vs held capacity; ×: the paper's cells", fontsize=10)
    bx.set_yscale("log")
    bx.set_ylabel("p90 start latency (s, log)")
    bx.set_title("(b) tail start vs held capacity (the paper gives no p90 per cell)", fontsize=10)
    ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Held capacity vs start latency (simulated, CPU venue, 22 s pod start)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def late_binding_plot(table: dict[str, Any], path: Path) -> Path:
    """Fig. 5: hit rate, held capacity and p90 start against the number of environments E."""
    plt = _plt()
    s, p = table["series"], table["paper"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    names = {"shared": "one shared base-image pool (late binding)", "per-env": "pool per environment, each up to budget",
             "split": "pool per environment, budget split"}
    for key, label in names.items():
        e = s[key]["E"]
        axes[0].plot(e, s[key]["hit"], "o-", label=label)
        axes[1].plot(e, s[key]["held"], "o-", label=label)
        axes[2].plot(e, [max(v, 0.1) for v in s[key]["p90"]], "o-", label=label)
    axes[0].plot([1, 64], [p["per_env_hit_1"], p["per_env_hit_64"]], "kx", ms=9, label="paper (per environment)")
    axes[1].plot([64, 64], [p["shared_held_64"], p["per_env_held_64"]], "kx", ms=9, label="paper (E = 64)")
    axes[2].plot([64], [p["split_p90_64"]], "kx", ms=9, label="paper (budget split)")
    for ax, ylabel in zip(axes, ("warm-or-standby hit rate (fraction of jobs)", "held pod-time ÷ always-on pool (×)",
                                 "p90 start latency (s, log)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("distinct environments E (Zipf, s = 1)")
        ax.set_ylabel(ylabel)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("Environment fragmentation, RL rollouts (simulated, CPU venue, 22 s start, 64-pod budget, 900 s keep-alive)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sweep_plot(sweeps: list[dict[str, Any]], path: Path) -> Path:
    """Fig. 7: Reuse On's loop speedup over Reuse Off against body length, one line per think time."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4.2), squeeze=False)
    for ax, sw in zip(axes[0], sweeps, strict=True):
        for think, ser in sw["series"].items():
            line = ax.plot(sw["lengths"], ser["median"], "o-", label=f"think {think} s")
            ax.fill_between(sw["lengths"], ser["lo"], ser["hi"], color=line[0].get_color(), alpha=0.15)
        paper = sw.get("paper")
        if paper:
            ax.plot([paper["below_1_1_at_s"]], [1.1], "kx", ms=9, label="paper: falls below 1.1× (think 0 s)")
            ax.plot([1.5, 1.5], list(paper["short"]), "k-", lw=3, label="paper: 1–2 s bodies (sweep)")
            ax.plot([1.5], [paper["measured_short"]], "k*", ms=10, label="paper: measured")
        ax.axhline(1.1, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("job body length L (s, log)")
        ax.set_ylabel("makespan Reuse Off ÷ Reuse On (×)")
        ax.set_title(f"{sw['workload']} ({sw['venue']} venue, {sw['keep_alive_s']:.0f} s keep-alive)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
