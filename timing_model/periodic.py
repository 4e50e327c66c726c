"""Periodic averaging beside ``recommend``'s per-step choice: when no per-step all-reduce hides on the link, whether
pipesgd-train's ``--mode localsgd`` or ``--mode diloco`` (``modes.predict_periodic``) is predicted faster per
iteration, by the margin a wider pipeline needs, and the crossover: the link rate (or, with a calibration, whose fit
fixes the link, the compute time) below which it is. The crossover is found on the model itself, by doubling or
halving from the given value to a bracket and bisecting it; no fitted constant. It changes the algorithm, so the
answer carries ``CAVEAT``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

from .modes import ModeResult

__all__ = ["AXES", "CAVEAT", "Periodic", "alternative", "crossover"]

# the scenario field the crossover moves along: the link without a calibration, the compute with one (its fit
# replaces the link in every prediction, so only the compute side can move the ratio of the two)
AXES = ("bandwidth_Bps", "compute_s")
CAVEAT = ("it changes the algorithm: between syncs each rank steps on its own gradient, so a step learns less than "
          "one on the averaged gradient and time to a target loss is not time per iteration (DiLoCo, arXiv "
          "2311.08105): compare the loss before switching")
SEARCH_STEPS = 40  # doublings (or halvings) tried from the given value before the search gives up
TOLERANCE = 1e-6  # the bisection stops when its bracket's ends are this close, relatively


@dataclass(frozen=True, slots=True)
class Periodic:
    """Periodic averaging's prediction beside the fastest per-step candidate (seconds), and the crossover."""

    mode: str  # "localsgd" or "diloco", as pipesgd-train's --mode
    sync_every: int  # H
    sync_delay: int  # τ (diloco)
    iteration_s: float
    exposed_s: float  # per iteration: what the sync's all-reduce leaves exposed, over H
    sync_s: float  # one sync's full-precision all-reduce of the model
    per_step_s: float  # the fastest per-step candidate's iteration
    margin: float  # named only when per_step_s >= margin · iteration_s
    named: bool
    crossover_axis: str  # ``AXES``: the scenario field below whose ``crossover`` value it is named
    crossover: float | None  # math.inf: named at every value tried upwards; None: at none tried downwards
    crossover_ratio: float | None  # one sync's all-reduce over compute + update, at the crossover
    caveat: str = CAVEAT

    @property
    def flags(self) -> str:
        """The trainer's flags: ``--mode diloco --sync-every 16`` (and ``--sync-delay`` where it is not 0)."""
        delay = f" --sync-delay {self.sync_delay}" if self.sync_delay else ""
        return f"--mode {self.mode} --sync-every {self.sync_every}{delay}"

    def as_dict(self) -> dict:
        out = asdict(self)
        if out["crossover"] == math.inf:  # JSON has no infinity
            out["crossover"] = "inf"
        return out


def crossover(named_at: Callable[[float], bool], start: float) -> float | None:
    """The value of a positive axis below which ``named_at`` holds and above which it does not: from ``start``
    doubling (where it holds) or halving (where not) to a bracket, then bisecting it in log space. math.inf where it
    holds at every value tried upwards, None where it holds at none tried downwards."""
    if not start > 0:
        raise ValueError(f"the crossover search starts at a positive value, got {start!r}")
    lo = hi = start
    if named_at(start):
        for _ in range(SEARCH_STEPS):
            hi *= 2
            if not named_at(hi):
                break
            lo = hi
        else:
            return math.inf
    else:
        for _ in range(SEARCH_STEPS):
            lo /= 2
            if named_at(lo):
                break
            hi = lo
        else:
            return None
    while hi / lo > 1 + TOLERANCE:
        mid = math.sqrt(lo * hi)
        if named_at(mid):
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def alternative(scenario, predict_periodic: Callable[..., ModeResult], fastest_per_step: Callable[..., float],
                margin: float, axis: str = "bandwidth_Bps") -> Periodic:
    """Periodic averaging at ``scenario``'s ``sync_every`` and ``sync_delay``: ``predict_periodic(scenario)`` its
    prediction, ``fastest_per_step(scenario)`` the fastest per-step candidate's iteration (seconds), both for any
    scenario the crossover search moves ``axis`` to; named where the per-step one is at least ``margin`` times
    slower."""
    if axis not in AXES:
        raise ValueError(f"unknown crossover axis {axis!r}; valid: {', '.join(AXES)}")

    def named_at(value: float) -> bool:
        case = scenario.with_changes(**{axis: value})
        return fastest_per_step(case) >= margin * predict_periodic(case).iteration_s

    here = predict_periodic(scenario)
    per_step = fastest_per_step(scenario)
    start = getattr(scenario, axis)
    at = crossover(named_at, start) if start > 0 else None
    ratio = None
    if at is not None and math.isfinite(at):
        there = predict_periodic(scenario.with_changes(**{axis: at}))
        step = there.compute_s + there.straggler_s + there.update_s
        ratio = there.comm_total_s * scenario.sync_every / step if step > 0 else math.inf
    return Periodic(here.mode, scenario.sync_every, scenario.sync_delay if here.mode == "diloco" else 0,
                    here.iteration_s, here.exposed_comm_s, here.comm_total_s * scenario.sync_every, per_step, margin,
                    per_step >= margin * here.iteration_s, axis, at, ratio)
