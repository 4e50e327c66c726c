"""Frozen parameter records of the timing model: cluster, compute, codec, parameter server and schedule.

All values are SI (seconds, bytes, bytes/s). ``__post_init__`` rejects impossible values with a
``ValueError`` that says which field is wrong and why, so the CLI can print it as one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipesgd.compression.sizes import CODECS, fp32_ratio
from pipesgd.defaults import BUCKET_MB

__all__ = [
    "ClusterParams",
    "ComputeParams",
    "CodecParams",
    "ServerParams",
    "ScheduleParams",
    "CODEC_RATIOS",
    "COLLECTIVES",
    "build_codec",
    "BUCKET_BYTES",
]

COLLECTIVES = ("ring", "rabenseifner", "recursive-doubling", "tree")
BUCKET_BYTES = BUCKET_MB * 2**20  # the trainer's default bytes per bucket (owner: pipesgd.defaults)

# Raw fp32 bytes over payload bytes of each codec (owner: pipesgd.compression.sizes, which the codecs use too).
CODEC_RATIOS = {name: fp32_ratio(name) for name in CODECS}


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _finite_nonneg(name: str, value: float) -> None:
    _check(isinstance(value, (int, float)) and not math.isnan(value) and value >= 0,
           f"{name} must be a number >= 0, got {value!r}")


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
    # measured seconds of the trainer's allreduce of the whole gradient alone, at grad_bytes, with this codec (the
    # calibration's probe at the operating point, ``modes.allreduce_cost``); 0: the α-β fit alone
    ring_anchor_s: float = 0.0

    def __post_init__(self) -> None:
        _check(isinstance(self.nodes, int) and self.nodes >= 1, f"nodes must be an integer >= 1, got {self.nodes!r}")
        _finite_nonneg("ring_anchor_s", self.ring_anchor_s)
        _finite_nonneg("grad_bytes", self.grad_bytes)
        _check(self.grad_bytes < math.inf, "grad_bytes must be finite")
        _check(self.bandwidth_Bps > 0, f"bandwidth must be > 0 bytes/s, got {self.bandwidth_Bps!r}")
        _finite_nonneg("latency_s", self.latency_s)
        _finite_nonneg("overhead_s", self.overhead_s)
        _check(self.reduce_Bps > 0, f"reduce rate must be > 0 bytes/s, got {self.reduce_Bps!r}")
        _check(self.collective in COLLECTIVES,
               f"unknown collective {self.collective!r}; valid: {', '.join(COLLECTIVES)}")


@dataclass(frozen=True, slots=True)
class ComputeParams:
    """One worker's local work per iteration."""

    compute_s: float  # mean forward+backward time T_c, seconds
    compute_std_s: float = 0.0  # spread of T_c across workers (straggler term), seconds
    update_s: float = 0.0  # optimizer update T_u, seconds
    slowdown: float = 0.0  # κ: relative compute slow-down while communication runs alongside
    samples_per_worker: int = 0  # batch size per worker, for samples/s (0: report iterations/s only)
    comm_slowdown: float = 0.0  # κc: relative communication slow-down while compute runs alongside
    copy_Bps: float = math.inf  # memory-copy rate for packing gradients into buckets and back, bytes/s
    handoff_s: float = 0.0  # fixed per-step cost of handing the buckets to the comm thread and back, seconds
    buffers_s: float = 0.0  # blocking per-step sync of module buffers (BatchNorm statistics), not hidden, seconds
    # per-step host work on the training thread outside compute, update, buffer sync and the wait for communication
    # (the optimizer wrapper's packing, hand-off and bookkeeping, zero_grad), as a run measured it; not hidden. The
    # hand-off estimate (copy rate, handoff_s) is part of it: only what exceeds that estimate adds, seconds
    host_s: float = 0.0
    # lockstep L: what a blocking collective right after compute costs beyond the slowest compute and the collective
    # alone, calibrate's lockstep probe (``host_terms.lockstep_from_timings``); signed: > 0 where the ranks leave it
    # at staggered times and contend for cores they share, < 0 where a shaped link's token bucket refilled during
    # compute; added to every step that ends in a blocking all-reduce (sync, ddp, width 1), at least −compute, seconds
    lockstep_s: float = 0.0
    # λ ∈ [0, 1]: the share of each compute window that Pipe-SGD's ring, running beside it, loses, as calibrate's
    # window probe measured it at a Pipe-SGD step's duty cycle (one compute window per ring; ``formulas.window_comm``);
    # None: pipe takes κc instead
    window_loss: float | None = None
    # the DDP probe (calibrate --model, ``pipesgd.measure.ddp_step``): the model's step under DDP, back to back on
    # every rank, and its forward + backward alone; ddp then takes what that step took beyond the model's DDP step
    # for the probe's compute in place of the lockstep term (``modes.predict_ddp``); 0: not probed, seconds
    ddp_step_s: float = 0.0
    ddp_compute_s: float = 0.0

    def __post_init__(self) -> None:
        if self.window_loss is not None:
            _finite_nonneg("window_loss", self.window_loss)
            _check(self.window_loss <= 1.0, f"window_loss must lie in [0, 1], got {self.window_loss!r}")
        for name in ("compute_s", "compute_std_s", "update_s", "slowdown", "comm_slowdown", "handoff_s",
                     "buffers_s", "host_s", "ddp_step_s", "ddp_compute_s"):
            _finite_nonneg(name, getattr(self, name))
            _check(getattr(self, name) < math.inf, f"{name} must be finite")
        _check((self.ddp_step_s > 0) == (self.ddp_compute_s > 0),
               f"the DDP probe needs both its step and its compute, got {self.ddp_step_s!r} and "
               f"{self.ddp_compute_s!r}")
        _check(isinstance(self.lockstep_s, (int, float)) and math.isfinite(self.lockstep_s),
               f"lockstep_s must be a finite number, got {self.lockstep_s!r}")
        _check(self.copy_Bps > 0, f"copy rate must be > 0 bytes/s, got {self.copy_Bps!r}")
        _check(isinstance(self.samples_per_worker, int) and self.samples_per_worker >= 0,
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
        _check(self.ratio >= 1.0, f"compression ratio must be >= 1, got {self.ratio!r}")
        _check(self.encode_Bps > 0 and self.decode_Bps > 0 and self.feedback_Bps > 0,
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
    # bytes of a reply the server's send hands to the kernel's socket buffers without waiting for the link (ps-async,
    # ``formulas.ps_async_iteration``): Linux's default tcp_wmem maximum, 4 MiB
    send_buffer_bytes: float = 4 * 2**20
    # ps-async with a co-located server: its seconds per remote request, as the workers' queue sees it
    # (``formulas.closed_queue_response``), while the co-located worker trains and after it finished; calibrate's
    # parameter-server probe. 0: not calibrated (the server costs only its link, ``formulas.ps_async_iteration``)
    service_s: float = 0.0
    service_idle_s: float = 0.0
    # ps-async with a co-located server: that worker's own mean step, all local work (its updates never cross the
    # link; it shares its process and cores with the server thread); 0: the remote workers' think time
    colocated_step_s: float = 0.0
    # ps-sync with a co-located server: the round (every push, the server's mean and update, every reply) less the
    # update, as calibrate's ps-sync probe timed it at this gradient, ranks and link (``pipesgd.measure.ps_round``);
    # it replaces the link's push + pull and the service time (``modes.predict_ps_sync``); 0: not calibrated
    round_s: float = 0.0

    def __post_init__(self) -> None:
        _check(isinstance(self.servers, int) and self.servers >= 1,
               f"servers must be an integer >= 1, got {self.servers!r}")
        _finite_nonneg("server_bandwidth_Bps", self.server_bandwidth_Bps)
        _check(self.server_reduce_Bps > 0, "server reduce rate must be > 0 bytes/s")
        _check(self.send_buffer_bytes >= 0, f"send buffer must be >= 0 bytes, got {self.send_buffer_bytes!r}")
        _finite_nonneg("service_s", self.service_s)
        _finite_nonneg("service_idle_s", self.service_idle_s)
        _finite_nonneg("colocated_step_s", self.colocated_step_s)
        _finite_nonneg("round_s", self.round_s)
        _check(self.round_s < math.inf, "round_s must be finite")


@dataclass(frozen=True, slots=True)
class ScheduleParams:
    """How the trainer overlaps communication: pipeline width, DDP overlap, bucketing."""

    width: int = 2  # K, Pipe-SGD pipeline width (1 = synchronous)
    overlap_fraction: float = 0.5  # φ, fraction of backward during which DDP buckets may communicate
    bucket_bytes: float = BUCKET_BYTES  # bytes per bucket; each bucket is one collective call (0: one bucket)

    def __post_init__(self) -> None:
        _check(isinstance(self.width, int) and self.width >= 1, f"width must be an integer >= 1, got {self.width!r}")
        _check(0.0 <= self.overlap_fraction <= 1.0,
               f"overlap fraction must lie in [0, 1], got {self.overlap_fraction!r}")
        _finite_nonneg("bucket_bytes", self.bucket_bytes)
