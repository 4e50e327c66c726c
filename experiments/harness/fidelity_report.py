"""The fidelity run's report: the markdown table with the breakdown of every point over the flag, and the
predicted-vs-measured scatter plot (matplotlib, optional)."""
from __future__ import annotations

from timing_model.errors import summary_line

__all__ = ["ms", "opt_ms", "markdown", "scatter"]


def ms(seconds: float) -> str:
    """Seconds as milliseconds with one decimal."""
    return f"{1e3 * seconds:.1f}"


def opt_ms(seconds: float | None) -> str:
    """``ms`` or '-' when not measured."""
    return "-" if seconds is None else ms(seconds)


def markdown(points: list[dict], failures: list[dict], stats: dict, header: str) -> str:
    """The fidelity table, its summary line, the breakdown of every point over the flag and the failed runs."""
    lines = [header, "", "| bandwidth | nodes | variant | measured ms | predicted ms | error | regime |",
             "|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['bandwidth']} | {p['nodes']} | {p['variant']} | {ms(p['measured_s'])} | "
                     f"{ms(p['predicted_s'])} | {100 * p['error']:+.1f} % | {p['predicted']['regime']} |")
    if stats["runs"]:
        lines += ["", summary_line(stats)]
    flagged = [p for p in points if abs(p["error"]) > stats["flag"]]
    if flagged:
        lines += ["", f"## Points over {100 * stats['flag']:.0f} %: model breakdown vs measured (ms)", "",
                  "| bandwidth | nodes | variant | error | pred compute | pred update | pred hand-off | pred exposed comm | "
                  "pred codec | pred comm total | meas compute | meas update | meas exposed (iter-compute-update) | "
                  "meas comm busy | meas wait |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in flagged:
            pr, me = p["predicted"], p["measured"]
            lines.append(f"| {p['bandwidth']} | {p['nodes']} | {p['variant']} | {100 * p['error']:+.1f} % | "
                         f"{ms(pr['compute_s'])} | {ms(pr['update_s'])} | {ms(pr['handoff_s'])} | "
                         f"{ms(pr['exposed_comm_s'])} | "
                         f"{ms(pr['codec_s'])} | {ms(pr['comm_total_s'])} | {ms(me['compute_s'])} | "
                         f"{ms(me['update_s'])} | {ms(me['exposed_s'])} | {opt_ms(me.get('comm_busy_s'))} | "
                         f"{opt_ms(me.get('wait_s'))} |")
    if failures:
        lines += ["", "## Failed runs (skipped)", ""] + [
            f"- {f['bandwidth']} {f['nodes']} nodes {f['variant']}: {f['reason']}" for f in failures]
    return "\n".join(lines) + "\n"


def scatter(points: list[dict], path: str, flag: float) -> str | None:
    """predicted vs measured, y = x and the ±flag band; None (and a reason) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no scatter plot (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(6, 6))
    measured = [1e3 * p["measured_s"] for p in points]
    predicted = [1e3 * p["predicted_s"] for p in points]
    lo, hi = 0.8 * min(measured + predicted), 1.25 * max(measured + predicted)
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="y = x")
    ax.fill_between([lo, hi], [lo * (1 - flag), hi * (1 - flag)], [lo * (1 + flag), hi * (1 + flag)],
                    color="0.85", label=f"±{100 * flag:.0f} %")
    markers = {2: "o", 4: "s", 8: "^"}
    for variant in dict.fromkeys(p["variant"] for p in points):
        for nodes in sorted({p["nodes"] for p in points if p["variant"] == variant}):
            sel = [p for p in points if p["variant"] == variant and p["nodes"] == nodes]
            ax.scatter([1e3 * p["measured_s"] for p in sel], [1e3 * p["predicted_s"] for p in sel],
                       marker=markers.get(nodes, "D"), label=f"{variant}, {nodes} nodes", zorder=3)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured ms / iteration",
           ylabel="predicted ms / iteration", title="Timing model fidelity (emulated cluster)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
