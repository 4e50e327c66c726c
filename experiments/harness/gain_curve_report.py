"""The markdown report of the gain-curve result (``experiments/bench_gain_curve.py``): where it came from, one row per
measured point beside the timing model's prediction of it, and where each run's time went (``breakdown``).
Reads only the result dict, so a committed JSON renders again without the raw traces.
"""
from __future__ import annotations

from experiments.harness.breakdown import Breakdown, markdown as breakdown_table
from experiments.harness.provenance import markdown_header

__all__ = ["TITLE", "setup_line", "points_table", "render"]

TITLE = "Pipe-SGD's gain over synchronous training at the same codec, against comm / compute"


def setup_line(setup: dict) -> str:
    """One sentence: the workload, the nodes and their cores, the links, the codecs, the steps and rounds."""
    cores = setup["cores_per_node"]
    return (f"{setup['model']} on {setup['dataset']}, batch {setup['batch_size']} per worker, "
            f"{setup['nodes']} emulated nodes with {cores} core{'s' if cores != 1 else ''} of their own each, links "
            f"{', '.join(setup['bandwidths'])}, codecs {', '.join(setup['codecs'])} (sync and pipe at width 2, the "
            f"defaults otherwise), {setup['steps']} steps ({setup['warmup_steps']} synchronous warm-up), "
            f"{setup['repeats']} interleaved round{'s' if setup['repeats'] != 1 else ''}.")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def points_table(points: list[dict]) -> str:
    """One row per point: where it sits, the measured gain (range over rounds), and the model's pipe and gain."""
    lines = ["| codec | link | comm / compute | sync ms / iter | pipe ms / iter | gain (rounds' range) "
             "| model's pipe ms | model's gain | model's pipe error | wire ms, measured / the link alone |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        model = p["model"]
        error = (model["pipe_s"] - p["pipe_s"]) / p["pipe_s"]
        lines.append(f"| {p['codec']} | {p['bandwidth']} | {p['comm_over_compute']:.2f} | {_ms(p['sync_s'])} "
                     f"| {_ms(p['pipe_s'])} | {p['gain']:.2f}x ({p['gain_min']:.2f}-{p['gain_max']:.2f}) "
                     f"| {_ms(model['pipe_s'])} | {model['gain']:.2f}x | {100 * error:+.1f} % "
                     f"| {_ms(p['sync_parts']['wire_s'])} / {_ms(p['link_wire_s'])} |")
    return "\n".join(lines)


def _breakdowns(points: list[dict], shared_core: bool) -> str:
    rows, limits = [], {}
    for p in points:
        name = f"{p['codec']}, {p['bandwidth']}"
        sync, pipe = Breakdown(**p["sync_parts"]), Breakdown(**p["pipe_parts"])
        rows += [(f"{name}, sync", p["sync_s"], sync), (f"{name}, pipe", p["pipe_s"], pipe)]
        limits[f"{name}, sync"] = limits[f"{name}, pipe"] = sync.limit_s(shared_core, p["link_wire_s"])
    return breakdown_table(rows, limits)


def render(data: dict) -> str:
    """The whole report of a gain-curve result dict (with its ``provenance``)."""
    setup, points = data["setup"], data["points"]
    figure = data.get("figure")
    lines = [markdown_header(TITLE, data["provenance"]), setup_line(setup), ""]
    if figure:
        lines += [f"![gain against comm / compute]({figure})", ""]
    if not points:
        return "\n".join(lines + ["No point: no codec and link had both a sync and a pipe run.", ""])
    lines += ["## The points and the model's prediction of each", "", points_table(points), "",
              "comm / compute: the sync run's exchange (wire and CPU, its worker's job per step) over its compute + "
              "update (rank 0's trace, median over rounds). Gain: sync ms per iteration over pipe ms per iteration of "
              "the same round, median over rounds. The model (`experiments/harness/gain_curve.py`) predicts the pipe "
              "run from the sync run alone: its compute, update, exchange and the host work beyond them"
              + (", with the exchange's CPU on the training core (one core per node)" if setup["shared_core"] else "")
              + "; the curve in the figure holds each codec's inputs and moves the exchange. The last column checks "
              "the link: the measured wire wait beside the plain model's transfer time at the link's rate.", "",
              "## Where the time went (ms per step, rank 0, medians over rounds; limit from the sync run at the same "
              "codec and link, never below the link alone)", "", _breakdowns(points, setup["shared_core"]), ""]
    return "\n".join(lines)
