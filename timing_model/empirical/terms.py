"""The measured terms of the timing model in one frozen record: what ``calibrate`` (or a run's own records)
measured on one cluster, beyond the plain inputs of the analytic core.

Every field defaults to its neutral value, and ``EmpiricalTerms()`` (``NEUTRAL``) turns every term off: the
predictions are then the core's textbook equations exactly (tests/test_timing_textbook.py). Where each term
enters the modes: ``timing_model.modes``; how calibrate derives it: ``timing_model.empirical.host_terms``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..params import require, require_finite_nonneg, require_nonneg

__all__ = ["EmpiricalTerms", "NEUTRAL", "EMPIRICAL_FIELDS"]


@dataclass(frozen=True, slots=True)
class EmpiricalTerms:
    """Measured per-step costs the textbook equations leave out; all SI, all neutral by default."""

    # the allreduce: the trainer's allreduce of the whole gradient timed alone at the workload's size and codec
    # (calibrate's interference probe); it replaces the α-β fit there and scales every part of it
    # (``empirical.anchor``); 0: the fit alone
    ring_anchor_s: float = 0.0
    # what one call of our compressed all-reduce (sync's and pipe's, with a codec) costs beyond its wire time and its
    # codec's bytes: the per-call bookkeeping of its pieces and hops (calibrate's fit per codec and cluster size,
    # ``timing_model.fitting.fit_codec_costs``), added once per bucket; 0: none
    codec_call_s: float = 0.0
    # overlap on shared cores (``empirical.overlap``): relative compute slow-down while communication runs beside
    # it; relative communication slow-down while compute runs beside it; the share of one compute window a
    # Pipe-SGD ring beside it loses, in [0, 1] (None: pipe takes the communication slow-down instead)
    slowdown: float = 0.0
    comm_slowdown: float = 0.0
    window_loss: float | None = None
    # the optimizer wrapper's hand-off: memory-copy rate for packing gradients into buckets and back (inf: free)
    # and the fixed cost of handing the buckets to the communication thread and back, per step
    copy_Bps: float = math.inf
    handoff_s: float = 0.0
    # a run's own per-step work on the training thread: the blocking buffer sync (BatchNorm statistics), and the
    # host work outside compute, update, buffer sync and the wait (only what exceeds the hand-off adds)
    buffers_s: float = 0.0
    host_s: float = 0.0
    # what a blocking all-reduce right after compute costs beyond the slowest compute and the all-reduce alone
    # (calibrate's lockstep probe); signed: shared cores add, a shaped link's refilled token bucket takes away;
    # on every step that ends in a blocking all-reduce (sync, ddp, width 1), at least −compute
    lockstep_s: float = 0.0
    # calibrate's DDP probe: the model's step under DDP and its forward + backward alone; ddp takes the step's
    # excess over the model's in place of the lockstep term; 0: not probed
    ddp_step_s: float = 0.0
    ddp_compute_s: float = 0.0
    # the parameter server as a host (``empirical.server``): its seconds per remote request while its co-located
    # worker trains, and after (0: as while training); that worker's own step (0: the remote workers' think);
    # the ps-sync probe's round less the update (0: the link's push + pull); the bytes of a reply the kernel takes
    # at once (0: none, push and pull in turn on the link)
    ps_service_s: float = 0.0
    ps_service_idle_s: float = 0.0
    ps_colocated_step_s: float = 0.0
    ps_round_s: float = 0.0
    send_buffer_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.window_loss is not None:
            require_finite_nonneg("window_loss", self.window_loss)
            require(self.window_loss <= 1.0, f"window_loss must lie in [0, 1], got {self.window_loss!r}")
        for name in ("ring_anchor_s", "codec_call_s", "slowdown", "comm_slowdown", "handoff_s", "buffers_s", "host_s",
                     "ddp_step_s", "ddp_compute_s", "ps_service_s", "ps_service_idle_s", "ps_colocated_step_s",
                     "ps_round_s"):
            require_finite_nonneg(name, getattr(self, name))
        require_nonneg("send_buffer_bytes", self.send_buffer_bytes)  # inf: the kernel takes any reply at once
        require((self.ddp_step_s > 0) == (self.ddp_compute_s > 0),
                f"the DDP probe needs both its step and its compute, got {self.ddp_step_s!r} and "
                f"{self.ddp_compute_s!r}")
        require(isinstance(self.lockstep_s, (int, float)) and math.isfinite(self.lockstep_s),
                f"lockstep_s must be a finite number, got {self.lockstep_s!r}")
        require(self.copy_Bps > 0, f"copy rate must be > 0 bytes/s, got {self.copy_Bps!r}")

    def is_neutral(self) -> bool:
        """Whether every term is off (the core alone)."""
        return self == NEUTRAL


NEUTRAL = EmpiricalTerms()
EMPIRICAL_FIELDS = tuple(f.name for f in fields(EmpiricalTerms))
