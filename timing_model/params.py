"""Frozen parameter records of the analytic core: cluster, compute, codec, parameter server and schedule.

Only the plain inputs a user knows live here; what ``calibrate`` measures is ``timing_model.empirical.terms``.
All values are SI (seconds, bytes, bytes/s). ``__post_init__`` rejects impossible values with a ``ValueError``
that says which field is wrong and why, so the CLI can print it as one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from timing_model.codec_sizes import CODECS, fp32_ratio
from timing_model.trainer_defaults import BUCKET_MB, SYNC_EVERY

__all__ = [
    "ClusterParams",
    "ComputeParams",
    "CodecParams",
    "ServerParams",
    "ScheduleParams",
    "CODEC_RATIOS",
    "COLLECTIVES",
    "ALLREDUCES",
    "build_codec",
    "BUCKET_BYTES",
    "require",
    "require_nonneg",
    "require_finite_nonneg",
]

COLLECTIVES = ("ring", "rabenseifner", "recursive-doubling", "tree")
# Which all-reduce runs sync's and pipe's buckets (as ``trainer_defaults.ALLREDUCE_CHOICES``): "ring", ours with
# the codec on every hop; "alltoall", two collectives (``collectives.allreduce_exchange``); "auto", what
# the trainer's "auto" runs (``resolve_allreduce``: the backend's all_reduce, costed by the ring's formula, when lossless).
ALLREDUCES = ("auto", "ring", "alltoall")
BUCKET_BYTES = BUCKET_MB * 2**20  # the trainer's default bytes per bucket (owner: trainer_defaults)

# Raw fp32 bytes over payload bytes of each codec (owner: timing_model.codec_sizes, which the codecs use too).
CODEC_RATIOS = {name: fp32_ratio(name) for name in CODECS}


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``."""
    if not condition:
        raise ValueError(message)


def require_nonneg(name: str, value: float) -> None:
    """``value`` is a number >= 0 (infinity allowed), else ``ValueError`` naming ``name``."""
    require(isinstance(value, (int, float)) and not math.isnan(value) and value >= 0,
            f"{name} must be a number >= 0, got {value!r}")


def require_finite_nonneg(name: str, value: float) -> None:
    """``value`` is a finite number >= 0, else ``ValueError`` naming ``name``."""
    require_nonneg(name, value)
    require(value < math.inf, f"{name} must be finite")


@dataclass(frozen=True, slots=True)
class ClusterParams:
    """The network: how many workers and what one collective call costs."""

    nodes: int  # number of workers p taking part in each collective (>= 1)
    grad_bytes: float  # gradient bytes per iteration M (4 per fp32 parameter)
    bandwidth_Bps: float  # one-direction link bandwidth B per worker, bytes/s
    latency_s: float = 0.0  # per-message / per-ring-step latency α, seconds
    overhead_s: float = 0.0  # fixed cost c0 of one collective call, seconds
    reduce_Bps: float = math.inf  # local reduction rate 1/γ, bytes/s (inf: reduction is free)
    collective: str = "ring"  # allreduce algorithm for sync/ddp: ring | rabenseifner | recursive-doubling | tree

    def __post_init__(self) -> None:
        require(isinstance(self.nodes, int) and self.nodes >= 1, f"nodes must be an integer >= 1, got {self.nodes!r}")
        require_nonneg("grad_bytes", self.grad_bytes)
        require(self.grad_bytes < math.inf, "grad_bytes must be finite")
        require(self.bandwidth_Bps > 0, f"bandwidth must be > 0 bytes/s, got {self.bandwidth_Bps!r}")
        require_nonneg("latency_s", self.latency_s)
        require_nonneg("overhead_s", self.overhead_s)
        require(self.reduce_Bps > 0, f"reduce rate must be > 0 bytes/s, got {self.reduce_Bps!r}")
        require(self.collective in COLLECTIVES,
                f"unknown collective {self.collective!r}; valid: {', '.join(COLLECTIVES)}")


@dataclass(frozen=True, slots=True)
class ComputeParams:
    """One worker's local work per iteration."""

    compute_s: float  # mean forward+backward time T_c, seconds
    compute_std_s: float = 0.0  # spread of T_c across workers (straggler term), seconds
    update_s: float = 0.0  # optimizer update T_u, seconds
    samples_per_worker: int = 0  # batch size per worker, for samples/s (0: report iterations/s only)
    lookahead_s: float = 0.0  # Pipe-SGD width >= 2: the look-ahead's replay of the optimizer's rule, seconds

    def __post_init__(self) -> None:
        for name in ("compute_s", "compute_std_s", "update_s", "lookahead_s"):
            require_finite_nonneg(name, getattr(self, name))
        require(isinstance(self.samples_per_worker, int) and self.samples_per_worker >= 0,
                f"samples_per_worker must be an integer >= 0, got {self.samples_per_worker!r}")


