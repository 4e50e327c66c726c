"""PipeSGD: the optimizer wrapper that delays the application of averaged gradients by K-1 steps.

Each ``step()``:
  Step 1: copy this step's gradients into flat buckets (the next backward may overwrite ``p.grad``).
  Step 2: hand the buckets to the background ring (a thread; on CUDA a side stream too).
  Step 3: if K steps are in flight (1 during warm-up), wait for the oldest, write its averaged gradient
          into ``p.grad`` and run the wrapped optimizer on it.
So ``w_{t+1} = w_t - lr * mean_i(g^i_{t-K+1})``: K = 1 is synchronous AllReduce SGD, K = 2 is Pipe-SGD.
Every gradient is applied exactly once: during the K-1 steps after warm-up the pipeline fills and
``step()`` applies nothing; ``flush()`` applies the last K-1 at the end.

Warm-up default (``DEFAULT_WARMUP_STEPS`` = 10): staleness hurts most in the first steps, where the loss and
gradients change fastest (SAPipe and ChainerMN report accuracy loss from 1-stale gradients); a few
synchronous steps cost a few iterations of exposed communication and nothing else. Pass 0 for a pure
pipeline from the first step.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pipesgd.accounting import StepStats
from pipesgd.buckets import Bucket, build_buckets, layout_signature, pack_gradients, unpack_to_gradients
from pipesgd.comm_worker import CommWorker
from pipesgd.compression import ErrorFeedback, build
from pipesgd.finite import all_finite
from pipesgd.handles import CompletedWork, Work
from pipesgd.replica_check import check_replicas
from pipesgd.ring import RingReport, RingTopology, backend_allreduce_, ring_allreduce_

DEFAULT_WARMUP_STEPS = 10
_NONFINITE_POLICIES = ("raise", "skip")
# "auto": the backend's own all_reduce for the lossless codec (its C++ ring has no per-hop Python round trip,
# which dominates small buckets), our ring whenever a codec must run on every hop.
_ALLREDUCE_CHOICES = ("auto", "ring", "backend")


class NonFiniteGradientError(FloatingPointError):
    """The averaged gradient of a step holds NaN or Inf."""


@dataclass(slots=True)
class _RingResult:
    """What the background worker hands back for one step's gradients."""

    buckets: list[torch.Tensor]
    report: RingReport
    finite: bool
    residual_norm: float | None


@dataclass(slots=True)
class _InFlight:
    step: int
    handle: Work[_RingResult]


