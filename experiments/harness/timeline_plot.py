"""Draw the timeline result (``experiments.harness.timeline``): one panel per scheme, one row per worker x thread, bars
coloured by kind, time in ms from the first traced step. Reads only the result's spans; matplotlib is imported
inside the functions (an optional extra).
"""
from __future__ import annotations

__all__ = ["COLORS", "rows_of", "draw_scheme", "draw_timeline"]

COLORS = {"compute": "#4c72b0", "comm": "#dd8452", "wait": "#c44e52", "update": "#55a868", "server": "#8172b3",
          "step": "#d0d0d0"}  # step: the rest of opt.step() (hand-off, buffer sync), drawn behind wait and update
_ROW_ORDER = ("main", "comm", "server")
_BUFFER_SYNC = "buffer sync"  # a wait on the training thread for the BatchNorm buffer broadcast: hatched
_HEIGHT = {"compute": 0.7, "step": 0.7, "wait": 0.7, "server": 0.7, "comm": 0.5, "update": 0.35}  # nested spans stay visible


def rows_of(spans: list[list]) -> list[tuple[int, str]]:
    """(rank, thread row) pairs present in ``spans``, rank by rank, main before comm before server."""
    pairs = {(s[0], s[1]) for s in spans}
    order = {name: i for i, name in enumerate(_ROW_ORDER)}
    return sorted(pairs, key=lambda p: (p[0], order.get(p[1], len(order)), p[1]))


def draw_scheme(ax, scheme: str, data: dict, t_max_ms: float | None = None) -> None:
    """One scheme's panel on ``ax``: each span a bar on its row (longer spans first, so nested ones show)."""
    spans = data["spans"]
    rows = rows_of(spans)
    y = {row: len(rows) - 1 - i for i, row in enumerate(rows)}
    for rank, row, name, kind, start, dur in sorted(spans, key=lambda s: -s[5]):
        h = _HEIGHT.get(kind, 0.6)
        ax.broken_barh([(start, max(dur, 0.05))], (y[(rank, row)] - h / 2, h), facecolors=COLORS.get(kind, "grey"),
                       edgecolor="white" if name == _BUFFER_SYNC else "none", hatch="///" if name == _BUFFER_SYNC
                       else None, linewidth=0)
    ax.set_yticks(list(y.values()), [f"worker {rank} {row}" for rank, row in y])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    if t_max_ms is not None:
        ax.set_xlim(0, t_max_ms)
    ms = data.get("median_ms", {}).get("t_iter")
    ax.set_title(f"{scheme}" + (f"  (slowest worker's median: {ms:.0f} ms / iteration)" if ms else ""), loc="left",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def draw_timeline(result: dict, schemes: list[str] | None = None):
    """The whole figure: a panel per scheme sharing one time axis; returns the matplotlib Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = schemes or list(result["schemes"])
    heights = [max(1, len(rows_of(result["schemes"][n]["spans"]))) for n in names]
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 0.32 * sum(heights) + 1.2 * len(names)),
                             gridspec_kw={"height_ratios": heights}, sharex=True, squeeze=False)
    t_max = max((s[4] + s[5] for n in names for s in result["schemes"][n]["spans"]), default=1.0)
    for ax, name in zip(axes[:, 0], names):
        draw_scheme(ax, name, result["schemes"][name], t_max)
    axes[-1, 0].set_xlabel("ms from the first traced step (the moment the last worker reaches it)")
    labels = dict(COLORS, **{"opt.step (other)": COLORS["step"]})
    labels.pop("step")
    handles = [Patch(color=c, label=k) for k, c in labels.items()]
    handles.insert(3, Patch(facecolor=COLORS["wait"], edgecolor="white", hatch="///", label="wait: buffer sync"))
    fig.legend(handles=handles, loc="upper right", ncol=len(handles),
               fontsize=8, frameon=False)
    setup = result.get("setup", {})
    fig.suptitle(f"{setup.get('model')} on {setup.get('dataset')}, {setup.get('world_size')} workers, "
                 f"{setup.get('bandwidth') or setup.get('network')}", x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig
