"""Where an iteration's time goes, read from ``pipesgd-train --trace`` files: per variant, the training thread's
compute (forward and backward) and ``step()`` time (the wrapped optimizer's update and the wait for the exchange
apart: what is left is the wrapper's own work on that thread), the exchange's wire time
and CPU time on its worker, and the overlap efficiency, limit / measured. Beside the compute's and the exchange's wall
time, each thread's own CPU time in it (``pipesgd.runlog.trace.span(cpu=True)``): where the two differ, the thread
waited, for the wire or for a core another thread held.

The limit is what a perfect overlap would give from the synchronous run at the same codec: the longer of the
training thread's own work (compute plus the step's update) and the exchange, with the exchange's CPU counted on the
training side too where the two share the node's core (``shared_core``), since one core runs one of them at a time,
and never below the exchange's bytes at the link's sustained rate (``link_s``): a shaper's token bucket (tc tbf's
burst) lets the bytes that follow idle time leave faster than the rate, credit that a link kept busy never earns.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass

from pipesgd.runlog.trace import trace_path


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Per-step means (seconds) of one run's rank, over the traced steps."""

    compute_s: float  # forward + backward on the training thread ("compute" spans)
    step_s: float  # the training thread inside opt.step() ("opt.step" spans)
    update_s: float  # of which the wrapped optimizer's update ("update" spans on the training thread)
    exchange_s: float  # the worker's job per step (its "comm" spans)
    wire_s: float  # of which waiting on the wire ("wire_wait" phases inside the job)
    # The threads' own CPU time inside those spans (their "cpu_us"; 0 in traces made before it was recorded): below
    # the wall time by what the thread spent waiting, for the wire or for a core that ran another thread
    compute_thread_cpu_s: float = 0.0
    exchange_thread_cpu_s: float = 0.0
    # Inside step(): waiting for the due exchange ("wait" spans: the communication the overlap did not hide), and the
    # training thread's CPU in the whole of step() (0 in traces made before they were recorded)
    wait_s: float = 0.0
    step_thread_cpu_s: float = 0.0

    @property
    def exchange_cpu_s(self) -> float:
        return max(self.exchange_s - self.wire_s, 0.0)

    @property
    def step_own_work_s(self) -> float:
        """The wrapper's own work in ``step()``: neither the wrapped optimizer's update nor the wait."""
        return max(self.step_s - self.update_s - self.wait_s, 0.0)

    def limit_s(self, shared_core: bool, link_s: float | None = None) -> float:
        """The iteration a perfect overlap of these parts would run at (module doc); ``link_s``: the exchange's
        bytes at the link's sustained rate, None where the link has no rate (unshaped)."""
        training = self.compute_s + self.update_s + (self.exchange_cpu_s if shared_core else 0.0)
        return max(training, self.exchange_s, link_s or 0.0)


