"""PipeSGD: a ``torch.optim.Optimizer`` that applies each step's averaged gradient K-1 steps late, so that the
all-reduce of step t runs in the background while step t+1 computes.

Each ``step()``: (1) this step's gradients leave in flat buckets (``pipesgd.grads.bucket_sets``) for the background
exchange (``pipesgd.comm``), (2) their handle joins the pipeline (``pipesgd.delay.pipeline``), (3) the step that is
due, if any, is waited for and applied by the wrapped optimizer (``pipesgd.delay.apply``). So
``w_{t+1} = w_t - lr * mean_i(g^i_{t-K+1})``: K = 1 is synchronous SGD, K = 2 is Pipe-SGD. The first
``warmup_steps`` are synchronous; ``flush()`` applies the last K-1. Optional parts: ``pipesgd.phases``.
Gradient accumulation (DDP's ``no_sync()``): call ``backward()`` several times, then ``step()`` once."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import torch
import torch.distributed as dist

from pipesgd import auto
from pipesgd.accounting import StepStats
from pipesgd.comm.exchange import ExchangeResult
from pipesgd.defaults import BUCKET_MB, STALENESS, WARMUP_STEPS
from pipesgd.delay.apply import NonFiniteGradientError  # noqa: F401 - public here too
from pipesgd.delay.pipeline import Pipeline
from pipesgd.grads.replica_check import check_replicas
from pipesgd.options import PipeSGDOptions, WrapperConfig
from pipesgd.phases import AutoPhase, ReplicaPhase, StalenessPhase
from pipesgd.wrapper_parts import WrapperParts
from pipesgd.wrapper_state import saved_auto


class PipeSGD(torch.optim.Optimizer):
    """Wraps a torch optimizer and averages gradients across ranks through a K-deep pipeline (module doc). Its
    ``param_groups`` and ``state`` are the wrapped optimizer's, so schedulers and trainers that take an optimizer
    take it."""

    # GradScaler.step(opt) calls step() directly and leaves the skipping to it: an overflow counts when the averaged
    # gradient that holds it is applied, on every rank alike (pipesgd.grads.amp).
    _step_supports_amp_scaling = True

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model_or_params,
        width: int | str = 2,
        compression: str = "none",
        error_feedback: bool = False,
        bucket_mb: float = BUCKET_MB,
        warmup_steps: int = WARMUP_STEPS,
        process_group: dist.ProcessGroup | None = None,
        staleness: str = STALENESS,
        options: PipeSGDOptions | None = None,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"PipeSGD wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.config = WrapperConfig(width=width, warmup_steps=warmup_steps, staleness=staleness,
                                    compression=compression, error_feedback=error_feedback, bucket_mb=bucket_mb,
                                    options=PipeSGDOptions() if options is None else options)
        self.optimizer = optimizer
        self._init_hooks()
        parts = self._parts = WrapperParts(self.config, optimizer, model_or_params, process_group)
        self._pipeline: Pipeline[ExchangeResult] = Pipeline(1 if width == auto.AUTO else width, warmup_steps)
        self._step = 0
        self._staleness: StalenessPhase | None = None
        self._set_width(self._pipeline.width)
        self._replicas = ReplicaPhase(self.config.options.check_replicas_every, self.check_replicas)
        self.last_stats = StepStats(step=-1, applied_step=None)
        self._auto = None
        if self.config.chooses:  # the warm-up times itself, and its last step chooses (pipesgd.auto)
            self._auto = AutoPhase(parts.build_chooser(optimizer, model_or_params), self._use_choice)
        parts.start(self, self._pipeline, self._staleness)

    def _init_hooks(self) -> None:
        """What ``torch.optim.Optimizer.__init__`` sets up besides the groups (which are the wrapped optimizer's):
        the hook registries and the profiled, hooked ``step``."""
        self.defaults = self.optimizer.defaults
        for kind in ("step_pre", "step_post", "state_dict_pre", "state_dict_post", "load_state_dict_pre",
                     "load_state_dict_post"):
            setattr(self, f"_optimizer_{kind}_hooks", OrderedDict())  # torch's hook handles hold weak references
        self._patch_step_function()

    # ----------------------------------------------------------------------------------------- the optimizer view
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def add_param_group(self, param_group: dict) -> None:
        raise RuntimeError("PipeSGD's parameters are fixed when it wraps: add the group to the torch optimizer "
                           "before wrapping it (build a new PipeSGD)")

    # ----------------------------------------------------------------------------------------- what it runs
    @property
    def width(self) -> int | str:
        """The pipeline's width; with ``width="auto"``, "auto" until the warm-up's end chooses it."""
        return self.config.width

    @property
    def warmup_steps(self) -> int:
        return self.config.warmup_steps

    @property
    def compression(self) -> str:
        return self.config.compression

    @property
    def allreduce(self) -> str:
        """The all-reduce that runs the buckets: "ring", "alltoall" or "backend" ("auto" resolved)."""
        return self._parts.exchange.allreduce

    @property
    def auto_choice(self) -> dict | None:
        """With ``width`` or ``compression`` "auto": the choice and its reason once made or restored."""
        return self._auto.chooser.choice if self._auto is not None else None

    @property
    def world_size(self) -> int:
        return self._parts.channel.size

    @property
    def in_flight(self) -> int:
        """How many steps' gradients are handed off and not yet applied."""
        return len(self._pipeline)

    @property
    def bucket_memory_bytes(self) -> int:
        """Bytes of flat bucket sets allocated so far: K x the gradient bytes in a width-K pipeline."""
        return self._parts.sets.allocated * self._parts.sets.set_bytes

    @property
    def lookahead_memory_bytes(self) -> int:
        """Bytes that look-ahead holds beside plain width K (0 without it): the master weights, the stand-ins in
        flight, the replay's optimizer state and the shared stand-in's sets."""
        return self._staleness.memory_bytes if self._staleness is not None else 0

    # ----------------------------------------------------------------------------------------- the algorithm
    def step(self, closure=None) -> StepStats:
        """Hand this step's gradients to the background exchange; apply the averaged gradient of step t-K+1 if due.
        A ``closure`` (as torch optimizers take) is called once first, to compute the gradients."""
        if closure is not None:
            with torch.enable_grad():
                closure()
        try:
            return self._step_once()
        except BaseException:
            for left_by_a_scaler in ("found_inf", "grad_scale"):  # GradScaler.step deletes them only on success
                self.__dict__.pop(left_by_a_scaler, None)
            raise

    def _step_once(self) -> StepStats:
        self._parts.check_usage(self)
        t = self._step
        self._parts.begin(t)
        if self._auto is not None:
            self._auto.begin(t)
        staleness = self._staleness
        if staleness is not None:
            staleness.begin()
        self._submit(t)  # Steps 1-2
        due = self._pipeline.pop_due(t)  # Step 3
        applied = self._parts.apply(due, t, self._lookahead) if due is not None else StepStats(t, None)
        if staleness is not None:
            staleness.end(applied)
        if self._auto is not None:
            self._auto.end(t, applied)
        self._step += 1
        self.last_stats = applied
        self._replicas.end(self._step, applied)
        if self._parts.loss_scale is not None:
            self._parts.loss_scale.end(self)
        return applied

    def _submit(self, t: int) -> None:
        """Steps 1-2: this step's buckets to the exchange, its handle into the pipeline."""
        parts = self._parts
        applies = len(self._pipeline) + 1 >= self._pipeline.depth(t)
        buffers = parts.hand_off(t, keep_local=not applies)
        run, job = parts.participation.exchange, parts.exchange
        if self._staleness is not None:
            scale = parts.loss_scale.scale_of(t) if parts.loss_scale is not None else None
            run, job = self._staleness.hand_off(t, self._pipeline, applies, buffers.slots, scale, run, job)
        self._pipeline.submit(t, parts.channel.submit(run, job, buffers, t))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``; a gradient that is a bucket view stays one and is zeroed even for
        ``set_to_none=True`` (so the next backward writes into the bucket)."""
        self._parts.zero_grad(set_to_none)

    def flush(self) -> list[StepStats]:
        """Wait for every in-flight step and apply it, oldest first, so no gradient is lost; then sync the module
        buffers, so replicas end bitwise identical. Marks this rank's data as ended: a peer that still steps gets
        ``UnevenInputsError`` naming this rank (every rank must flush after the same number of steps)."""
        if self._lookahead is not None:
            self._lookahead.restore()
        if self._parts.loss_scale is not None:
            self._parts.loss_scale.user_updates = False  # outside scaler.step(opt): the wrapper updates the scaler
        applied = self._parts.flush(self._pipeline, self._step, self._lookahead, self._staleness)
        if applied:
            self.last_stats = applied[-1]
        return applied

    def sync_buffers(self) -> None:
        """Make the module buffers identical on every rank now, per ``PipeSGDOptions.buffers`` (a collective: every
        rank calls it), e.g. before every rank evaluates mid-training. ``flush()`` and ``consolidate_state_dict()`` do
        it themselves. Under "broadcast" (the default) an evaluation on rank 0 alone needs none: rank 0's buffers are
        the ones every rank gets; under "average" rank 0's own are not the mean until this runs."""
        self._parts.buffer_sync()

    def check_replicas(self, buffers: bool = True) -> None:
        """Raise ReplicaDivergenceError if any parameter or (with ``buffers``) synced buffer differs bitwise across
        ranks (a collective; with ``buffers`` they are synced first, as at every meeting of the ranks)."""
        parts = self._parts
        if buffers:
            parts.buffer_sync()
        synced, names = (parts.buffer_sync.buffers, parts.buffer_sync.names) if buffers else ([], [])
        params = self._lookahead.master_params() if self._lookahead is not None else parts.params
        check_replicas(params + synced, parts.names + names, self._step, parts.user_group)

    def close(self) -> None:
        """Stop the background worker (after flush: steps still in flight are never applied); the wrapper cannot
        step afterwards. A script that ends without it is closed at exit, with a warning if steps were in flight."""
        self._parts.close()
        if self._staleness is not None:
            self._staleness.close()

    # ----------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """A torch optimizer's ``"state"`` and ``"param_groups"`` (the wrapped one's) and, under ``"pipesgd"``, the
        averaged gradients in flight, loss scales and each rank's own state (error-feedback residuals, codec random
        state, look-ahead stand-ins; every rank's after ``consolidate_state_dict()``, ``pipesgd.wrapper_state``).
        Waits for in-flight exchanges. Not a collective: saving on rank 0 alone is fine."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        self._parts.snapshots.saved()
        chosen = self._auto.chooser.saved if self._auto is not None else None  # None until the warm-up chose
        state = self._parts.state.state_dict(self._step, chosen)
        for hook in self._optimizer_state_dict_post_hooks.values():
            state = hook(self, state) or state
        return state

    def consolidate_state_dict(self, to: int = 0) -> None:
        """A collective, as ``ZeroRedundancyOptimizer``'s: every rank calls it (before ``if rank == to: torch.save``),
        gathering each rank's own state onto ``to``; raises within seconds if a rank does not (``wrapper_state``)."""
        if not isinstance(to, int) or not 0 <= to < self.world_size:
            raise ValueError(f"to must be a rank of the group (0..{self.world_size - 1}), got {to!r}")
        self._parts.state.consolidate(to, self._step)
        self._parts.buffer_sync()  # every rank's model saves the same buffers

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()`` saved on any rank; refuses one from another model, width, codec or world size.
        Wrap first, then load (a plain torch optimizer loads it too, losing its steps in flight; wrapping warns)."""
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            state = hook(self, state) or state
        if len(self._pipeline):
            raise RuntimeError("load_state_dict() with steps in flight; call flush() first")
        if self._auto is not None and saved_auto(state):
            self._auto.chooser.restore(saved_auto(state))  # the saved choice, not a new measurement
            self._use_choice(self._auto.chooser.saved, None)
        self._step = self._parts.state.load_state_dict(state)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)

    # ----------------------------------------------------------------------------------------- width and codec
    @property
    def _lookahead(self):
        return self._staleness.lookahead if self._staleness is not None else None

    def _set_width(self, width: int) -> None:
        """Look-ahead for a pipeline of ``width`` (none at width 1 or with ``staleness="none"``); nothing in flight."""
        if self._staleness is not None:
            self._staleness.close()
        self._staleness = None
        config, parts = self.config, self._parts
        if config.staleness == "lookahead" and width > 1:
            self._staleness = StalenessPhase(
                self.optimizer, parts.params, parts.model, parts.buckets, parts.channel.topology, parts.device, width,
                config.options.lookahead_standin, config.options.max_grad_norm,
                config.options.nonfinite == "skip", parts.channel.size)

    def _use_choice(self, choice: dict, stats: StepStats | None) -> None:
        """Run ``choice``'s width and codec from the next step on (``pipesgd.auto``): what is in flight is applied
        first, as ``flush()`` does, its waits added to ``stats``. A provisional codec (the warm-up's) changes the
        exchange alone: the config and a checkpoint's names stay "auto" until the choice."""
        loss_scale = self._parts.loss_scale
        for entry in self._pipeline.flush():
            if loss_scale is not None and loss_scale.user_updates:  # inside scaler.step(opt): close the last apply
                loss_scale.end(self)
                loss_scale.scaler.update()
            stats.t_wait_s += self._parts.apply(entry, self._step, self._lookahead).t_wait_s
        if stats is not None:
            stats.auto_choice = auto.describe(choice)
        width = choice.get("width") or self._pipeline.width  # the width only when it was chosen
        runs = replace(self.config, compression=choice["compression"], error_feedback=bool(choice["error_feedback"]),
                       options=replace(self.config.options, auto_recheck_every=0))
        if not choice.get("provisional"):  # the re-check interval lives on in the chooser, which keeps choosing
            self.config = runs = replace(runs, width=width)
        allreduce = choice.get("allreduce") if choice["compression"] != "none" else None  # measured (pipesgd.auto)
        self._parts.use_exchange(runs, allreduce)
        if width != self._pipeline.width:
            self._pipeline.width = width
            self._set_width(width)
        self._parts.state.use(self._parts.exchange, self._lookahead, self.config.width, self.config.compression,
                              self._staleness.coarse if self._staleness is not None else None)
