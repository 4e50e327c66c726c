"""The anchor: the calibration's timing of the trainer's allreduce alone at the workload's very size, in place of
the α-β-γ fit's prediction there.

Why it exists: the fit is a least-squares line over the calibration's sizes and can miss one size by far more than
the rest of the model's error on fast links, where a small gradient is latency-bound (experiments/RESULTS.md);
the anchor is measured by ``calibrate``, never by the runs it predicts. An anchor of 0 leaves the core's cost as
it is.
"""
from __future__ import annotations

from ..core.costs import CommCost

__all__ = ["anchored"]


def anchored(cost: CommCost, anchor_s: float) -> CommCost:
    """``cost`` with its fitted part F (network + codec, all but error feedback) replaced by the measured A =
    ``anchor_s`` and every part scaled by A/F: T = A + T_feedback, and the breakdown's ``anchor_s`` = A − F. The
    wire time is only scaled down (at most A). Error feedback stays on top: the probe times the ring without it.
    ``anchor_s`` = 0, or a cost of nothing, gives ``cost`` unchanged."""
    fitted = cost.total_s - cost.feedback_s
    if anchor_s <= 0 or cost.total_s <= 0 or fitted <= 0:
        return cost
    scale = anchor_s / fitted
    feedback = cost.feedback_s
    per_bucket_feedback = feedback / cost.buckets
    return CommCost(anchor_s + feedback, (cost.codec_s - feedback) * scale + feedback,
                    (cost.last_bucket_s - per_bucket_feedback) * scale + per_bucket_feedback, cost.buckets,
                    cost.message_bytes, anchor_s - fitted, min(cost.wire_s, anchor_s), feedback)
