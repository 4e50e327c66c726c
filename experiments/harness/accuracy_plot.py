"""Figures of the accuracy study (``experiments/results/accuracy/accuracy.json``): final accuracy against width and
per codec, mean loss curves, and one-line readings of them. Each ``plot_*`` draws only the file's numbers on the
Axes it is given; matplotlib is imported inside ``figure_*`` only (an optional extra)."""
from __future__ import annotations

import statistics

__all__ = ["tasks", "configs", "mean_curve", "plot_width", "plot_codecs", "plot_loss_curves", "figure_widths",
           "figure_codecs", "figure_loss_curves", "describe_widths", "describe_codecs"]


def tasks(result: dict) -> list[str]:
    return list(dict.fromkeys(c["task"] for c in result["summary"]))


def configs(result: dict, task: str, width: int | None = None, codec_width: bool = False,
            staleness: str | None = None) -> list[dict]:
    """Summary rows of ``task``: the uncompressed ones by width (``width`` None; with ``staleness``, the widths
    above 1 run with it, and width 1), or every row at the codec width with the codecs' staleness."""
    rows = [c for c in result["summary"] if c["task"] == task]
    if codec_width:
        settings = result["settings"]
        stale = settings.get("codec_staleness", "none")
        return [c for c in rows if c["width"] == settings["codec_width"]
                and (c["width"] == 1 or c.get("staleness", "none") == stale)]
    return sorted((c for c in rows if c["codec"] == "none" and (width is None or c["width"] == width)
                   and (staleness is None or c["width"] == 1 or c.get("staleness", "none") == staleness)),
                  key=lambda c: c["width"])


def stalenesses(result: dict) -> list[str]:
    """The staleness modes the widths above 1 ran with."""
    return list(result["settings"].get("stalenesses", ["none"]))


def _label(c: dict) -> str:
    return c["codec"] + ("+ef" if c["error_feedback"] else "")


def mean_curve(result: dict, config: str, curve: str = "eval") -> tuple[list[float], list[float]]:
    """Mean over seeds of a configuration's ``eval`` loss (per epoch) or ``train_loss`` (binned) curve, on the
    steps every seed has (seeds run the same step count, so the points line up)."""
    runs = [r for r in result["runs"] if r["config"] == config]
    if not runs:
        raise ValueError(f"no runs of {config!r}")
    n = min(len(r[curve]["loss"]) for r in runs)
    steps = runs[0][curve]["step"][:n]
    return steps, [statistics.fmean(r[curve]["loss"][i] for r in runs) for i in range(n)]


def plot_width(result: dict, ax, task: str, metric: str = "accuracy") -> None:
    """Final accuracy (%) or test loss (``metric="loss"``) against pipeline width without compression, one line
    per staleness mode (width 1 is shared): mean, bars from min to max over seeds."""
    scale = 100 if metric == "accuracy" else 1
    seeds = 0
    for i, staleness in enumerate(stalenesses(result)):
        rows = configs(result, task, staleness=staleness)
        x = [c["width"] + 0.04 * (i - 0.5) for c in rows]  # side by side, not on top of each other
        mean = [scale * c[metric]["mean"] for c in rows]
        low = [m - scale * c[metric]["min"] for m, c in zip(mean, rows)]
        high = [scale * c[metric]["max"] - m for m, c in zip(mean, rows)]
        ax.errorbar(x, mean, yerr=[low, high], fmt="o-", capsize=4, label=f"staleness={staleness}")
        seeds = max([seeds, *(len(c["seeds"]) for c in rows)])
    ax.set_xticks(sorted({c["width"] for c in configs(result, task)}))
    ax.set_xlabel("pipeline width K (1 = synchronous)")
    ax.set_ylabel("final test accuracy (%)" if metric == "accuracy" else "final test loss (nats)")
    ax.set_title(f"{task}: staleness (mean, min-max over {seeds} seeds)")
    ax.legend(loc="lower left")
    ax.grid(alpha=0.3)


