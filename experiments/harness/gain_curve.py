"""Pipe-SGD's gain over synchronous training at the same codec against comm / compute: the measured points (one per
codec and link rate, from interleaved sync and pipe runs and their traces) and the timing model's curve over them,
the model predicting each pipe run from the synchronous run's own measurements.

Where a point sits: comm / compute is the sync run's exchange (its worker's job per step, wire and CPU) over its
training thread's compute + update (``breakdown.Breakdown``, rank 0's trace); its height, the gain, is the median
over rounds of each round's sync ms per iteration over pipe ms per iteration (the two ran back to back).

What the model is given (``model_inputs``): from the sync run, the compute, the update, the exchange and its CPU part,
and the host work its step holds beyond them (the sync iteration less compute, update and exchange, at least 0; the
hand-off, the data loading, the records). The exchange anchors the model's allreduce (``EmpiricalTerms.ring_anchor_s``:
the measured time replaces the α-β fit's), so the link enters through what its rate did to the sync run. Where a node
has one core, the exchange's CPU runs on the training core: the compute slow-down κ is that CPU over the training
side, and the pipe step is max(compute + update + host + exchange CPU, exchange) (``timing_model.modes.predict_pipe``);
with more cores per node κ = 0. The curve holds one codec's inputs (medians over its rates) and moves the exchange,
r × (compute + update) for r on a grid that starts where the wire time is 0 (the exchange's CPU alone).

Pure functions of run records (dicts, as the result JSON keeps them); no run, no torch.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace

from experiments.harness.breakdown import Breakdown, median_of
from timing_model.core.equations import pipe_speedup_vs_sync
from timing_model.predict import Scenario, predict

__all__ = ["ModelInputs", "model_inputs", "predicted", "link_wire_s", "place_points", "model_curve", "textbook_gain",
           "build"]

# The anchor replaces the fit's allreduce time whatever the rate, so the model's link rate only has to be finite
# (an unshaped link has no rate of its own); the measured exchange sets the time.
_NOMINAL_BPS = 1e9
CURVE_POINTS = 80  # samples of each model curve, evenly spaced in log(comm / compute)


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """What the model takes from one synchronous run (seconds per step) and the setup it ran in."""

    compute_s: float  # forward + backward on the training thread
    update_s: float  # the wrapped optimizer's update
    exchange_s: float  # the exchange worker's job per step: wire and CPU (the anchor)
    exchange_cpu_s: float  # of which not waiting on the wire
    host_s: float  # the sync step's training-thread work beyond compute, update and the exchange
    nodes: int
    grad_bytes: float
    compression: str
    shared_core: bool  # one core per node: the exchange's CPU runs on the training core

    @property
    def training_s(self) -> float:
        """Compute + update: the denominator of comm / compute."""
        return self.compute_s + self.update_s

    @property
    def comm_over_compute(self) -> float:
        return self.exchange_s / self.training_s


def model_inputs(sync_iteration_s: float, sync: Breakdown, *, nodes: int, grad_bytes: float, compression: str,
                 shared_core: bool) -> ModelInputs:
    """The model's inputs from a sync run's iteration and breakdown (module doc)."""
    host = max(0.0, sync_iteration_s - sync.compute_s - sync.update_s - sync.exchange_s)
    return ModelInputs(sync.compute_s, sync.update_s, sync.exchange_s, sync.exchange_cpu_s, host, nodes, grad_bytes,
                       compression, shared_core)


def _scenario(inputs: ModelInputs) -> Scenario:
    busy = inputs.training_s + inputs.host_s
    slowdown = inputs.exchange_cpu_s / busy if inputs.shared_core and busy > 0 else 0.0
    return Scenario.of(nodes=inputs.nodes, grad_bytes=inputs.grad_bytes, bandwidth_Bps=_NOMINAL_BPS / 8,
                       compression=inputs.compression, compute_s=inputs.compute_s, update_s=inputs.update_s, width=2,
                       ring_anchor_s=inputs.exchange_s, host_s=inputs.host_s, slowdown=slowdown)


def predicted(inputs: ModelInputs) -> tuple[float, float]:
    """The model's (sync, pipe at width 2) seconds per iteration from ``inputs``."""
    prediction = predict(_scenario(inputs), ("sync", "pipe"))
    return prediction.result("sync").iteration_s, prediction.result("pipe").iteration_s


def link_wire_s(nodes: int, grad_bytes: float, compression: str, bandwidth_bps: float | None) -> float | None:
    """What the link alone gives the allreduce, the plain model at the link's rate (no latency, a free codec): a
    check on the measured wire time; None for an unshaped link."""
    if bandwidth_bps is None:
        return None
    scenario = Scenario(nodes=nodes, grad_bytes=grad_bytes, bandwidth_Bps=bandwidth_bps / 8, compression=compression)
    return predict(scenario, ("sync",)).result("sync").comm_total_s


