"""Predictions for every mode at once, speedups between modes, and sweeps over a grid of scenarios.

A ``Scenario`` holds the inputs as a user gives them (SI units): the plain ones of the analytic core as flat
fields, and what ``calibrate`` measured in one nested ``EmpiricalTerms`` record (``empirical``; neutral by
default, the plain model). ``predict(scenario)`` returns a ``Prediction`` with one ``ModeResult`` per mode and
the speedup tables; ``sweep(base, axes)`` varies any scenario fields (plain or empirical, by name) over lists of
values.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields, replace

from timing_model.trainer_defaults import SYNC_EVERY, resolve_allreduce

from .empirical.terms import EMPIRICAL_FIELDS, NEUTRAL, EmpiricalTerms
from .modes import MODES, ModeResult, predict_mode
from .params import (ALLREDUCES, BUCKET_BYTES, ClusterParams, CodecParams, ComputeParams, ScheduleParams,
                     ServerParams, build_codec)

__all__ = ["Scenario", "Prediction", "predict", "sweep", "SWEEP_AXES"]


@dataclass(frozen=True, slots=True)
class Scenario:
    """Everything one prediction needs: the plain inputs as flat SI-unit fields (the CLI's flags map one to one),
    the measured terms in ``empirical``."""

    # cluster and network
    nodes: int  # workers
    grad_bytes: float  # gradient bytes M per iteration
    bandwidth_Bps: float  # link bandwidth, bytes/s
    latency_s: float = 0.0  # per-message latency
    overhead_s: float = 0.0  # fixed cost per collective call
    reduce_Bps: float = math.inf  # local reduction rate
    collective: str = "ring"  # allreduce algorithm of sync/ddp
    # compute
    compute_s: float = 0.0  # mean forward+backward
    compute_std_s: float = 0.0  # spread across workers
    update_s: float = 0.0  # optimizer step
    lookahead_s: float = 0.0  # Pipe-SGD width >= 2: the look-ahead's replay of the optimizer's rule per step
    batch_size: int = 0  # samples per worker per iteration (0: unknown)
    # codec
    compression: str = "none"  # none | fp16 | bf16 | q8 | q4 | sign
    encode_Bps: float = math.inf  # codec encode throughput (fp32 bytes/s)
    decode_Bps: float = math.inf  # codec decode throughput
    error_feedback: bool = False  # the codec keeps its error (``--error-feedback``); costs feedback_Bps
    feedback_Bps: float = math.inf  # error-feedback work per encoded fp32 byte (inf: free)
    compression_ratio: float | None = None  # override of the default ratio of ``compression``
    # schedule
    width: int = 2  # Pipe-SGD pipeline width
    overlap_fraction: float = 0.5  # DDP: fraction of backward that buckets overlap
    bucket_bytes: float = BUCKET_BYTES  # bytes per collective call
    allreduce: str = "auto"  # sync's and pipe's all-reduce: auto | ring | alltoall (``params.ALLREDUCES``)
    sync_every: int = SYNC_EVERY  # localsgd/diloco: inner steps between two syncs
    sync_delay: int = 0  # diloco: inner steps the sync's all-reduce overlaps
    # parameter server
    servers: int = 1  # parameter-server shards
    server_bandwidth_Bps: float = 0.0  # 0: same as the worker link
    ps_serialised: bool = True  # push and pull one after the other
    ps_colocated: bool = False  # server on a worker machine
    # what calibrate measured (``timing_model.empirical.terms``); neutral: the plain model
    empirical: EmpiricalTerms = NEUTRAL

    @classmethod
    def of(cls, **values) -> "Scenario":
        """A scenario from flat fields, plain ones and empirical terms alike, each by its own name."""
        terms = {name: values.pop(name) for name in list(values) if name in EMPIRICAL_FIELDS}
        scenario = cls(**values)
        return scenario.with_changes(**terms) if terms else scenario

    def with_changes(self, **changes) -> "Scenario":
        """A copy with plain fields and empirical terms changed, each by its own name (the terms go into a copy of
        ``empirical``)."""
        terms = {name: changes.pop(name) for name in list(changes) if name in EMPIRICAL_FIELDS}
        out = replace(self, **changes) if changes else self
        return replace(out, empirical=replace(out.empirical, **terms)) if terms else out

    @property
    def resolved_allreduce(self) -> str:
        """"ring", "alltoall" or "backend": ``allreduce`` resolved as the trainer resolves it
        (``trainer_defaults.resolve_allreduce``: with "auto", the two collectives for a lossy codec and the
        backend's all_reduce, whose cost the ring's formula gives, for a lossless one)."""
        if self.allreduce not in ALLREDUCES:
            raise ValueError(f"unknown allreduce {self.allreduce!r}; valid: {', '.join(ALLREDUCES)}")
        return resolve_allreduce(self.allreduce, lossless=self.compression == "none")

    def records(self) -> tuple[ClusterParams, ComputeParams, CodecParams, ScheduleParams, ServerParams]:
        """Build (and thereby validate) the frozen plain parameter records of the core."""
        cluster = ClusterParams(self.nodes, self.grad_bytes, self.bandwidth_Bps, self.latency_s, self.overhead_s,
                                self.reduce_Bps, self.collective)
        compute = ComputeParams(self.compute_s, self.compute_std_s, self.update_s, self.batch_size, self.lookahead_s)
        codec = build_codec(self.compression, self.encode_Bps, self.decode_Bps, self.compression_ratio,
                            self.feedback_Bps if self.error_feedback else math.inf)
        schedule = ScheduleParams(self.width, self.overlap_fraction, self.bucket_bytes, self.resolved_allreduce,
                                  self.sync_every, self.sync_delay)
        server = ServerParams(self.servers, self.server_bandwidth_Bps, self.ps_serialised, self.ps_colocated)
        return cluster, compute, codec, schedule, server


# what ``sweep`` may vary: every plain field and every empirical term, by name
SWEEP_AXES = tuple(f.name for f in fields(Scenario) if f.name != "empirical") + EMPIRICAL_FIELDS


@dataclass(frozen=True, slots=True)
class Prediction:
    """One ``ModeResult`` per mode, in ``MODES`` order, and the scenario that produced them."""

    scenario: Scenario
    results: tuple[ModeResult, ...]

    def result(self, mode: str) -> ModeResult:
        for res in self.results:
            if res.mode == mode:
                return res
        raise KeyError(f"mode {mode!r} not predicted; have {', '.join(r.mode for r in self.results)}")

    def speedup(self, mode: str, baseline: str) -> float:
        """iteration_s(baseline) / iteration_s(mode): > 1 means ``mode`` is faster."""
        fast, slow = self.result(mode).iteration_s, self.result(baseline).iteration_s
        return slow / fast if fast > 0 else math.inf

    def speedup_vs_one(self, mode: str) -> float:
        """One worker doing every worker's minibatch (workers × (compute + update)) over the mode's iteration time."""
        s = self.scenario
        single = s.nodes * (s.compute_s + s.update_s)
        it = self.result(mode).iteration_s
        return single / it if it > 0 else math.inf

    def winner(self) -> str:
        """The fastest mode (first in ``MODES`` order on ties)."""
        return min(self.results, key=lambda r: r.iteration_s).mode

    def rows(self) -> list[dict]:
        """One flat dict per mode: the breakdown plus speedups against sync, one worker and every mode."""
        rows = []
        for res in self.results:
            row = res.as_dict()
            row["speedup_vs_sync"] = self.speedup(res.mode, "sync") if self._has("sync") else math.nan
            row["speedup_vs_one"] = self.speedup_vs_one(res.mode)
            for other in self.results:
                row[f"speedup_vs_{other.mode}"] = self.speedup(res.mode, other.mode)
            rows.append(row)
        return rows

    def _has(self, mode: str) -> bool:
        return any(r.mode == mode for r in self.results)


def predict(scenario: Scenario, modes: tuple[str, ...] = MODES) -> Prediction:
    """Predict every mode in ``modes`` for one scenario."""
    records = scenario.records()
    return Prediction(scenario, tuple(predict_mode(mode, *records, scenario.empirical) for mode in modes))


def sweep(base: Scenario, axes: dict[str, list], modes: tuple[str, ...] = MODES) -> list[Prediction]:
    """Cartesian product over ``axes`` (scenario field → values), other fields from ``base``."""
    for name in axes:
        if name not in SWEEP_AXES:
            raise ValueError(f"cannot sweep {name!r}; valid: {', '.join(SWEEP_AXES)}")
    names = list(axes)
    return [predict(base.with_changes(**dict(zip(names, values))), modes)
            for values in itertools.product(*(axes[n] for n in names))]
