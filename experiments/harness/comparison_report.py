"""The comparison grid's printed report, from runs.json alone: per cell the iteration split, throughput, bytes
on the wire, accuracy and time to target of every variant with the timing model's prediction; the speedup tables
(``speedup``); the model's error summary and whether it keeps the measured order of the modes (``model_ordering``); and the whole grid's wall-time estimate (``comparison_store``)."""
from __future__ import annotations

from experiments.harness.breakdown import Breakdown, markdown as breakdown_markdown
from experiments.harness.model_ordering import ordering_table
from experiments.harness.speedup import markdown_tables
from experiments.harness.variants import SAME_CODEC_SYNC
from timing_model.errors import error_summary, summary_line

__all__ = ["ms", "cell_tables", "where_the_time_went", "model_errors", "model_summary", "estimate_table", "report"]


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def cell_tables(data: dict) -> str:
    """One table per cell: every run's split (ms), throughput, MB per iteration, accuracy, time to target, model."""
    lines = []
    cells: dict[str, list[dict]] = {}
    for r in data["runs"]:
        cells.setdefault(r["cell"], []).append(r)
    for cell, runs in cells.items():
        info = data["cells"].get(cell, {})
        params = next((r.get("params") for r in runs if r.get("params")), None)
        tcp_mbps = info.get("tcp_bps") and info["tcp_bps"] / 1e6
        lines += [f"### {cell}: {_fmt(params, ',')} params, TCP {_fmt(tcp_mbps, '.0f')} Mbit/s measured, "
                  f"{_target(runs, data['config'])}", "",
                  "| variant | ms / iter | compute | exposed comm | update | samples/s | MB on wire / iter | "
                  "final acc | to target s | steps | model ms | model error |", "|---" * 12 + "|"]
        for r in runs:
            if r.get("status") != "ok":
                lines.append(f"| {r['variant']} | FAILED: {r.get('reason')} (log {r.get('log', '-')}) |" + " |" * 10)
                continue
            m = r.get("model") or {}
            mb = r.get("bytes_per_iter")
            lines.append(f"| {r['variant']} | {ms(r['t_iter_s'])} | {ms(r['compute_s'])} | {ms(r['exposed_comm_s'])} "
                         f"| {ms(r['update_s'])} | {_fmt(r.get('throughput_sps'), '.0f')} "
                         f"| {_fmt(mb and mb / 1e6, '.3f')} | {_fmt(r.get('final_accuracy'), '.3f')} "
                         f"| {_fmt(r.get('time_to_target_s'), '.1f')} | {r.get('steps')} "
                         f"| {ms(m.get('predicted_s'))} | {_fmt(m.get('error') and 100 * m['error'], '+.1f')}"
                         f"{' %' if m else (' ' + r.get('model_note', '')) } |")
        lines.append("")
        lines += where_the_time_went(runs, info)
    lines += ["compute = forward + backward + batch loading (for ddp it holds DDP's allreduce, which runs inside "
              "backward); exposed comm = iteration - compute - update; medians over the steps after the warm-up of "
              "each step's mean over ranks (for the iteration: the period the ranks step at). To target: seconds since the trainer started until the first evaluation at "
              "or above the target ('-': not reached within the run's steps).", ""]
    return "\n".join(lines)


def where_the_time_went(runs: list[dict], info: dict) -> list[str]:
    """A cell's breakdown table (``experiments.harness.breakdown``) of its traced runs, each Pipe-SGD run's limit
    taken from the synchronous run at its codec; no lines when nothing was traced."""
    parts = {r["variant"]: (r["t_iter_s"], Breakdown(**r["breakdown"])) for r in runs
             if r.get("status") == "ok" and r.get("breakdown")}
    if not parts:
        return []
    shared_core = info.get("cores_per_node", 0) <= 1  # nodes sharing the host's cores, or one core each
    links = {r["variant"]: link_s(r, info) for r in runs if r.get("status") == "ok"}
    limits = {name: parts[twin][1].limit_s(shared_core, links.get(twin)) for name in parts
              for twin in [SAME_CODEC_SYNC.get(name, name)] if twin in parts}
    # Records written before the trace had "wait" spans have no wait_s: their step() less the update holds the wait.
    wait_unrecorded = frozenset(r["variant"] for r in runs if r.get("status") == "ok" and r.get("breakdown")
                                and "wait_s" not in r["breakdown"])
    return ["Where the time went, ms per step (rank 0, the traced steps): the limit is what a perfect overlap "
            "would give from the synchronous run at the same codec (its compute and update, the exchange's CPU "
            "counted on the training side where a node's core runs both, or the exchange if longer, and never less "
            "than each node's bytes at the link's measured TCP rate: a busy link earns no token-bucket credit); "
            "efficiency = limit / measured.", "",
            *breakdown_markdown([(name, t, b) for name, (t, b) in parts.items()], limits,
                                wait_unrecorded).splitlines(), ""]


