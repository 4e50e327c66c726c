"""Figures of the 4-node comparison, drawn only from a loaded runs.json (``provenance.read_result``): per cell the
iteration split, throughput, bytes on the wire, accuracy against wall-clock time and time to target; over the grid
the timing model's predicted against measured scatter, and over two sittings of the grid the model's error in one
against the other (``experiments.harness.repeatability``). Each function draws on a matplotlib Axes it is given (or
returns a Figure); matplotlib is imported inside, as it is an optional extra."""
from __future__ import annotations

__all__ = ["cells", "runs_of", "plot_split", "plot_throughput", "plot_bytes", "plot_accuracy_vs_wall",
           "plot_time_to_target", "cell_figure", "plot_model_scatter",
           "plot_sitting_errors"]

SPLIT = (("compute_s", "compute", "#4c72b0"), ("exposed_comm_s", "exposed communication", "#dd8452"),
         ("update_s", "update", "#55a868"))


def cells(data: dict) -> list[str]:
    """The cells of the result with at least one finished run, in run order."""
    return list(dict.fromkeys(r["cell"] for r in data["runs"] if r.get("status") == "ok"))


def runs_of(data: dict, cell: str) -> list[dict]:
    """The finished runs of ``cell`` in the grid's variant order."""
    order = {v: i for i, v in enumerate(data["config"].get("variants", []))}
    runs = [r for r in data["runs"] if r["cell"] == cell and r.get("status") == "ok"]
    return sorted(runs, key=lambda r: order.get(r["variant"], len(order)))


def plot_split(data: dict, cell: str, ax) -> None:
    """Stacked bars: compute / exposed communication / update, ms per iteration (median over steps of the mean over ranks)."""
    runs = runs_of(data, cell)
    names = [r["variant"] for r in runs]
    bottom = [0.0] * len(runs)
    for key, label, colour in SPLIT:
        values = [1e3 * r[key] for r in runs]
        ax.bar(names, values, bottom=bottom, label=label, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(ylabel="ms / iteration", title=f"{cell}: iteration split (ddp: its allreduce is in compute)")
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize=7)


def plot_throughput(data: dict, cell: str, ax) -> None:
    """Samples per second over all workers."""
    runs = runs_of(data, cell)
    ax.bar([r["variant"] for r in runs], [r.get("throughput_sps") or 0.0 for r in runs], color="#8172b3")
    ax.set(ylabel="samples / s (all workers)", title=f"{cell}: throughput")
    ax.tick_params(axis="x", rotation=45)


def plot_bytes(data: dict, cell: str, ax) -> None:
    """Bytes all ranks put on the wire per iteration (ddp: the ring-equivalent volume)."""
    runs = runs_of(data, cell)
    ax.bar([r["variant"] for r in runs], [(r.get("bytes_per_iter") or 0.0) / 1e6 for r in runs], color="#937860")
    ax.set(ylabel="MB / iteration (all ranks)", title=f"{cell}: bytes on the wire")
    ax.tick_params(axis="x", rotation=45)


def plot_accuracy_vs_wall(data: dict, cell: str, ax) -> None:
    """Test accuracy of each evaluation against seconds since the trainer started, one line per variant."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"]  # 11 variants: the default 10-colour cycle would repeat one
    for i, r in enumerate(runs_of(data, cell)):
        points = [p for p in r.get("curve", []) if p.get("accuracy") is not None]
        ax.plot([p["wall_s"] for p in points], [p["accuracy"] for p in points], marker=".", label=r["variant"],
                color=colours(i % 20), ls="-" if r["variant"].startswith("pipe") else "--")
    target = data["config"].get("target_accuracy")
    if target:
        ax.axhline(target, color="0.5", ls="--", lw=1, label=f"target {target:g}")
    ax.set(xlabel="wall-clock s", ylabel="test accuracy", title=f"{cell}: accuracy against time")
    ax.legend(fontsize=7)


def plot_time_to_target(data: dict, cell: str, ax) -> None:
    """Seconds to the target accuracy; a hatched empty bar marks a run that did not reach it."""
    runs = runs_of(data, cell)
    names = [r["variant"] for r in runs]
    reached = [r.get("time_to_target_s") for r in runs]
    top = max([t for t in reached if t is not None], default=1.0)
    ax.bar(names, [t if t is not None else top for t in reached], color=["#c44e52" if t is not None else "none"
                                                                         for t in reached],
           edgecolor="#c44e52", hatch=None)
    for i, t in enumerate(reached):
        if t is None:
            ax.text(i, top / 2, "not\nreached", ha="center", va="center", fontsize=7)
    ax.set(ylabel="s to target", title=f"{cell}: time to {data['config'].get('target_accuracy')} accuracy")
    ax.tick_params(axis="x", rotation=45)


def cell_figure(data: dict, cell: str):
    """All five panels of one cell in one Figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(24, 4.2))
    for draw, ax in zip((plot_split, plot_throughput, plot_bytes, plot_accuracy_vs_wall, plot_time_to_target), axes):
        draw(data, cell, ax)
    fig.tight_layout()
    return fig


