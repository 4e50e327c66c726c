"""The timeline experiment (the paper's Figure 1 from measurements): run PS (async), decentralized sync, DDP and
Pipe-SGD with ``pipesgd-train --trace`` on one workload, and trim the per-rank traces to the spans a timeline
figure needs. ``experiments/timeline.py`` drives it; ``timeline_plot`` draws the result.

Each run traces all its steps; ``trim`` keeps one wall-clock interval common to all ranks: from the moment the
last rank starts its first figure step (after the warm-up) for ``traced`` iterations of the slowest rank (ranks
of ps-async drift apart, so a window in steps would show each rank at another time). A trimmed result holds, per
scheme, spans ``[rank, row, name, kind, start_ms, dur_ms]`` clipped to that interval, in ms from its start.
Kinds: compute (forward + backward), comm (work on the wire: an exchange job, a DDP bucket's comm hook, a PS
push), wait (the training thread blocked on communication), update (optimizer step), server (a parameter server
receiving, applying, sending) and step (the rest of ``opt.step()``: hand-off, buffer sync; drawn behind).
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from experiments.harness.loopback_cluster import LoopbackCluster
from experiments.harness.variants import trainer_flags
from pipesgd.runlog.trace import trace_path

__all__ = ["SCHEMES", "KINDS", "run_scheme", "trim", "build_result", "loopback_runner", "overlap_summary"]

SCHEMES = ("ps-async", "sync", "ddp", "pipe")  # variant names (experiments.harness.variants), in figure order
KINDS = ("compute", "comm", "wait", "update", "server", "step")  # the trace categories the figure draws
# Left out: per-phase detail (codec, wire wait: Perfetto shows them; the figure's bars would be too thin), data
# slicing and eval.

Runner = Callable[[list[str], str], int]  # (pipesgd-train argv, log path) -> exit code


def loopback_runner(ranks: int, timeout_s: float) -> Runner:
    """Run ``ranks`` local processes under torchrun (no root, no shaping): the quick profile."""
    cluster = LoopbackCluster(ranks)

    def run(argv: list[str], log_path: str) -> int:
        with open(log_path, "a") as log:
            return cluster.run(argv, timeout_s=timeout_s, out=log, err=log)

    return run


def run_scheme(runner: Runner, scheme: str, workload: list[str], total_steps: int, out_dir: str) -> str:
    """Train ``scheme`` on ``workload`` for ``total_steps`` steps, all traced; the trace path (per-rank files
    ``.rankN.json``). A failed run raises ``RuntimeError`` naming its log."""
    path = os.path.join(out_dir, f"{scheme}.json")
    log = os.path.join(out_dir, "timeline.log")
    argv = ["pipesgd-train", *trainer_flags(scheme), *workload, "--steps", str(total_steps), "--eval-every", "0",
            "--trace", path, "--trace-steps", f"0:{total_steps}", "--metrics", os.path.join(out_dir, f"{scheme}.jsonl")]
    print(f"[timeline] {scheme}: {' '.join(argv)}", file=sys.stderr, flush=True)
    rc = runner(argv, log)
    if rc != 0:
        raise RuntimeError(f"{scheme} failed with exit code {rc}; see {log}")
    return path


def trim(trace_file: str, world_size: int, first_step: int, traced: int) -> list[list]:
    """The figure's spans of one traced run (all ranks, all rows) in the interval the module docstring defines,
    clipped to it, times in ms from its start."""
    raw, starts, periods = [], [], []
    for rank in range(world_size):
        path = trace_path(trace_file, rank, world_size)
        with open(path) as handle:
            events = json.load(handle)["traceEvents"]
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
        mine = [(rank, rows[e["tid"]], e["name"], e["cat"], e["ts"], e["dur"], e.get("args", {}))
                for e in events if e["ph"] == "X" and e.get("cat") in KINDS]
        computes = sorted(ts for *_, cat, ts, _, args in mine if cat == "compute" and args.get("step", -1) >= first_step)
        if len(computes) < 2:
            raise ValueError(f"{path}: fewer than 2 traced compute spans from step {first_step}")
        starts.append(computes[0])
        periods.append(sorted(b - a for a, b in zip(computes, computes[1:]))[(len(computes) - 2) // 2])
        raw += mine
    start = max(starts)
    end = min(start + traced * max(periods), max(ts + dur for *_, ts, dur, _ in raw))
    kept = [(rank, row, name, kind, max(ts, start), min(ts + dur, end))
            for rank, row, name, kind, ts, dur, _ in raw if ts < end and ts + dur > start]
    return [[rank, row, name, kind, round((a - start) / 1e3, 3), round((b - a) / 1e3, 3)]
            for rank, row, name, kind, a, b in sorted(kept, key=lambda r: (r[0], r[4]))]


def _median_ms(metrics_base: str, field: str, skip: int, world_size: int) -> float | None:
    """The slowest worker's median of ``field`` (seconds) over its step records from ``skip`` on, in ms (ps-async
    workers run at different speeds: the co-located one never waits on the network)."""
    medians = []
    for rank in range(world_size):
        path = metrics_base.replace(".jsonl", f".rank{rank}.jsonl")
        with open(path) as handle:
            values = sorted(r[field] for r in map(json.loads, handle) if r.get("type") == "step" and r["step"] >= skip)
        if values:
            medians.append(values[len(values) // 2])
    return round(1e3 * max(medians), 3) if medians else None


def build_result(traces: dict[str, str], world_size: int, first_step: int, traced: int, setup: dict) -> dict:
    """The committed result: the setup, per scheme its trimmed spans and the slowest worker's median step times."""
    schemes = {}
    for scheme, path in traces.items():
        metrics = path.replace(".json", ".jsonl")
        schemes[scheme] = {
            "flags": trainer_flags(scheme),
            "median_ms": {f: _median_ms(metrics, f, first_step, world_size)
                          for f in ("t_iter", "t_compute", "t_wait", "t_update")},
            "spans": trim(path, world_size, first_step, traced),
        }
    return {"setup": dict(setup, world_size=world_size, first_step=first_step, iterations=traced), "columns":
            ["rank", "row", "name", "kind", "start_ms", "dur_ms"], "schemes": schemes}


def _covered(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def overlap_summary(result: dict) -> dict[str, dict[str, float]]:
    """Per scheme, from the result's spans only, summed over workers: ms of communication (comm and server
    rows' work) and the share of it that ran while the same worker computed, and the share of the interval
    each worker's training thread spent blocked (wait)."""
    out = {}
    for scheme, data in result["schemes"].items():
        spans = data["spans"]
        ranks = sorted({s[0] for s in spans})
        length = max((s[4] + s[5] for s in spans), default=0.0)
        comm_ms = hidden_ms = wait_ms = 0.0
        for rank in ranks:
            mine = [s for s in spans if s[0] == rank]
            compute = _covered([(s[4], s[4] + s[5]) for s in mine if s[3] == "compute"])
            comm = _covered([(s[4], s[4] + s[5]) for s in mine if s[3] in ("comm", "server")])
            comm_ms += sum(b - a for a, b in comm)
            hidden_ms += sum(max(0.0, min(b, d) - max(a, c)) for a, b in comm for c, d in compute)
            wait_ms += sum(b - a for a, b in _covered([(s[4], s[4] + s[5]) for s in mine if s[3] == "wait"]))
        out[scheme] = {"comm_ms": round(comm_ms, 1), "comm_overlapping_compute": round(hidden_ms / comm_ms, 3)
                       if comm_ms else 0.0, "blocked_share": round(wait_ms / (length * len(ranks)), 3) if ranks
                       and length else 0.0}
    return out