def read_breakdown(path: str) -> Breakdown:
    """The per-step means of one rank's trace file (the traced steps only)."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]

    def per_step(name: str, thread: str, cat: str | None = None) -> float:
        chosen = [e for e in spans if e["name"] == name and threads.get(e["tid"]) == thread
                  and (cat is None or e.get("cat") == cat)]
        steps = {e.get("args", {}).get("step") for e in spans if threads.get(e["tid"]) == "main"
                 and e["name"] == "compute"}
        return sum(e["dur"] for e in chosen) / 1e6 / max(len(steps), 1)

    jobs = [e for e in spans if threads.get(e["tid"]) == "comm" and e.get("cat") == "comm"]
    steps = max(len({e.get("args", {}).get("step") for e in jobs}), 1)
    computes = [e for e in spans if e["name"] == "compute" and threads.get(e["tid"]) == "main"]
    step_spans = [e for e in spans if e["name"] == "opt.step" and threads.get(e["tid"]) == "main"]

    def cpu(chosen: list[dict]) -> float:
        return sum(e.get("args", {}).get("cpu_us", 0.0) for e in chosen) / 1e6

    return Breakdown(compute_s=per_step("compute", "main"), step_s=per_step("opt.step", "main"),
                     update_s=per_step("update", "main"), exchange_s=sum(e["dur"] for e in jobs) / 1e6 / steps,
                     wire_s=per_step("wire_wait", "comm", "phase"),
                     compute_thread_cpu_s=cpu(computes) / max(len(computes), 1),
                     exchange_thread_cpu_s=cpu(jobs) / steps, wait_s=per_step("wait", "main", "wait"),
                     step_thread_cpu_s=cpu(step_spans) / max(len(computes), 1))


def trace_file(metrics: str) -> str:
    """The ``--trace`` path of a run whose metrics file is ``X.jsonl``: ``X.trace.json`` (each rank writes its own
    file beside it, ``pipesgd.runlog.trace.trace_path``)."""
    return metrics.removesuffix(".jsonl") + ".trace.json"


def traced(flags: list[str]) -> bool:
    """Whether a run with these ``pipesgd-train`` flags has the spans a breakdown reads: the wrapper's exchange
    worker runs in Pipe-SGD and synchronous AllReduce (width 1), not in DDP or the parameter server."""
    return any(a == "--mode" and b in ("pipe", "sync") for a, b in zip(flags, flags[1:]))


def breakdown_record(metrics: str, world_size: int) -> dict | None:
    """Rank 0's breakdown of a traced run as a dict of seconds (the fields of ``Breakdown``), None when the run
    has no trace or its trace has no traced step."""
    path = trace_path(trace_file(metrics), 0, world_size)
    if not os.path.exists(path):
        return None
    parts = read_breakdown(path)
    return None if parts.compute_s == 0.0 else {name: getattr(parts, name) for name in Breakdown.__slots__}


def median_breakdown(paths: list[str]) -> Breakdown:
    """Field by field, the median over several ranks' or sittings' breakdowns (their trace files)."""
    return median_of([read_breakdown(p) for p in paths])


def median_of(parts: list[Breakdown]) -> Breakdown:
    """Field by field, the median of breakdowns already read."""
    return Breakdown(*(statistics.median(getattr(b, name) for b in parts) for name in Breakdown.__slots__))


def markdown(rows: list[tuple[str, float, Breakdown]], limits: dict[str, float],
             wait_unrecorded: frozenset[str] = frozenset()) -> str:
    """A table: variant, ms per iteration, each part, the limit and the efficiency (limit / measured).

    ``wait_unrecorded``: the variants whose traces predate the "wait" spans: their ``step()`` time less the update
    holds the wait too, so their own-work cell says so and their wait cell is empty (a 0 there would be a claim).
    """
    head = ("| variant | ms / iteration | compute (its thread's CPU) | step(): the wrapper's own work | update "
            "| waited for the exchange | exchange | of which wire | exchange CPU (its thread's CPU) | limit "
            "| overlap efficiency |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]

    def with_cpu(wall_s: float, cpu_s: float) -> str:
        return f"{1e3 * wall_s:.1f}" + (f" ({1e3 * cpu_s:.1f})" if cpu_s else "")

    for name, iteration_s, b in rows:
        limit = limits.get(name)
        efficiency = f"{limit / iteration_s:.2f}" if limit else ""
        own = f"{1e3 * b.step_own_work_s:.1f}" + (" (the wait in it)" if name in wait_unrecorded else "")
        waited = "-" if name in wait_unrecorded else f"{1e3 * b.wait_s:.1f}"
        lines.append(f"| {name} | {1e3 * iteration_s:.1f} | {with_cpu(b.compute_s, b.compute_thread_cpu_s)} "
                     f"| {own} | {1e3 * b.update_s:.1f} | {waited} | {1e3 * b.exchange_s:.1f} "
                     f"| {1e3 * b.wire_s:.1f} | {with_cpu(b.exchange_cpu_s, b.exchange_thread_cpu_s)} "
                     f"| {f'{1e3 * limit:.1f}' if limit else ''} | {efficiency} |")
    return "\n".join(lines)
