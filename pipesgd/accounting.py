"""Per-step overlap accounting: how much communication a step exposed, and how much ran hidden.

Every trainer mode (Pipe-SGD, sync, DDP, parameter server) fills the same record, so the metrics of
all modes compare field by field. Times are measured, never estimated.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass(slots=True)
class StepStats:
    """What one ``step()`` did and what it cost."""

    step: int  # index of the step() call that produced this record (0-based)
    applied_step: int | None  # index of the step whose averaged gradient was applied; None if none was
    t_wait_s: float = 0.0  # seconds step() blocked on communication (the exposed part)
    t_update_s: float = 0.0  # seconds in the wrapped optimizer's step()
    t_comm_busy_s: float = 0.0  # seconds the background ring worked on the applied gradient
    bytes_sent: int = 0  # payload bytes this rank sent for the applied gradient
    compression_ratio: float = 1.0  # raw gradient bytes / payload bytes sent
    residual_norm: float | None = None  # L2 norm of the error-feedback residuals, None without feedback
    skipped_nonfinite: bool = False  # the applied gradient was non-finite and the update was skipped
    # Optional fields: in the metrics only when their feature is on (None otherwise).
    grad_norm: float | None = field(default=None, metadata={"optional": True})  # the applied averaged
    #   gradient's L2 norm before clipping (max_grad_norm set and a gradient applied)
    t_buffers_s: float | None = field(default=None, metadata={"optional": True})  # seconds flush() spent
    #   making module buffers identical across ranks (buffers synced)
    t_lookahead_s: float | None = field(default=None, metadata={"optional": True})  # seconds of look-ahead
    #   work since the previous step(): the stand-in's copy, the replay (in the forward pre-hook) and the restore
    t_standin_wait_s: float | None = field(default=None, metadata={"optional": True})  # coarse stand-ins
    #   (pipesgd.delay.coarse): seconds the forward pass since the previous step() waited for one, in ``t_wait_s``
    #   too; a caller that timed that forward as compute subtracts it there (the trainer does)
    auto_choice: str | None = field(default=None, metadata={"optional": True})  # width/compression "auto": what
    #   the warm-up's end or a re-check chose at this step, e.g. "width 2, q8 + error feedback" (pipesgd.auto)
    t_auto_s: float | None = field(default=None, metadata={"optional": True})  # width/compression "auto": seconds
    #   step() spent on auto's own work (timing, measuring, agreeing, deciding, switching; a switch's drain is in
    #   ``t_wait_s`` too) and on waiting there for the other ranks (pipesgd.auto)

    def as_dict(self) -> dict:
        return asdict(self)

    def as_metrics(self) -> dict:
        """This record under the metrics' field names: the unit suffix ``_s`` dropped (``t_wait_s`` ->
        ``t_wait``), ``step`` left out (a step record's ``step`` is the trainer's position, which the
        trainer writes itself), an optional field left out while it is None."""
        return {f.name.removesuffix("_s"): getattr(self, f.name) for f in fields(self)
                if f.name != "step" and not (f.metadata.get("optional") and getattr(self, f.name) is None)}
