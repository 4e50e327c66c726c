"""What a PipeSGD checkpoint holds: a torch optimizer's ``state`` and ``param_groups`` (the inner one's) and, under
``pipesgd``, what every rank shares (step count, averaged gradients still to apply, their loss scales, what the
wrapper was built with: refused on load when it differs) and each rank's own state keyed by rank (error-feedback
residuals, codec random state, look-ahead stand-ins).

``state_dict()`` is not a collective, so a save on rank 0 holds rank 0's own state only: ``consolidate(to)`` (a
collective with a bounded wait, like ``ZeroRedundancyOptimizer.consolidate_state_dict``) gathers every rank's onto
``to``. Without it a rank whose own state is missing never takes another's: it starts with zero residuals, its own
codec seed and the averages in flight as stand-ins, and warns once (docs/wrapper.md, "Checkpoints")."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

from pipesgd.grads.amp import DelayedLossScale
from pipesgd.grads.bucket_sets import BucketSet
from pipesgd.grads.buckets import Bucket, layout_signature
from pipesgd.compression import codec_state, load_codec_state
from pipesgd.comm.exchange import GradientExchange
from pipesgd.comm.handles import CompletedWork
from pipesgd.delay.coarse import CoarseAverage
from pipesgd.delay.lookahead import Lookahead
from pipesgd.delay.pipeline import InFlight, Pipeline


PIPESGD_KEY = "pipesgd"  # beside a torch optimizer's own "state" and "param_groups": the wrapper's part
IN_FLIGHT_KEY = "pipesgd_steps_in_flight"  # in each saved param group while steps were in flight
# How long consolidate() waits for every rank: enough for ranks a step apart, far below gloo's default timeout.
ARRIVAL_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class WrapperIdentity:
    """What a checkpoint must share with the wrapper that loads it."""

    width: int | str  # "auto" until chosen
    warmup_steps: int
    compression: str
    world_size: int
    rank: int  # in the wrapper's group: the key of this rank's own state


def saved_auto(state) -> dict | None:
    """The ``pipesgd.auto`` choice a ``state_dict()`` keeps (None: none, or not such a state)."""
    part = state.get(PIPESGD_KEY) if isinstance(state, dict) else None
    return part.get("auto") if isinstance(part, dict) else None


class WrapperState:
    """Builds and restores a PipeSGD wrapper's ``state_dict()`` from its parts (see module doc)."""

    def __init__(self, identity: WrapperIdentity, optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
                 buckets: list[Bucket], pipeline: Pipeline, exchange: GradientExchange,
                 loss_scale: DelayedLossScale | None, lookahead: Lookahead | None,
                 group: dist.ProcessGroup | None, coarse: CoarseAverage | None = None) -> None:
        self.identity = identity
        self._optimizer, self._params, self._buckets = optimizer, params, buckets
        self._pipeline, self._exchange = pipeline, exchange
        self._loss_scale, self._lookahead = loss_scale, lookahead
        self._coarse = coarse  # a coarse stand-in's shared state (the low-rank subspace), the same on every rank
        self._group = group
        self._consolidated: tuple[int, dict[int, dict]] | None = None  # (step, every rank's own state)

    def state_dict(self, step: int, auto: dict | None = None) -> dict:
        """Waits for the rings in flight (so residuals are settled and averages known); ``auto``: the choice of
        ``pipesgd.auto`` to keep."""
        in_flight = []
        for entry in self._pipeline.entries():
            result = entry.handle.wait()
            in_flight.append({"step": entry.step, "buckets": [b.clone() for b in result.buckets],
                              "bytes_sent": result.report.bytes_sent, "raw_bytes": result.report.raw_bytes})
        ranks = {self.identity.rank: self._own_state()}
        if self._consolidated is not None and self._consolidated[0] == step:
            ranks = {**self._consolidated[1], **ranks}
        inner = self._optimizer.state_dict()
        # A plain torch optimizer that loads this keeps the marker in its groups: a later wrap warns (lost_steps).
        groups = [{**g, IN_FLIGHT_KEY: len(in_flight)} if in_flight else g for g in inner["param_groups"]]
        return {"state": inner["state"], "param_groups": groups, PIPESGD_KEY: {
            "step": step,
            "width": self.identity.width,
            "warmup_steps": self.identity.warmup_steps,
            "compression": self.identity.compression,
            "world_size": self.identity.world_size,
            "layout": layout_signature(self._params),
            "in_flight": in_flight,
            "loss_scales": self._loss_scale.state_dict() if self._loss_scale is not None else None,
            "standin": self._coarse.state_dict() if self._coarse is not None else None,
            "ranks": ranks,
            "auto": auto,
        }}

    def use(self, exchange: GradientExchange, lookahead: Lookahead | None, width: int, compression: str,
            coarse: CoarseAverage | None = None) -> None:
        """A width and codec chosen after construction (``pipesgd.auto``): its exchange and look-ahead, and the names
        a checkpoint holds."""
        self._exchange, self._lookahead, self._coarse = exchange, lookahead, coarse
        self.identity = replace(self.identity, width=width, compression=compression)

    def consolidate(self, to: int, step: int) -> None:
        """Every rank's own state onto group rank ``to`` (a collective of the wrapper's group)."""
        for entry in self._pipeline.entries():
            entry.handle.wait()
        mine = _to_cpu(self._own_state())
        size = self.identity.world_size
        if size == 1:
            self._consolidated = (step, {0: mine})
            return
        self._arrive()
        gathered = [None] * size if self.identity.rank == to else None
        dist.gather_object(mine, gathered, dst=dist.get_global_rank(self._group, to), group=self._group)
        if gathered is not None:
            self._consolidated = (step, dict(enumerate(gathered)))

    def _arrive(self) -> None:
        """Wait, at most ``ARRIVAL_WAIT_S``, for every rank to be in ``consolidate``: called on one rank only (inside
        ``if rank == 0:``) the gather would wait for gloo's default timeout of half an hour, with nothing said."""
        wait, arrival = timedelta(seconds=ARRIVAL_WAIT_S), None
        try:  # a small gloo group of its own, made for the call (checkpoints are rare; NCCL has no monitored barrier)
            ranks = dist.get_process_group_ranks(self._group if self._group is not None else dist.group.WORLD)
            arrival = dist.new_group(ranks, backend="gloo", timeout=wait, use_local_synchronization=True)
            dist.monitored_barrier(arrival, timeout=wait)
        except RuntimeError as error:  # gloo's DistBackendError is one
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
            raise RuntimeError(f"consolidate_state_dict() is a collective: every rank must call it (before "
                               f"`if rank == 0:`), but not every rank came within {ARRIVAL_WAIT_S:g} s ({first})"
                               ) from None
        finally:
            if arrival is not None:
                dist.destroy_process_group(arrival)

    def load_state_dict(self, state: dict) -> int:
        """Restore ``state`` (refusing one of another model, world size, width or codec); returns its step."""
        if not isinstance(state, dict) or "param_groups" not in state or PIPESGD_KEY not in state:
            raise ValueError(f"not a PipeSGD state_dict() (no {PIPESGD_KEY!r} part); a torch optimizer's own "
                             f"state loads into the optimizer before it is wrapped")
        inner = {"state": state["state"],
                 "param_groups": [{k: v for k, v in g.items() if k != IN_FLIGHT_KEY} for g in state["param_groups"]]}
        state = state[PIPESGD_KEY]
        for key, mine in (("layout", layout_signature(self._params)), ("world_size", self.identity.world_size),
                          ("width", self.identity.width), ("compression", self.identity.compression)):
            theirs = state.get(key)
            if key == "layout" and theirs is not None:
                theirs = [(tuple(shape), dtype) for shape, dtype in theirs]
            if theirs != mine:
                raise ValueError(f"PipeSGD state does not match this wrapper: {key} is {theirs!r}, expected {mine!r}")
        if len(self._pipeline):
            raise RuntimeError("load_state_dict() with steps in flight; call flush() first")
        if self._lookahead is not None and self._lookahead.active:
            raise RuntimeError("load_state_dict() between a forward pass and step(): the parameters hold the "
                               "look-ahead weights; load before the forward pass")
        self._optimizer.load_state_dict(inner)
        restored = []
        for entry in state["in_flight"]:
            buckets = [b.to(bucket.device) for b, bucket in zip(entry["buckets"], self._buckets)]
            result = self._exchange.restored(buckets, int(entry.get("bytes_sent", 0)), int(entry.get("raw_bytes", 0)))
            restored.append(InFlight(int(entry["step"]), CompletedWork(result)))
        self._pipeline.restore(restored)
        if self._loss_scale is not None:
            self._loss_scale.load_state_dict(state.get("loss_scales"))
        if self._coarse is not None:
            self._coarse.load_state_dict(state.get("standin"))
        own = (state.get("ranks") or {}).get(self.identity.rank)
        if own is not None:
            self._load_own_state(own)
        else:
            self._start_own_state(state, restored)
        return int(state["step"])

    # -- this rank's own part ------------------------------------------------------------------------------
    def _own_state(self) -> dict:
        feedback = self._exchange.feedback
        return {"compressor": codec_state(self._exchange.compressor),
                "residuals": feedback.residuals_state() if feedback is not None else None,
                "lookahead": self._lookahead.state_dict() if self._lookahead is not None else None}

    def _load_own_state(self, own: dict) -> None:
        feedback = self._exchange.feedback
        if feedback is not None:
            feedback.load_residuals_state(own.get("residuals") or {})
        load_codec_state(self._exchange.compressor, own.get("compressor"))
        if self._lookahead is not None:
            self._lookahead.load_state_dict(own.get("lookahead") or [])

    def _start_own_state(self, state: dict, restored: list[InFlight]) -> None:
        """No state of this rank's own in ``state`` (saved on another rank without ``consolidate``): start it
        afresh, never from another rank's (see module doc), and say so where it matters."""
        feedback = self._exchange.feedback
        if feedback is not None:
            feedback.load_residuals_state({})
        lost = ["error-feedback residuals"] if feedback is not None else []
        if codec_state(self._exchange.compressor):
            lost.append("codec random state")
        if self._lookahead is not None:
            self._lookahead.load_state_dict([])
            step = int(state["step"])  # the next step; step s's average is applied at step s + K - 1
            for entry in restored:  # the averages stand in for the local gradients this rank no longer has
                averaged = BucketSet(entry.handle.wait().buckets, self._buckets, self._params)
                scale = self._loss_scale.scale_of(entry.step) if self._loss_scale is not None else None
                uses = entry.step + self.identity.width - step
                self._lookahead.record(entry.step, averaged.slots, scale, uses)
            if restored:
                lost.append("look-ahead stand-ins (the averaged gradients in flight stand in)")
        if lost:
            saved = sorted((state.get("ranks") or {}).keys())
            warnings.warn(f"PipeSGD state holds the own state of rank(s) {saved} only, not of rank "
                          f"{self.identity.rank}: it starts its {', '.join(lost)} afresh. For an exact resume, call "
                          f"opt.consolidate_state_dict() on every rank before saving opt.state_dict() on one",
                          RuntimeWarning, stacklevel=3)


def _to_cpu(value):
    """``value`` with every tensor copied to the CPU (what ``gather_object`` pickles and rank ``to`` keeps)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