def _parts(run: dict) -> Breakdown:
    return Breakdown(**run["parts"])


def place_points(runs: list[dict], *, nodes: int, shared_core: bool) -> list[dict]:
    """One point per (codec, link) that has a sync and a pipe run in at least one round, in the runs' order.

    ``runs``: records ``{codec, bandwidth, bandwidth_bps, round, mode, iteration_s, grad_bytes, parts}`` (``parts``
    a ``Breakdown`` as a dict). A point: where it sits (comm / compute from the sync runs' median breakdown), the gain
    (median over rounds of sync / pipe, and its range), the medians of both modes, and the model's prediction."""
    cells: dict[tuple[str, str], dict[int, dict[str, dict]]] = {}
    for run in runs:
        cells.setdefault((run["codec"], run["bandwidth"]), {}).setdefault(run["round"], {})[run["mode"]] = run
    points = []
    for (codec, bandwidth), rounds in cells.items():
        pairs = [(r["sync"], r["pipe"]) for _, r in sorted(rounds.items()) if "sync" in r and "pipe" in r]
        if not pairs:
            continue
        gains = [s["iteration_s"] / p["iteration_s"] for s, p in pairs]
        sync_s = statistics.median(s["iteration_s"] for s, _ in pairs)
        sync_parts = median_of([_parts(s) for s, _ in pairs])
        pipe_parts = median_of([_parts(p) for _, p in pairs])
        first = pairs[0][0]
        inputs = model_inputs(sync_s, sync_parts, nodes=nodes, grad_bytes=first["grad_bytes"], compression=codec,
                              shared_core=shared_core)
        model_sync, model_pipe = predicted(inputs)
        points.append({
            "codec": codec, "bandwidth": bandwidth, "bandwidth_bps": first["bandwidth_bps"], "rounds": len(pairs),
            "comm_over_compute": inputs.comm_over_compute,
            "gain": statistics.median(gains), "gain_min": min(gains), "gain_max": max(gains),
            "sync_s": sync_s, "pipe_s": statistics.median(p["iteration_s"] for _, p in pairs),
            "sync_parts": asdict(sync_parts), "pipe_parts": asdict(pipe_parts),
            "link_wire_s": link_wire_s(nodes, first["grad_bytes"], codec, first["bandwidth_bps"]),
            "model": {"inputs": asdict(inputs), "sync_s": model_sync, "pipe_s": model_pipe,
                      "gain": model_sync / model_pipe},
        })
    return points


def _curve_inputs(points: list[dict]) -> ModelInputs:
    """One codec's model inputs, field by field the median over its points' (the exchange is replaced per sample)."""
    rows = [p["model"]["inputs"] for p in points]
    numeric = ("compute_s", "update_s", "exchange_s", "exchange_cpu_s", "host_s", "grad_bytes")
    return replace(ModelInputs(**rows[0]), **{name: statistics.median(r[name] for r in rows) for name in numeric})


def model_curve(points: list[dict], codec: str, span: tuple[float, float], samples: int = CURVE_POINTS) -> dict:
    """The model's gain against comm / compute for ``codec``'s inputs (module doc): ``{inputs, points: [[r, gain]]}``
    for r evenly spaced in log over ``span``, from no lower than the exchange's CPU alone (a wire time of 0)."""
    base = _curve_inputs([p for p in points if p["codec"] == codec])
    low = max(span[0], base.exchange_cpu_s / base.training_s)
    high = max(span[1], low)
    step = (math.log(high) - math.log(low)) / max(samples - 1, 1)
    curve = []
    for i in range(samples):
        ratio = math.exp(math.log(low) + i * step)
        sync_s, pipe_s = predicted(replace(base, exchange_s=ratio * base.training_s))
        curve.append([ratio, sync_s / pipe_s])
    return {"inputs": asdict(base), "points": curve}


def textbook_gain(ratio: float) -> float:
    """The paper's ideal at comm / compute = ratio: (1 + r) / max(1, r), compute and communication on separate
    resources and nothing else on the step (``timing_model.core.equations.pipe_speedup_vs_sync``)."""
    return pipe_speedup_vs_sync(1.0, ratio)


def build(runs: list[dict], *, nodes: int, shared_core: bool, margin: float = 2.0) -> dict:
    """``{points, curves}`` of the result: the points (``place_points``) and per codec the model's curve over the
    points' range of comm / compute widened by ``margin`` each way."""
    points = place_points(runs, nodes=nodes, shared_core=shared_core)
    if not points:
        return {"points": [], "curves": {}}
    ratios = [p["comm_over_compute"] for p in points]
    span = (min(ratios) / margin, max(ratios) * margin)
    codecs = dict.fromkeys(p["codec"] for p in points)
    return {"points": points, "curves": {codec: model_curve(points, codec, span) for codec in codecs}}
