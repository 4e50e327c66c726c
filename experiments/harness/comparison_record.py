"""One tidy record per run of the comparison grid, from the run's per-rank metrics (``experiments.harness.results.Run``).

Every step counts the mean over its ranks (the average rank's step: in lockstep training every rank's step
times add up to the same wall-clock, so the mean is the step's period, where the slowest rank per step would add
the step's jitter); medians are over the steps from ``skip`` on (after the warm-up). Asynchronous workers are not in
lockstep: their split is the slowest worker's own steps (``experiments.harness.results.slowest_rank``), and their t_iter the
job's pace, that worker's mean (``Run.pace_s``). Periodic averaging (localsgd, diloco) sends the model once every
H steps and nothing in between, so a median is a local step's and hides the sync: its split is the mean over the
kept steps, the sync's cost spread over the period (what time to target pays). The
split: compute = forward + backward + batch loading (for ddp this holds DDP's allreduce, which runs inside
backward), update = the optimizer step, exposed communication = t_iter - compute - update (for ddp only what DDP
leaves after backward; for every mode it includes waiting for a slower rank). Accuracy against wall-clock time comes from the evaluation records (``wall``: seconds
since the reporting rank's trainer started); time to target is the ``wall`` of the first evaluation at or above
the target, None when no evaluation reached it.
"""
from __future__ import annotations

import statistics

from timing_model.modes import PERIODIC_MODES
from timing_model.recommend import choice_label
from experiments.harness.results import Run
from timing_model.run_metrics import ASYNC_MODES, iteration_over_ranks, slowest_rank

__all__ = ["MAX_CURVE_POINTS", "step_split", "curve", "time_to_target", "run_record"]

MAX_CURVE_POINTS = 60  # evaluations kept per run in the committed file (evenly thinned, last one always kept)


def _by_step(run: Run, skip: int) -> dict[int, dict]:
    """step -> rank -> its record (the last one when a resumed run wrote a step twice), steps from ``skip``."""
    out: dict[int, dict] = {}
    for record in run.steps:
        if record["step"] >= skip:
            out.setdefault(record["step"], {})[record.get("rank")] = record
    return out


def _num(record: dict, key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) else 0.0


def step_split(run: Run, skip: int) -> dict:
    """Medians over the kept steps (mean over ranks per step) of t_iter, compute, update and exposed communication,
    and of the bytes all ranks sent per step (asynchronous: the slowest worker's steps, and its mean t_iter;
    periodic averaging: means, module doc); raises ``ValueError`` when no step is left after ``skip``."""
    steps = _by_step(run, skip)
    if not steps:
        raise ValueError(f"{run.path}: no step records after step {skip}")
    iters, computes, updates, exposed, sent = [], [], [], [], []
    asynchronous = run.config.get("mode") in ASYNC_MODES
    slowest = slowest_rank(run.steps, skip) if asynchronous else None
    for step in sorted(steps):
        if asynchronous and slowest not in steps[step]:
            continue
        ranks = [steps[step][slowest]] if asynchronous else steps[step].values()
        mean = iteration_over_ranks(run.config.get("mode"))
        t_iter = mean(_num(r, "t_iter") for r in ranks)
        compute = mean(_num(r, "t_compute") + _num(r, "t_data") for r in ranks)
        update = mean(_num(r, "t_update") for r in ranks)
        iters.append(t_iter)
        computes.append(compute)
        updates.append(update)
        exposed.append(max(0.0, t_iter - compute - update))
        every = steps[step].values()  # bytes: what all ranks sent in this step
        if any(r.get("bytes_sent") is not None for r in every):
            sent.append(sum(_num(r, "bytes_sent") for r in every))
    periodic = run.config.get("mode") in PERIODIC_MODES
    med = statistics.fmean if periodic else statistics.median
    return {"steps_kept": len(iters), "t_iter_s": statistics.fmean(iters) if asynchronous else med(iters), "compute_s": med(computes), "update_s": med(updates),
            "exposed_comm_s": med(exposed), "t_iter_min_s": min(iters), "t_iter_max_s": max(iters),
            "bytes_per_iter": med(sent) if sent else None}


def curve(run: Run, max_points: int = MAX_CURVE_POINTS) -> list[dict]:
    """The evaluations as ``{step, wall_s, accuracy, loss}``, thinned evenly to ``max_points`` (last kept)."""
    points = [{"step": e.get("step"), "wall_s": e.get("wall"), "accuracy": e.get("accuracy"), "loss": e.get("loss")}
              for e in sorted(run.evals, key=lambda e: (e.get("wall") or 0.0))]
    if len(points) <= max_points:
        return points
    stride = len(points) / max_points
    kept = [points[int(i * stride)] for i in range(max_points - 1)]
    return kept + [points[-1]]


def time_to_target(points: list[dict], target: float, metric: str = "accuracy") -> float | None:
    """``wall_s`` of the first evaluation with accuracy >= ``target`` (``metric`` "loss": validation loss <=
    ``target``); None when none reached it."""
    for p in points:
        value = p.get(metric)
        reached = value is not None and (value <= target if metric == "loss" else value >= target)
        if reached and p["wall_s"] is not None:
            return float(p["wall_s"])
    return None


def run_record(run: Run, *, skip: int, target: float, metric: str = "accuracy") -> dict:
    """The tidy figures of one finished run (the caller adds the cell, variant, flags and paths); time to ``target``
    in ``metric`` (accuracy, or validation loss)."""
    cfg = run.config
    split = step_split(run, skip)
    workers = int(cfg.get("num_workers") or cfg.get("world_size") or len({r.get("rank") for r in run.steps}))
    batch = int(cfg.get("batch_size") or 0)
    points = curve(run)
    final = points[-1] if points else {}
    accuracy = run.final_accuracy
    steps_run = max(r["step"] for r in run.steps) + 1 if run.steps else 0
    reached_at = time_to_target(points, target, metric)
    return {"params": cfg.get("params"), "grad_bytes": cfg.get("grad_bytes"), "workers": workers,
            "world_size": cfg.get("world_size"), "batch_size": batch, "steps": steps_run, **split,
            "throughput_sps": workers * batch / split["t_iter_s"] if split["t_iter_s"] > 0 else None,
            "final_accuracy": accuracy, "final_loss": final.get("loss"),
            **({"target_loss": target} if metric == "loss" else {"target_accuracy": target}),
            "time_to_target_s": reached_at,
            "reached_target": accuracy is not None and reached_at is not None,
            "train_wall_s": run.summary.get("wall") or (final.get("wall_s") if final else None),
            "curve": points, **_auto_choice(run), **_auto_cost(run)}


def _auto_choice(run: Run) -> dict:
    """{"auto_choice": "width 2, q4 + error feedback"} for a run that chose (--width/--compression auto), else {}."""
    choice = run.summary.get("auto_choice")
    if not choice:
        return {}
    return {"auto_choice": choice_label(choice.get("width"), choice["compression"], bool(choice.get("error_feedback")))}


def _auto_cost(run: Run) -> dict:
    """{"auto_s": seconds} for a run whose step records hold auto's own time (``t_auto``, ``StepStats.t_auto_s``):
    each step's least over its ranks, summed over every step (a rank that reached one of auto's agreements first
    waited there for the last one, a wait that the synchronous exchange holds where auto measures nothing); else {}."""
    spent = [[float(r["t_auto"]) for r in ranks.values() if isinstance(r.get("t_auto"), (int, float))]
             for ranks in _by_step(run, 0).values()]
    return {"auto_s": sum(min(times) for times in spent if times)} if any(spent) else {}
