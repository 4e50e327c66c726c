"""Draw the gain-curve result (``experiments.harness.gain_curve``): Pipe-SGD's gain over sync at the same codec
against comm / compute, one colour per codec, the measured points with their rounds' range, the model's prediction
of each point (hollow) and its curve (a line), and the paper's ideal (grey, dotted). Reads only the result dict;
matplotlib is imported inside the functions (an optional extra).
"""
from __future__ import annotations

import math

from experiments.harness.gain_curve import textbook_gain

__all__ = ["draw_gain_curve", "figure"]


def draw_gain_curve(data: dict, ax) -> None:
    """The figure's one panel on ``ax``."""
    points, curves = data["points"], data["curves"]
    ratios = [p["comm_over_compute"] for p in points] + [r for c in curves.values() for r, _ in c["points"]]
    for index, codec in enumerate(dict.fromkeys(p["codec"] for p in points)):
        colour = f"C{index}"
        mine = [p for p in points if p["codec"] == codec]
        if codec in curves:
            ax.plot(*zip(*curves[codec]["points"]), "-", color=colour, lw=1.5, label=f"{codec}: the model")
        x = [p["comm_over_compute"] for p in mine]
        y = [p["gain"] for p in mine]
        spread = [[p["gain"] - p["gain_min"] for p in mine], [p["gain_max"] - p["gain"] for p in mine]]
        ax.errorbar(x, y, yerr=spread, fmt="o", color=colour, ms=6, capsize=3, label=f"{codec}: measured")
        ax.plot(x, [p["model"]["gain"] for p in mine], "o", mfc="none", color=colour, ms=10,
                label=f"{codec}: the model at each point")
        for p in mine:
            ax.annotate(p["bandwidth"], (p["comm_over_compute"], p["gain"]), textcoords="offset points",
                        xytext=(5, -11), fontsize=7, color=colour)
    if ratios:
        low, high = min(ratios), max(ratios)
        grid = [math.exp(math.log(low) + i * (math.log(high) - math.log(low)) / 99) for i in range(100)]
        ax.plot(grid, [textbook_gain(r) for r in grid], ":", color="grey", lw=1,
                label="ideal: (1 + r) / max(1, r), nothing shared")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("comm / compute (sync run: exchange / (forward + backward + update))")
    ax.set_ylabel("gain: sync ms per iteration / pipe ms per iteration")
    setup = data["setup"]
    ax.set_title(f"Pipe-SGD (width 2) over sync at the same codec: {setup['model']}, {setup['nodes']} nodes, "
                 f"{setup['cores_per_node']} core(s) each", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def figure(data: dict):
    """A matplotlib figure of ``draw_gain_curve``."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    draw_gain_curve(data, ax)
    fig.tight_layout()
    return fig
