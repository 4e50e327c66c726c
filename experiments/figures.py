"""The README's figures, drawn from the committed results only (``experiments/results/``) with the same package
functions the notebooks use, written as PNGs under ``experiments/figures/``.

    python experiments/figures.py                 # every figure whose result is committed
    python experiments/figures.py --only timeline

Each figure names, in ``experiments/figures/README.md``, the result it was drawn from and that result's own
provenance (command, date, machine, commit). Needs the notebooks extra (matplotlib).
"""
from __future__ import annotations

import argparse
import os
import sys

from timing_model.atomic import write_text_atomic
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the harness: experiments/harness

from experiments.harness.one_line import OneLineParser  # noqa: E402
from experiments.harness.provenance import find_results, read_result

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")


def _comparison_panels(data: dict, fig_cells: list[str], panel: str):
    """One panel per cell (those of ``fig_cells`` the result has, else its first two), drawn by ``panel``."""
    import matplotlib.pyplot as plt

    from experiments.harness import comparison_plot

    draw = getattr(comparison_plot, panel)
    chosen = [c for c in fig_cells if c in comparison_plot.cells(data)] or comparison_plot.cells(data)[:2]
    fig, axes = plt.subplots(1, len(chosen), figsize=(7 * len(chosen), 4.4), squeeze=False)
    for ax, cell in zip(axes[0], chosen):
        draw(data, cell, ax)
    fig.tight_layout()
    return fig


def _model_scatter(data: dict):
    import matplotlib.pyplot as plt

    from experiments.harness.comparison_plot import plot_model_scatter

    fig, ax = plt.subplots(figsize=(6.5, 6.5))
    plot_model_scatter(data, ax)
    fig.tight_layout()
    return fig


def _accuracy(result: dict, which: str):
    from experiments.harness import accuracy_plot

    return accuracy_plot.figure_widths(result) if which == "widths" else accuracy_plot.figure_codecs(result)


def _gain_curve(result: dict):
    from experiments.harness.gain_curve_plot import figure

    return figure(result)


def _timeline(result: dict):
    from experiments.harness.timeline_plot import draw_timeline

    return draw_timeline(result)


# figure name: (committed result, drawing function of the loaded result)
FIGURES = {
    "comparison_split": ("comparison/runs.json",
                         lambda d: _comparison_panels(d, ["alexnet-1gbit", "resnet20-100mbit"], "plot_split")),
    # Time to accuracy from the sitting with look-ahead (the comparison grid ran the paper's plain update).
    "time_to_accuracy": ("time_to_accuracy/runs.json",
                         lambda d: _comparison_panels(d, ["resnet20-100mbit", "lenet-100mbit"],
                                                      "plot_time_to_target")),
    "model_scatter": ("fidelity/sitting-a.json", _model_scatter),
    "accuracy_widths": ("accuracy/accuracy.json", lambda d: _accuracy(d, "widths")),
    "accuracy_codecs": ("accuracy/accuracy.json", lambda d: _accuracy(d, "codecs")),
    "timeline": ("timeline/timeline.json", _timeline),
    "gain_curve": ("bench_gain_curve/gain_curve.json", _gain_curve),
}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help=f"comma list of figures, of {', '.join(FIGURES)}")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    names = [n for n in (args.only or ",".join(FIGURES)).split(",") if n]
    bad = [n for n in names if n not in FIGURES]
    if bad:
        parser.error(f"unknown figure {', '.join(bad)}; valid: {', '.join(FIGURES)}")
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print("figures: error: matplotlib is missing (pip install -e '.[notebooks]')", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    index = ["# Figures drawn by `python experiments/figures.py` from committed results", ""]
    for name in names:
        source, draw = FIGURES[name]
        try:
            path = find_results(source)
            data = read_result(path)
        except (FileNotFoundError, ValueError) as error:
            print(f"figures: error: {name}: {error}", file=sys.stderr)
            return 1
        fig = draw(data)
        png = os.path.join(args.out, f"{name}.png")
        tmp = png + ".tmp.png"
        fig.savefig(tmp, dpi=90)
        os.replace(tmp, png)  # atomically: a reader sees the old figure or the new one
        origin = data["provenance"]
        index.append(f"- `{name}.png` from `experiments/results/{source}`: `{origin['command']}` "
                     f"({origin['date']}, commit {origin['commit']}, {origin['machine'].get('cpu')}, "
                     f"{origin['machine'].get('cores')} cores)")
        print(f"figures: wrote {png}", file=sys.stderr)
    readme = os.path.join(args.out, "README.md")
    if args.only and os.path.exists(readme):  # keep the other figures' lines, replace the redrawn ones'
        with open(readme) as handle:
            old = handle.read().splitlines()
        drawn = {line.split("`")[1]: line for line in index[2:]}
        kept = [drawn.pop(line.split("`")[1], line) if line.startswith("- `") else line for line in old]
        index = kept + list(drawn.values())
    write_text_atomic(readme, "\n".join(index) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
