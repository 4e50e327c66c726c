"""Time to target of a run cut short (``comparison.py --steps N``), projected from the same seed's full runs on other
links (issue 39's AlexNet-like cells: at 100 Mbit/s the uncompressed and bf16 configurations take 3-5 s per step,
and running them to the target would cost more than the rest of the grid).

Why a projection holds: a fixed configuration computes the same steps whatever the link (the same seed's data order
and initial weights; the exchange's arithmetic does not depend on its speed), so it reaches the target at the same
step on every link. That is checked, not assumed: the short run's accuracy at each evaluation must equal the full
runs' at the same step, all but its last: that one is taken after the run's end flushed the steps in flight, so a
pipelined run's differs. The projection is the short run's wall clock at the last evaluation compared plus its
median time per iteration for each step more, up to the first step where the full runs reached the target.
"""
from __future__ import annotations

SAME = 1e-6  # accuracies this close count as the same evaluation (the records keep six digits)


def first_step_at(curve: list[dict], target: float) -> int | None:
    """The step of the first evaluation at or above ``target`` accuracy, None when none reached it."""
    return next((p["step"] for p in curve if p.get("accuracy") is not None and p["accuracy"] >= target), None)


def same_steps(short: list[dict], full: list[dict]) -> bool:
    """Whether every evaluation of ``short`` has one at the same step in ``full`` with the same accuracy."""
    at = {p["step"]: p.get("accuracy") for p in full}
    return bool(short) and all(p["step"] in at and at[p["step"]] is not None and p.get("accuracy") is not None
                               and abs(at[p["step"]] - p["accuracy"]) <= SAME for p in short)


def projected(short_run: dict, full_runs: list[dict]) -> dict:
    """``short_run``'s projected time to its target from ``full_runs`` (the same workload, variant and seed on other
    links): {"step": where the full runs reached it (None: none did), "from": their cells, "same": whether every
    full run's evaluations match the short run's, "seconds": the projection (None when no full run reached the
    target or the steps differ)}."""
    target, curve = short_run["target_accuracy"], (short_run.get("curve") or [])[:-1]  # the last: after the flush
    full = [r for r in full_runs if r.get("curve")]
    steps = {first_step_at(r["curve"], target) for r in full} - {None}
    same = bool(full) and all(same_steps(curve, r["curve"]) for r in full)
    out = {"step": min(steps) if steps else None, "from": [r["cell"] for r in full], "same": same, "seconds": None}
    if same and len(steps) == 1 and curve:
        last = curve[-1]
        out["seconds"] = last["wall_s"] + max(out["step"] - last["step"], 0) * short_run["t_iter_s"]
    return out