def plot_codecs(result: dict, ax, task: str) -> None:
    """Final accuracy (%) per codec at the codec width, without and with error feedback side by side."""
    rows = configs(result, task, codec_width=True)
    names = list(dict.fromkeys(c["codec"] for c in rows))
    for offset, ef, color in ((-0.2, False, "C0"), (0.2, True, "C1")):
        label = ("with" if ef else "without") + " error feedback"
        for i, name in enumerate(names):
            match = [c for c in rows if c["codec"] == name and c["error_feedback"] == ef]
            if not match:
                continue
            a = match[0]["accuracy"]
            ax.bar(i + offset, 100 * a["mean"], width=0.38, color=color, label=label,
                   yerr=[[100 * (a["mean"] - a["min"])], [100 * (a["max"] - a["mean"])]], capsize=3)
            label = None  # one legend entry per colour
    ax.legend(loc="lower left")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("final test accuracy (%)")
    ax.set_title(f"{task}: codecs at width {result['settings']['codec_width']} (mean, min-max)")
    ax.grid(alpha=0.3, axis="y")


def plot_loss_curves(result: dict, ax, task: str, by: str = "width", curve: str = "eval") -> None:
    """Mean loss over seeds against step, one line per width (``by="width"``) or per codec (``by="codec"``)."""
    rows = configs(result, task) if by == "width" else configs(result, task, codec_width=True)
    for c in rows:
        steps, loss = mean_curve(result, c["config"], curve)
        plain = c["width"] > 1 and c.get("staleness", "none") == "none"
        label = f"K={c['width']}{' none' if plain and by == 'width' else ''}" if by == "width" else _label(c)
        ax.plot(steps, loss, label=label, ls="--" if (by == "codec" and c["error_feedback"]) or
                (by == "width" and plain) else "-")
    ax.set_xlabel("step")
    ax.set_ylabel("test loss" if curve == "eval" else "training loss")
    ax.set_yscale("log")
    ax.set_title(f"{task}: {'test' if curve == 'eval' else 'training'} loss by {by} (mean over seeds)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)


def _figure(result: dict, draw, names: list[str] | None = None, **kwargs):
    import matplotlib.pyplot as plt

    names = names or tasks(result)
    cols = min(len(names), 2)  # two panels a row: four tasks stay readable
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    for ax, task in zip(axes.flat, names):
        draw(result, ax, task, **kwargs)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def figure_widths(result: dict, metric: str = "accuracy", names: list[str] | None = None):
    return _figure(result, plot_width, names, metric=metric)


def figure_codecs(result: dict):
    return _figure(result, plot_codecs)


def figure_loss_curves(result: dict, by: str = "width", curve: str = "eval"):
    return _figure(result, plot_loss_curves, by=by, curve=curve)


def describe_widths(result: dict) -> str:
    """One line per task and staleness mode: what each width above 1 costs (or gains) in mean final accuracy
    (points) and mean final test loss (%) against width 1."""
    lines = []
    for task in tasks(result):
        base = configs(result, task, width=1)
        if not base:
            continue
        ref, ref_loss = 100 * base[0]["accuracy"]["mean"], base[0]["loss"]["mean"]
        for staleness in stalenesses(result):
            rows = [c for c in configs(result, task, staleness=staleness) if c["width"] != 1]
            parts = [f"K={c['width']} {100 * c['accuracy']['mean'] - ref:+.1f} / "
                     f"{100 * (c['loss']['mean'] / ref_loss - 1):+.1f} %" for c in rows]
            lines.append(f"{task}: width 1 reaches {ref:.1f} % (loss {ref_loss:.4f}); {staleness}, against it "
                         f"(points / loss): " + ", ".join(parts))
    return "\n".join(lines)


def describe_codecs(result: dict) -> str:
    """One line per task: each codec's mean final accuracy against the uncompressed run at the codec width."""
    lines = []
    width = result["settings"]["codec_width"]
    for task in tasks(result):
        rows = configs(result, task, codec_width=True)
        base = [c for c in rows if c["codec"] == "none"]
        if not base:
            continue
        ref = 100 * base[0]["accuracy"]["mean"]
        parts = [f"{_label(c)} {100 * c['accuracy']['mean'] - ref:+.1f}" for c in rows if c["codec"] != "none"]
        lines.append(f"{task}: uncompressed width {width} reaches {ref:.1f} %; against it (points): "
                     + ", ".join(parts))
    return "\n".join(lines)
