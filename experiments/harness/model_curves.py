"""Timing-model curves from the comparison's committed result (issue 12): the predicted speedup of Pipe-SGD over
synchronous AllReduce against link bandwidth and against the number of nodes, per workload, with this machine's
host terms (4 nodes sharing 2 cores: compute slows beside the ring by κ, the ring beside compute by κc) and with
each node on its own cores (κ = κc = lockstep = 0, what a real cluster gives).

Each workload's curve starts from its 1 Gbit/s cell: that cell's embedded calibration (network fit, codec speeds,
host terms) and its sync run's measured compute, update and buffer sync (``runs.json`` keeps them with every
prediction), then moves one axis. The anchor (the allreduce timed at that cell's size, bandwidth and node count)
does not carry to other bandwidths or node counts, so the curves use the fit alone. Reads only the result dict.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace

__all__ = ["BANDWIDTHS_BPS", "NODES", "speedup_curves", "plot_speedup_curves"]

BANDWIDTHS_BPS = (1e7, 3e7, 1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11)  # link rates, bits/s
NODES = (2, 4, 8, 16, 32, 64)


def _base_scenario(data: dict, cell: str):
    """(Scenario of the cell's sync run with the cell's calibration, anchor off) or None when not predictable."""
    from timing_model.calibration import read_calibration
    from timing_model.validation import RunRecord, scenario_for

    embedded = data["cells"].get(cell, {}).get("calibration")
    run = next((r for r in data["runs"] if r["cell"] == cell and r["variant"] == "sync" and r.get("model")), None)
    if not embedded or run is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(embedded, handle)
    try:
        cal = read_calibration(handle.name)
    finally:
        os.unlink(handle.name)
    inputs = run["model"]["inputs"]
    record = RunRecord("sync", inputs["config"], "sync", inputs["nodes"], inputs["grad_bytes"],
                       (run["model"]["measured_s"],), (inputs["compute_s"],), (inputs["update_s"],),
                       (inputs.get("buffers_s", 0.0),), (inputs.get("host_s", 0.0),))
    return scenario_for(record, cal).with_changes(ring_anchor_s=0.0)


def _speedups(scenario) -> dict[str, float]:
    """Pipe-SGD (width 2) over sync, with the scenario's host terms ("shared") and with none ("own cores")."""
    from timing_model.predict import predict

    out = {}
    own = scenario.with_changes(slowdown=0.0, comm_slowdown=0.0, lockstep_s=0.0)  # nothing contends for a core
    for host, s in (("shared", scenario), ("own", own)):
        pipe = predict(replace(s, width=2), ("pipe",)).result("pipe").iteration_s
        out[host] = predict(s, ("sync",)).result("sync").iteration_s / pipe
    return out


def speedup_curves(data: dict, bandwidth: str = "1gbit") -> dict[str, dict]:
    """workload -> {"bandwidth": [(bits/s, {shared, own})], "nodes": [(p, {...})]}: speedups over sync, for every
    workload whose ``bandwidth`` cell has a calibration and a predicted sync run."""
    curves = {}
    for workload in dict.fromkeys(r["workload"] for r in data["runs"]):
        base = _base_scenario(data, f"{workload}-{bandwidth}")
        if base is None:
            continue
        curves[workload] = {
            "bandwidth": [(bps, _speedups(replace(base, bandwidth_Bps=bps / 8))) for bps in BANDWIDTHS_BPS],
            "nodes": [(p, _speedups(replace(base, nodes=p))) for p in NODES],
        }
    return curves


def plot_speedup_curves(curves: dict[str, dict], axes) -> None:
    """Two panels (``axes``: a pair): predicted speedup of Pipe-SGD over sync against bandwidth and against nodes,
    solid with this machine's host terms, dashed with a node's own cores, one colour per workload."""
    left, right = axes
    for index, (workload, curve) in enumerate(curves.items()):
        colour = f"C{index}"
        for key, style in (("shared", "-"), ("own", "--")):
            label = f"{workload}, {'2 shared cores' if key == 'shared' else 'own cores per node'}"
            left.plot([b / 1e9 for b, _ in curve["bandwidth"]], [s[key] for _, s in curve["bandwidth"]], style,
                      color=colour, marker="o", ms=3, label=label)
            right.plot([p for p, _ in curve["nodes"]], [s[key] for _, s in curve["nodes"]], style, color=colour,
                       marker="o", ms=3, label=label)
    left.set_xscale("log")
    left.set_xlabel("link bandwidth, Gbit/s (4 nodes)")
    right.set_xscale("log", base=2)
    right.set_xlabel("nodes (1 Gbit/s)")
    for ax in axes:
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("predicted speedup of Pipe-SGD over sync")
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    left.set_title("against bandwidth")
    right.set_title("against nodes")