class PipeSGD:
    """Wraps a torch optimizer; averages gradients across ranks with a K-deep pipeline (see module doc).

    Schedulers and anything else that needs a ``torch.optim.Optimizer`` use ``opt.optimizer``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model_or_params,
        width: int = 2,
        compression: str = "none",
        error_feedback: bool = False,
        bucket_mb: float = 25.0,
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        process_group: dist.ProcessGroup | None = None,
        nonfinite: str = "raise",
        check_replicas_every: int = 0,
        compression_options: dict | None = None,
        allreduce: str = "auto",
        timeout_s: float | None = None,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"PipeSGD wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be an integer >= 1, got {width!r}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if nonfinite not in _NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {_NONFINITE_POLICIES}, got {nonfinite!r}")
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if allreduce not in _ALLREDUCE_CHOICES:
            raise ValueError(f"allreduce must be one of {_ALLREDUCE_CHOICES}, got {allreduce!r}")
        if check_replicas_every < 0:
            raise ValueError(f"check_replicas_every must be >= 0, got {check_replicas_every!r}")
        options = dict(compression_options or {})
        if options.get("stochastic"):
            # Independent rounding noise per rank, or the errors of all ranks would add up coherently.
            rank = dist.get_rank() if dist.is_initialized() else 0
            options["seed"] = int(options.get("seed", 0)) + 1_000_003 * rank
        compressor = build(compression, **options)
        if compression == "sign" and not error_feedback:
            raise ValueError("compression='sign' needs error_feedback=True (1-bit SGD diverges without it)")
        self.optimizer = optimizer
        self.width = width
        self.warmup_steps = warmup_steps
        self.compression = compression
        self.nonfinite = nonfinite
        self.check_replicas_every = check_replicas_every
        self._compressor = compressor
        if allreduce == "backend" and not compressor.lossless:
            raise ValueError(f"allreduce='backend' cannot compress on every hop; use 'ring' or 'auto' with {compression!r}")
        self.allreduce = allreduce if allreduce != "auto" else ("backend" if compressor.lossless else "ring")
        self._feedback = ErrorFeedback(compressor) if error_feedback else None
        self._params, self._names = _communicated_params(optimizer, model_or_params)
        self._param_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        self._buckets: list[Bucket] = build_buckets(self._params, int(bucket_mb * 2**20))
        self._free_buffers: list[list[torch.Tensor]] = []
        self._in_flight: deque[_InFlight] = deque()
        self._step = 0
        self._fresh_grads = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._mark_fresh) for p in self._params]
        # Step 0: a private clone of the group for the ring, so collectives the caller issues on its own
        # group (metrics, replica checks) can never interleave with the background thread's traffic.
        self._user_group = process_group
        self._topology = RingTopology(_private_group(process_group, timeout_s))
        device = self._params[0].device if self._params else torch.device("cpu")
        self._worker = CommWorker(device) if self._topology.size > 1 else None
        self.last_stats = StepStats(step=-1, applied_step=None)

    # ----------------------------------------------------------------------------------------- public
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def world_size(self) -> int:
        return self._topology.size

    @property
    def in_flight(self) -> int:
        """How many steps' gradients are handed off and not yet applied."""
        return len(self._in_flight)

    def step(self) -> StepStats:
        """Hand this step's gradients to the ring; apply the averaged gradient of step t-K+1 if due."""
        self._check_usage()
        t = self._step
        # Step 1: pack (copies; p.grad is the caller's again once this returns).
        buffers = self._acquire_buffers()
        for bucket, out in zip(self._buckets, buffers):
            pack_gradients(bucket, self._params, out)
        self._fresh_grads = False
        # Step 2: hand off.
        self._in_flight.append(_InFlight(t, self._submit(buffers, t)))
        # Step 3: apply the oldest when the pipeline is full (depth 1 during warm-up).
        depth = 1 if t < self.warmup_steps else self.width
        stats = StepStats(step=t, applied_step=None)
        if len(self._in_flight) >= depth:
            stats = self._apply(self._in_flight.popleft(), t)
        self._step += 1
        self.last_stats = stats
        if self.check_replicas_every and self._step % self.check_replicas_every == 0:
            self.check_replicas()
        return stats

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._fresh_grads:
            raise RuntimeError(
                "zero_grad() after backward() but before step() would discard this step's gradients; "
                "call step() first (or the inner optimizer's zero_grad() to drop them on purpose)"
            )
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def flush(self) -> list[StepStats]:
        """Wait for every in-flight step and apply it, oldest first, so no gradient is lost."""
        applied = []
        while self._in_flight:
            applied.append(self._apply(self._in_flight.popleft(), self._step))
        if applied:
            self.last_stats = applied[-1]
        return applied

    def check_replicas(self) -> None:
        """Raise ReplicaDivergenceError if any parameter differs bitwise across ranks."""
        check_replicas(self._params, self._names, self._step, self._user_group)

    def close(self) -> None:
        """Stop the background worker (after flush); the wrapper cannot step afterwards."""
        if self._worker is not None:
            self._worker.close()
        for hook in self._hooks:
            hook.remove()

    def state_dict(self) -> dict:
        """Inner optimizer state, averaged gradients still to be applied, error-feedback residuals.

        Waits for in-flight rings. Residuals are this rank's own: save one state per rank.
        """
        in_flight = []
        for entry in self._in_flight:
            result = entry.handle.wait()
            in_flight.append({"step": entry.step, "buckets": [b.clone() for b in result.buckets],
                              "bytes_sent": result.report.bytes_sent, "raw_bytes": result.report.raw_bytes})
        compressor_state = self._compressor.state_dict() if hasattr(self._compressor, "state_dict") else {}
        return {
            "optimizer": self.optimizer.state_dict(),
            "step": self._step,
            "width": self.width,
            "warmup_steps": self.warmup_steps,
            "compression": self.compression,
            "world_size": self.world_size,
            "layout": layout_signature(self._params),
            "in_flight": in_flight,
            "error_feedback": self._feedback.state_dict() if self._feedback else None,
            "compressor": compressor_state,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()``; refuses one from another model, width, codec or world size."""
        for key, mine in (("layout", layout_signature(self._params)), ("world_size", self.world_size),
                          ("width", self.width), ("compression", self.compression)):
            theirs = state.get(key)
            if key == "layout" and theirs is not None:
                theirs = [(tuple(shape), dtype) for shape, dtype in theirs]
            if theirs != mine:
                raise ValueError(f"PipeSGD state does not match this wrapper: {key} is {theirs!r}, expected {mine!r}")
        if self._in_flight:
            raise RuntimeError("load_state_dict() with steps in flight; call flush() first")
        self.optimizer.load_state_dict(state["optimizer"])
        self._step = int(state["step"])
        for entry in state["in_flight"]:
            report = RingReport(int(entry.get("bytes_sent", 0)), int(entry.get("raw_bytes", 0)), 0.0)
            buckets = [b.to(bucket.device) for b, bucket in zip(entry["buckets"], self._buckets)]
            finite = all(all_finite(b) for b in buckets)
            self._in_flight.append(_InFlight(int(entry["step"]), CompletedWork(_RingResult(buckets, report, finite, None))))
        if self._feedback is not None and state.get("error_feedback"):
            self._feedback.load_state_dict(state["error_feedback"])
        if state.get("compressor") and hasattr(self._compressor, "load_state_dict"):
            self._compressor.load_state_dict(state["compressor"])

    # ----------------------------------------------------------------------------------------- internals
    def _mark_fresh(self, _param: torch.Tensor) -> None:
        self._fresh_grads = True

    def _check_usage(self) -> None:
        current = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        if current != self._param_ids:
            raise RuntimeError("the optimizer's parameter groups changed after wrapping; build a new PipeSGD")
        if not self._fresh_grads and self._params:
            raise RuntimeError(
                "step() without a backward() since the last step(): the same gradients would be sent twice"
            )

    def _acquire_buffers(self) -> list[torch.Tensor]:
        return self._free_buffers.pop() if self._free_buffers else [b.empty() for b in self._buckets]

    def _submit(self, buffers: list[torch.Tensor], step: int) -> Work[_RingResult]:
        if self._worker is None:
            return CompletedWork(self._allreduce(buffers, step))
        return self._worker.submit(self._allreduce, buffers, step)

    def _allreduce(self, buffers: list[torch.Tensor], step: int) -> _RingResult:
        """Runs on the background worker: one ring per bucket, then the checks the caller must not sync for."""
        report = RingReport()
        for index, flat in enumerate(buffers):
            if self.allreduce == "backend":
                report.add(backend_allreduce_(flat, self._topology, "mean"))
                continue
            residual = self._feedback.residual(index, flat) if self._feedback else None
            report.add(ring_allreduce_(flat, self._compressor, self._topology, "mean", residual))
        finite = all(all_finite(flat) for flat in buffers)
        norm = self._feedback.residual_norm() if self._feedback else None
        return _RingResult(buffers, report, finite, norm)

    def _apply(self, entry: _InFlight, step: int) -> StepStats:
        start = time.perf_counter()
        result = entry.handle.wait()
        waited = time.perf_counter() - start
        stats = StepStats(
            step=step,
            applied_step=entry.step,
            t_wait_s=waited,
            t_comm_busy_s=result.report.busy_s,
            bytes_sent=result.report.bytes_sent,
            compression_ratio=(result.report.raw_bytes / result.report.bytes_sent) if result.report.bytes_sent else 1.0,
            residual_norm=result.residual_norm,
        )
        if not result.finite:
            if self.nonfinite == "raise":
                raise NonFiniteGradientError(
                    f"non-finite (NaN/Inf) averaged gradient from step {entry.step}; lower the learning rate, "
                    f"check the data, or pass nonfinite='skip' to skip such steps"
                )
            stats.skipped_nonfinite = True
            if self._feedback is not None:
                self._feedback.reset(nonfinite_only=True)
        else:
            for bucket, flat in zip(self._buckets, result.buckets):
                unpack_to_gradients(bucket, self._params, flat)
            start = time.perf_counter()
            self.optimizer.step()
            stats.t_update_s = time.perf_counter() - start
        if len(self._free_buffers) < self.width:
            self._free_buffers.append(result.buckets)
        return stats


def _communicated_params(optimizer: torch.optim.Optimizer, model_or_params) -> tuple[list, list[str]]:
    """The optimizer's trainable parameters, in the model's order, with their names."""
    if isinstance(model_or_params, torch.nn.Module):
        named = list(model_or_params.named_parameters())
    else:
        named = [(f"param{i}", p) for i, p in enumerate(model_or_params)]
    if not named:
        raise ValueError("the model has no parameters")
    in_model = {id(p) for _, p in named}
    in_optimizer = [p for g in optimizer.param_groups for p in g["params"]]
    foreign = [p for p in in_optimizer if id(p) not in in_model]
    if foreign:
        raise ValueError(f"the optimizer holds {len(foreign)} parameter(s) that are not in the model")
    wanted = {id(p) for p in in_optimizer if p.requires_grad}
    chosen = [(n, p) for n, p in named if id(p) in wanted]
    seen, params, names = set(), [], []
    for n, p in chosen:  # tied weights appear once
        if id(p) not in seen:
            seen.add(id(p))
            params.append(p)
            names.append(n)
    return params, names


def _private_group(group: dist.ProcessGroup | None, timeout_s: float | None) -> dist.ProcessGroup | None:
    """A new group over the same ranks (a collective call on every rank of the default group).

    ``timeout_s`` bounds every wait of the background ring: a dead or hung peer then surfaces as an error
    from ``step()`` instead of a hang (torch's own default is 30 minutes)."""
    if not dist.is_initialized():
        return None
    base = group if group is not None else dist.group.WORLD
    if dist.get_world_size(base) == 1:
        return None
    timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
    return dist.new_group(ranks=dist.get_process_group_ranks(base), backend=dist.get_backend(base), timeout=timeout)