def link_s(run: dict, info: dict) -> float | None:
    """A node's share of the bytes a step of ``run`` sent, at the cell's measured TCP rate: the least time its link
    can carry them in; None where the rate or the bytes are unknown, or ranks share a node (their traffic between
    them is not on the link)."""
    sent, rate = run.get("bytes_per_iter"), info.get("tcp_bps")
    nodes = info.get("nodes") or run.get("nodes")
    if not sent or not rate or not nodes or run.get("workers", nodes) != nodes:
        return None
    return sent / nodes * 8 / rate


def model_errors(data: dict) -> list[dict]:
    """The runs the model predicted: ``{cell, variant, measured_s, predicted_s, error}``."""
    return [{"cell": r["cell"], "variant": r["variant"], "bandwidth": r["bandwidth"], "workload": r["workload"],
             "measured_s": r["model"]["measured_s"], "predicted_s": r["model"]["predicted_s"],
             "error": r["model"]["error"]} for r in data["runs"] if r.get("status") == "ok" and r.get("model")]


def model_summary(data: dict, flag: float = 0.10) -> dict:
    """``timing_model.errors.error_summary`` of the model's predictions, with how many lie over ``flag``."""
    return error_summary([p["error"] for p in model_errors(data)], flag)


def estimate_table(total_s: float, rows: list[dict]) -> str:
    """The estimate's summary and the runs nothing measured."""
    unknown = [r for r in rows if r["seconds"] is None]
    by_source: dict[str, int] = {}
    for r in rows:
        by_source[r["source"]] = by_source.get(r["source"], 0) + 1
    lines = [f"Estimated wall time of the grid: {total_s / 3600:.1f} h ({total_s / 60:.0f} min) for {len(rows)} runs; "
             "sources: " + ", ".join(f"{n} {s}" for s, n in by_source.items())]
    if unknown:
        cells = dict.fromkeys(r["cell"] for r in unknown)
        lines.append(f"not counted ({len(unknown)} runs; nothing of their workload measured): cells {', '.join(cells)}")
    return "\n".join(lines) + "\n"


def report(data: dict) -> str:
    """The whole printed report of a runs.json."""
    stats = model_summary(data)
    failed = [r for r in data["runs"] if r.get("status") != "ok"]
    nodes = data.get("config", {}).get("nodes", 4)
    lines = [f"# {nodes}-node comparison: {len(data['runs']) - len(failed)} runs ok, {len(failed)} failed "
             f"(provenance: {data['provenance']['command']}, {data['provenance']['date']})", "",
             cell_tables(data), markdown_tables(data["runs"])]
    if stats["runs"]:
        lines.append(f"Timing model, {summary_line(stats)}\n{stats['over_flag']} runs over {100 * stats['flag']:.0f} %\n")
        lines.append(ordering_table(data["runs"]))
    return "\n".join(lines)


def _target(runs: list[dict], config: dict) -> str:
    """A cell's time-to-target goal as its runs recorded it (a workload's own), else the grid's."""
    for key, words in (("target_loss", "target validation loss"), ("target_accuracy", "target accuracy")):
        value = next((r[key] for r in runs if r.get(key) is not None), None)
        if value is not None:
            return f"{words} {value}"
    return f"target accuracy {config.get('target_accuracy')}"