def plot_model_scatter(data: dict, ax, flag: float = 0.10) -> None:
    """The timing model's predicted against measured ms per iteration, y = x and the +/-flag band, per variant."""
    points = [r for r in data["runs"] if r.get("status") == "ok" and r.get("model")]
    if not points:
        ax.text(0.5, 0.5, "no predicted runs", ha="center", transform=ax.transAxes)
        return
    values = [1e3 * r["model"][k] for r in points for k in ("measured_s", "predicted_s")]
    lo, hi = 0.8 * min(values), 1.25 * max(values)
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="y = x")
    ax.fill_between([lo, hi], [lo * (1 - flag), hi * (1 - flag)], [lo * (1 + flag), hi * (1 + flag)], color="0.85",
                    label=f"±{100 * flag:.0f} %")
    markers = dict(zip(dict.fromkeys(r["workload"] for r in points), "osD^v<>"))  # a marker per workload
    for i, variant in enumerate(dict.fromkeys(r["variant"] for r in points)):  # a colour per variant
        for workload, marker in markers.items():
            sel = [r for r in points if r["variant"] == variant and r["workload"] == workload]
            if sel:
                ax.scatter([1e3 * r["model"]["measured_s"] for r in sel],
                           [1e3 * r["model"]["predicted_s"] for r in sel],
                           marker=marker, color=f"C{i % 10}", label=f"{variant} ({workload})", zorder=3)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms / iteration",
           ylabel="predicted ms / iteration", title="Timing model against the comparison runs")
    ax.legend(fontsize=6, loc="upper left")


def plot_sitting_errors(first: dict, second: dict, axes, flag: float = 0.10) -> int:
    """Two sittings of one grid, per run predicted in both (``repeatability.pairs``), on two Axes: the model's error
    in the first against the second, with y = x and the ±flag square (a term the model lacks errs alike in both:
    near the diagonal, away from the centre); and the measured change from the first to the second against how far
    the error moved (a prediction that did not follow the machine's drift lies on y = −x). Returns the points
    drawn per panel."""
    from .repeatability import pairs

    both = [p for p in pairs(first, second) if p.error_shift is not None]
    left, right = axes
    spans = [1.1 * max([100 * abs(v) for p in both for v in pick(p)] + [100 * flag])
             for pick in (lambda p: (p.first_error, p.second_error), lambda p: (p.change, p.error_shift))]
    left.add_patch(_square(100 * flag))
    for ax in axes:
        ax.axhline(0, color="0.6", lw=0.8)
        ax.axvline(0, color="0.6", lw=0.8)
    left.plot([-spans[0], spans[0]], [-spans[0], spans[0]], "k-", lw=1, label="y = x")
    right.plot([-spans[1], spans[1]], [spans[1], -spans[1]], "k--", lw=1, label="y = −x")
    for i, workload in enumerate(dict.fromkeys(p.workload for p in both)):
        sel = [p for p in both if p.workload == workload]
        style = dict(marker="osD^v<>"[i % 7], color=f"C{i % 10}", label=workload, zorder=3)
        left.scatter([100 * p.first_error for p in sel], [100 * p.second_error for p in sel], **style)
        right.scatter([100 * p.change for p in sel], [100 * p.error_shift for p in sel], **style)
    left.set(xlabel="model error, first sitting (%)", ylabel="model error, second sitting (%)",
             title="The model's error in two sittings")
    right.set(xlabel="measured change, first → second (%)", ylabel="error second − first (points)",
              title="Drift against the error's shift")
    for ax, span in zip(axes, spans):
        ax.set(xlim=(-span, span), ylim=(-span, span), aspect="equal")
        ax.legend(fontsize=7, loc="upper left")
    return len(both)


def _square(half: float):
    from matplotlib.patches import Rectangle

    return Rectangle((-half, -half), 2 * half, 2 * half, color="0.85", label=f"±{half:.0f} %")