@dataclass(frozen=True, slots=True)
class CodecParams:
    """A gradient compressor as the model sees it: how much smaller, how fast, where it runs."""

    name: str = "none"  # compressor name (informational)
    ratio: float = 1.0  # r = raw fp32 bytes / payload bytes
    encode_Bps: float = math.inf  # encode throughput, fp32 input bytes/s
    decode_Bps: float = math.inf  # decode throughput, fp32 output bytes/s
    feedback_Bps: float = math.inf  # error feedback: decode + residual update per encoded fp32 byte (inf: none)

    def __post_init__(self) -> None:
        require(self.ratio >= 1.0, f"compression ratio must be >= 1, got {self.ratio!r}")
        require(self.encode_Bps > 0 and self.decode_Bps > 0 and self.feedback_Bps > 0,
                "codec throughput must be > 0 bytes/s")


def build_codec(name: str, encode_Bps: float = math.inf, decode_Bps: float = math.inf,
                ratio: float | None = None, feedback_Bps: float = math.inf) -> CodecParams:
    """The default codec record for a compressor name; unknown names raise with the valid list."""
    if name not in CODEC_RATIOS:
        raise ValueError(f"unknown compression {name!r}; valid: {', '.join(CODEC_RATIOS)}")
    if name == "none":
        return CodecParams("none", 1.0)
    return CodecParams(name, CODEC_RATIOS[name] if ratio is None else ratio, encode_Bps, decode_Bps, feedback_Bps)


@dataclass(frozen=True, slots=True)
class ServerParams:
    """Parameter-server side of the ps-sync and ps-async modes."""

    servers: int = 1  # k, number of server shards
    server_bandwidth_Bps: float = 0.0  # B_s per server, bytes/s (0: same as the worker link)
    serialised: bool = True  # push then pull in turn (d = 2) rather than pipelined (d = 1)
    colocated: bool = False  # server shares a machine with a worker (Paleo's OneToAll: p−1 remote flows)
    server_reduce_Bps: float = math.inf  # server aggregation rate 1/γ_s, bytes/s

    def __post_init__(self) -> None:
        require(isinstance(self.servers, int) and self.servers >= 1,
                f"servers must be an integer >= 1, got {self.servers!r}")
        require_nonneg("server_bandwidth_Bps", self.server_bandwidth_Bps)
        require(self.server_reduce_Bps > 0, "server reduce rate must be > 0 bytes/s")


@dataclass(frozen=True, slots=True)
class ScheduleParams:
    """How the trainer overlaps communication: pipeline width, DDP overlap, bucketing, and how often the
    periodic-averaging modes (localsgd, diloco) sync."""

    width: int = 2  # K, Pipe-SGD pipeline width (1 = synchronous)
    overlap_fraction: float = 0.5  # φ, fraction of backward during which DDP buckets may communicate
    bucket_bytes: float = BUCKET_BYTES  # bytes per bucket; each bucket is one collective call (0: one bucket)
    allreduce: str = "ring"  # sync's and pipe's, resolved: "ring", "alltoall" or "backend" (the ring's)
    sync_every: int = SYNC_EVERY  # H, localsgd/diloco: inner steps between two syncs (``--sync-every``)
    sync_delay: int = 0  # τ, diloco: inner steps the sync's all-reduce overlaps (``--sync-delay``)

    def __post_init__(self) -> None:
        require(isinstance(self.width, int) and self.width >= 1, f"width must be an integer >= 1, got {self.width!r}")
        require(isinstance(self.sync_every, int) and self.sync_every >= 1,
                f"sync_every must be an integer >= 1, got {self.sync_every!r}")
        require(isinstance(self.sync_delay, int) and 0 <= self.sync_delay < self.sync_every,
                f"sync_delay must be an integer in [0, sync_every) = [0, {self.sync_every}), got {self.sync_delay!r}")
        require(self.allreduce in ("ring", "alltoall", "backend"),
                f"allreduce must be 'ring', 'alltoall' or 'backend' once resolved, got {self.allreduce!r}")
        require(0.0 <= self.overlap_fraction <= 1.0,
                f"overlap fraction must lie in [0, 1], got {self.overlap_fraction!r}")
        require_nonneg("bucket_bytes", self.bucket_bytes)
