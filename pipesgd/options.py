"""What a PipeSGD wrapper is asked to do, validated in one place before any group, worker or buffer exists.

``PipeSGDOptions`` holds the knobs that one user in a hundred changes (a new knob is one field here); the
constructor's own arguments and these options together make the ``WrapperConfig`` the wrapper runs with. Both raise
``ValueError`` saying why a value or a combination is invalid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pipesgd.auto import AUTO
from pipesgd.comm.exchange import GradientExchange
from pipesgd.comm.topology import RingTopology
from pipesgd.compression import Compressor, ErrorFeedback, build
from pipesgd.defaults import (ALLREDUCE_CHOICES, BUCKET_MB, GRADIENT_AS_BUCKET_VIEW, LOOKAHEAD_STANDINS,
                              NEEDS_ERROR_FEEDBACK, STALENESS, STALENESS_MODES, UNSHARED_STANDINS, WARMUP_STEPS,
                              resolve_allreduce)
from pipesgd.grads.buffers import BUFFER_MODES
from pipesgd.grads.clipping import resolve_max_grad_norm

NONFINITE_POLICIES = ("raise", "skip")


@dataclass(frozen=True, slots=True)
class PipeSGDOptions:
    """The rarely changed knobs of ``PipeSGD`` (``PipeSGD(..., options=PipeSGDOptions(nonfinite="skip"))``)."""

    # What stands in for the averages in flight during look-ahead (pipesgd.defaults.LOOKAHEAD_STANDINS).
    lookahead_standin: str = "auto"
    # The codec's own parameters (pipesgd.compression registry), e.g. {"stochastic": True} for q8.
    compression_options: dict[str, Any] = field(default_factory=dict)
    allreduce: str = "auto"  # how a bucket travels (pipesgd.defaults.ALLREDUCE_CHOICES)
    timeout_s: float | None = None  # bound on every wait of the background exchange; None: torch's default
    max_grad_norm: float | None = None  # clip the averaged gradient to this global L2 norm; None or 0: off
    nonfinite: str = "raise"  # a NaN/Inf averaged gradient raises, or its step is skipped ("skip")
    check_replicas_every: int = 0  # compare the weights (and synced buffers) bitwise across ranks every N steps
    # Before every exchange, agree on which ranks still train, so a rank that ran out of data is named instead of
    # a hang (pipesgd.comm.uneven). False where every rank runs the same number of steps by construction.
    check_uneven: bool = True
    # Module buffers (BatchNorm statistics) where the ranks meet: rank 0's ("broadcast", as DDP), the mean
    # ("average"), or each rank's own ("none") (pipesgd.grads.buffers).
    buffers: str = "broadcast"
    grad_scaler: Any = None  # a torch.amp.GradScaler the wrapper drives (fp16 loss scaling); None: no scaling
    gradient_as_bucket_view: bool = GRADIENT_AS_BUCKET_VIEW  # p.grad as views into the flat buckets
    # Start every rank from rank 0's parameters and buffers (DDP's behaviour); False only for a model already
    # identical on every rank by construction.
    init_sync: bool = True
    auto_recheck_every: int = 0  # width or compression "auto": choose again every N steps (0: once)

    def __post_init__(self) -> None:
        if self.lookahead_standin not in LOOKAHEAD_STANDINS:
            raise ValueError(f"lookahead_standin must be one of {LOOKAHEAD_STANDINS}, got {self.lookahead_standin!r}")
        if self.allreduce not in ALLREDUCE_CHOICES:
            raise ValueError(f"allreduce must be one of {ALLREDUCE_CHOICES}, got {self.allreduce!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s!r}")
        object.__setattr__(self, "max_grad_norm", resolve_max_grad_norm(self.max_grad_norm))  # 0 -> None (off)
        if self.nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {self.nonfinite!r}")
        if not isinstance(self.check_replicas_every, int) or self.check_replicas_every < 0:
            raise ValueError(f"check_replicas_every must be an integer >= 0, got {self.check_replicas_every!r}")
        if self.buffers not in BUFFER_MODES:
            raise ValueError(f"buffers must be one of {BUFFER_MODES}, got {self.buffers!r}")
        if self.grad_scaler is not None and not isinstance(self.grad_scaler, torch.amp.GradScaler):
            raise ValueError(f"grad_scaler must be a torch.amp.GradScaler, got {type(self.grad_scaler).__name__}")
        for name in ("check_uneven", "init_sync", "gradient_as_bucket_view"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.auto_recheck_every, int) or self.auto_recheck_every < 0:
            raise ValueError(f"auto_recheck_every must be an integer >= 0, got {self.auto_recheck_every!r}")
        # A private copy: the caller's dict may change later, these options may not.
        object.__setattr__(self, "compression_options", dict(self.compression_options or {}))


@dataclass(frozen=True, slots=True)
class WrapperConfig:
    """Everything a wrapper runs with: the constructor's arguments and its options, checked together."""

    # Pipeline: K steps in flight after ``warmup_steps`` synchronous ones (pipesgd.delay.pipeline); "auto": chosen
    # at the end of the warm-up (pipesgd.auto), synchronous until then.
    width: int | str = 2
    warmup_steps: int = WARMUP_STEPS
    # Stale gradients at width >= 2: "lookahead" computes each at the weights the updates in flight will produce
    # (pipesgd.delay.lookahead), "none" is the paper's plain update.
    staleness: str = STALENESS
    # The codec (pipesgd.compression registry name); "auto": chosen at the end of the warm-up (pipesgd.auto).
    compression: str = "none"
    error_feedback: bool = False  # keep what the codec dropped and send it with the next step
    bucket_mb: float = BUCKET_MB  # MiB of gradients per flat bucket (one collective call each)
    options: PipeSGDOptions = field(default_factory=PipeSGDOptions)

    def __post_init__(self) -> None:
        if self.width != AUTO and (not isinstance(self.width, int) or isinstance(self.width, bool) or self.width < 1):
            raise ValueError(f"width must be an integer >= 1 or 'auto', got {self.width!r}")
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if self.staleness not in STALENESS_MODES:
            raise ValueError(f"staleness must be one of {STALENESS_MODES}, got {self.staleness!r}")
        if not isinstance(self.bucket_mb, (int, float)) or not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {self.bucket_mb!r}")
        if not isinstance(self.options, PipeSGDOptions):
            raise ValueError(f"options must be a pipesgd.PipeSGDOptions, got {type(self.options).__name__}")
        options = self.options
        if options.lookahead_standin not in UNSHARED_STANDINS and self.staleness != "lookahead":
            raise ValueError(f"lookahead_standin applies to staleness='lookahead' only, not {self.staleness!r}")
        if self.compression == AUTO and self.error_feedback:
            raise ValueError("compression='auto' chooses error feedback with the codec; leave error_feedback "
                             "False (or name a codec)")
        chosen = [name for name in ("width", "compression") if getattr(self, name) == AUTO]
        if chosen and self.warmup_steps < 2:
            raise ValueError(f"{chosen[0]}='auto' measures during the synchronous warm-up: warmup_steps must be "
                             f">= 2, got {self.warmup_steps}")
        if options.auto_recheck_every and not chosen:
            raise ValueError("auto_recheck_every needs width='auto' or compression='auto' (nothing else is chosen)")
        codec = self.build_compressor()  # an unknown name or a bad codec option raises here
        if self.compression in NEEDS_ERROR_FEEDBACK and not self.error_feedback:
            raise ValueError(
                f"compression={self.compression!r} needs error_feedback=True (1-bit SGD diverges without it)"
            )
        if self.error_feedback and codec.lossless:
            raise ValueError(f"error_feedback=True needs a lossy compression (compression={self.compression!r} "
                             f"drops nothing to feed back)")
        self.allreduce_for(codec)  # "backend" with a lossy codec raises here

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * 2**20)

    @property
    def chooses(self) -> bool:
        """Whether the warm-up chooses the width or the codec (pipesgd.auto)."""
        return AUTO in (self.width, self.compression)

    def build_compressor(self, rank: int | None = None) -> Compressor:
        """The codec for ``rank`` (stochastic rounding draws noise of its own on every rank); with "auto", the
        warm-up's: none (until a provisional codec, ``pipesgd.auto``)."""
        if self.compression == AUTO:
            return build("none")
        return build(self.compression, rank=rank, **self.options.compression_options)

    def build_exchange(self, topology: RingTopology, rank: int, device: torch.device,
                       allreduce: str | None = None) -> GradientExchange:
        """How the buckets travel: this rank's codec (and its error feedback) on the all-reduce it runs in, for
        gradients on ``device``; ``allreduce`` overrides the options' choice (a measured one, ``pipesgd.auto``)."""
        compressor = self.build_compressor(rank)
        choice = self.options.allreduce if allreduce is None else allreduce
        return GradientExchange(topology, compressor,
                                resolve_allreduce(choice, compressor.lossless, topology.stages(device)),
                                ErrorFeedback(compressor) if self.error_feedback else None)

    def allreduce_for(self, compressor: Compressor, staged: bool = False) -> str:
        """"ring", "alltoall" or "backend": which all-reduce runs a bucket with ``compressor``, its payloads
        staged through host memory or not (pipesgd.defaults)."""
        return resolve_allreduce(self.options.allreduce, compressor.lossless, staged)
