"""PipeSGD: the optimizer wrapper that delays the application of averaged gradients by K-1 steps.

Each ``step()``:
  Step 1: this step's gradients in a set of flat buckets (``bucket_sets``): with ``gradient_as_bucket_view``
          (the default) ``p.grad`` already is a view into it, so nothing is copied, and the views move to
          another set before the ring owns this one; without it the gradients are copied in.
  Step 2: hand the buckets to the background ring (``channel`` + ``exchange``: a thread; on CUDA a side
          stream too) and its handle to the pipeline (``pipeline``).
  Step 3: make the module buffers identical across ranks (``buffers``: forward t+1 sees them; under a delayed
          buffer mode a snapshot rode step t's job instead and is written back when step t is applied).
  Step 4: if the pipeline says a step is due (K in flight, 1 during warm-up), wait for it, write its averaged gradient
          into ``p.grad`` (views into its set, or a copy; unscaled with its own step's loss scale under ``amp``), clip
          it (``clipping``) and run the wrapped optimizer on it (a non-finite one raises or is skipped).
So ``w_{t+1} = w_t - lr * mean_i(g^i_{t-K+1})``: K = 1 is synchronous AllReduce SGD, K = 2 is Pipe-SGD. Every gradient
is applied exactly once: during the K-1 steps after warm-up the pipeline fills and ``step()`` applies nothing;
``flush()`` applies the last K-1 at the end.

Data path, one module per stage: ``buckets`` (pack) -> ``compression`` (codec; error feedback) -> ``ring``
or ``alltoall`` over ``topology``, run per step by ``exchange`` on the ``channel``'s worker ->
``pipeline`` (which step is due) -> this wrapper (apply) -> the wrapped torch optimizer. ``options`` validates
what the wrapper is asked. Every job carries an agreement on which ranks still train (``uneven``; posted beside the
all-reduce, read after it), so uneven data ends in an error naming the rank that ran out instead of a hang.

Gradient accumulation (DDP's ``no_sync()``): call ``backward()`` several times, then ``step()`` once; the gradients
accumulated in ``p.grad`` are handed off, so nothing is sent in between (scale the loss by 1/N, as DDP users do).

Warm-up (``pipesgd.defaults.WARMUP_STEPS``): a few synchronous steps first, where staleness hurts most; 0: none.
``width``/``compression`` "auto": chosen at the warm-up's end from what it measured, and re-checked (``auto``).
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch
import torch.distributed as dist

from pipesgd import auto, lifecycle
from pipesgd.accounting import StepStats
from pipesgd.grads.amp import DelayedLossScale
from pipesgd.grads.buffers import BufferSync
from pipesgd.grads.bucket_sets import BucketSets
from pipesgd.grads.buckets import build_buckets
from pipesgd.comm.channel import open_private_channel, private_group
from pipesgd.defaults import BUCKET_MB, GRADIENT_AS_BUCKET_VIEW, STALENESS, WARMUP_STEPS, resolve_lookahead_standin
from pipesgd.comm.exchange import ExchangeResult
from pipesgd.comm.groups import require_group
from pipesgd.init_sync import sync_initial_state
from pipesgd.delay.apply import DelayedApply, NonFiniteGradientError  # noqa: F401 - public here too
from pipesgd.delay.coarse import CoarseAverage
from pipesgd.delay.lookahead import Lookahead
from pipesgd.options import PipeSGDOptions
from pipesgd.params import FreshGradients, communicated_params
from pipesgd.delay.pipeline import Pipeline
from pipesgd.grads.replica_check import check_replicas
from pipesgd.comm.uneven import Participation
from pipesgd.wrapper_state import WrapperIdentity, WrapperState


class PipeSGD:
    """Wraps a torch optimizer; averages gradients across ranks with a K-deep pipeline (see module doc). Schedulers
    and anything else that needs a ``torch.optim.Optimizer`` use ``opt.optimizer``."""

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
        nonfinite: str = "raise",
        check_replicas_every: int = 0,
        compression_options: dict | None = None,
        allreduce: str = "auto",
        timeout_s: float | None = None,
        max_grad_norm: float | None = None,
        buffers: str = "broadcast",
        grad_scaler: torch.amp.GradScaler | None = None,
        gradient_as_bucket_view: bool = GRADIENT_AS_BUCKET_VIEW,
        check_uneven: bool = True,
        init_sync: bool = True,
        staleness: str = STALENESS,
        auto_recheck_every: int = 0,
        lookahead_reach: float = 1.0,
        lookahead_standin: str = "auto",
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"PipeSGD wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.options = PipeSGDOptions(
            width=width, warmup_steps=warmup_steps, compression=compression,
            compression_options=compression_options or {}, error_feedback=error_feedback, bucket_mb=bucket_mb,
            allreduce=allreduce, timeout_s=timeout_s, nonfinite=nonfinite, check_replicas_every=check_replicas_every,
            max_grad_norm=max_grad_norm, buffers=buffers, grad_scaler=grad_scaler,
            gradient_as_bucket_view=gradient_as_bucket_view, check_uneven=check_uneven, init_sync=init_sync,
            staleness=staleness, auto_recheck_every=auto_recheck_every, lookahead_reach=lookahead_reach,
            lookahead_standin=lookahead_standin,
        )
        user_group = require_group(process_group, "PipeSGD")
        if not isinstance(model_or_params, torch.nn.Module):
            model_or_params = list(model_or_params)  # read more than once: a generator would be used up
        self.optimizer = optimizer
        # What travels: the optimizer's trainable parameters, packed into flat buckets.
        self._params, self._names = communicated_params(optimizer, model_or_params)
        self._param_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        self._buckets = build_buckets(self._params, self.options.bucket_bytes)
        # width="auto": synchronous (1) until the warm-up's end chooses (pipesgd.auto)
        running_width = 1 if width == auto.AUTO else width
        self._sets = BucketSets(self._buckets, self._params, gradient_as_bucket_view,
                                keep=auto.MAX_WIDTH if width == auto.AUTO else width)
        # Every rank starts from rank 0's parameters and buffers, as DDP does when it wraps (on the caller's group,
        # before any background traffic exists).
        timed = auto.AUTO in (width, compression)  # its time is the link's first reading (pipesgd.auto)
        initial = sync_initial_state(model_or_params, user_group, latency=timed) if init_sync else None
        # How it travels: a private group with its own worker, one codec seeded for this rank.
        rank = dist.get_rank()
        device = self._device = self._params[0].device if self._params else torch.device("cpu")
        self._user_group = process_group
        self._channel = open_private_channel(process_group, device, timeout_s)
        self._exchange = self.options.build_exchange(self._channel.topology, rank, device)
        agreeing = self.options.check_uneven and self._channel.size > 1
        self._participation = Participation(self._channel.topology, device,
                                            private_group(process_group, timeout_s) if agreeing else None, agreeing)
        # Buffers on the caller's group and thread (see pipesgd.grads.buffers); loss scales per in-flight step.
        self._buffer_sync = BufferSync(model_or_params, buffers, process_group)
        enabled = grad_scaler is not None and grad_scaler.is_enabled()
        self._loss_scale = DelayedLossScale(grad_scaler, optimizer) if enabled else None
        self._apply = DelayedApply(optimizer, self._params, self._sets, self._buffer_sync, self._loss_scale, nonfinite,
                                   self.options.max_grad_norm)
        # When it is applied.
        self._pipeline: Pipeline[ExchangeResult] = Pipeline(running_width, warmup_steps)
        self._step = 0
        # Set by backward: the hooks hold this flag, not the wrapper (autograd keeps hooks where the garbage
        # collector cannot see them, so a hook bound to the wrapper would keep it alive as long as the model).
        self._fresh = FreshGradients()
        self._hooks = [p.register_post_accumulate_grad_hook(self._fresh.mark) for p in self._params]
        # Staleness compensation: gradients computed at the weights the steps in flight will produce (lookahead).
        self._model, self._lookahead, self._lookahead_hooks = model_or_params, None, []
        self._set_lookahead(running_width)
        self.last_stats = StepStats(step=-1, applied_step=None)
        # Rings still in flight when the script ends finish before the interpreter stops their thread (lifecycle).
        self._background = lifecycle.Background(self._channel, self._participation, self._pipeline, timeout_s)
        self._closer = lifecycle.close_when_dropped(self, self._background)
        identity = WrapperIdentity(width, warmup_steps, compression, self._channel.size, dist.get_rank(user_group))
        self._state = WrapperState(identity, optimizer, self._params, self._buckets, self._pipeline, self._exchange,
                                   self._loss_scale, self._lookahead, user_group, self._coarse)
        # width or compression "auto": the warm-up times itself, and its last step chooses (pipesgd.auto).
        self._auto = None
        if auto.AUTO in (width, compression):
            knobs = auto.Knobs.of(width, compression, error_feedback, type(optimizer).__mro__, staleness == "lookahead")
            trial = (self.options.allreduce == "auto" and self._channel.size > 1  # where the rule says exchange
                     and not self._channel.topology.stages(self._device))
            self._auto = auto.AutoConfig(self._buckets, knobs, warmup_steps, user_group, auto_recheck_every,
                                         self.options.compression_options, trial_allreduce=trial, initial=initial)
            self._hooks += self._auto.attach(model_or_params)  # where step 0's compute begins

    # ----------------------------------------------------------------------------------------- public
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def width(self) -> int | str:
        """The pipeline's width; with ``width="auto"``, "auto" until the warm-up's end chooses it."""
        return self.options.width

    @property
    def warmup_steps(self) -> int:
        return self.options.warmup_steps

    @property
    def compression(self) -> str:
        return self.options.compression

    @property
    def allreduce(self) -> str:
        """The all-reduce that runs the buckets, "ring", "alltoall" or "backend" ("auto" resolved)."""
        return self._exchange.allreduce

    @property
    def auto_choice(self) -> dict | None:
        """With ``width`` or ``compression`` "auto": the choice and its reason once made or restored, the latest
        re-check's after a switch (``pipesgd.auto``)."""
        return self._auto.choice if self._auto is not None else None

    @property
    def world_size(self) -> int:
        return self._channel.size

    @property
    def in_flight(self) -> int:
        """How many steps' gradients are handed off and not yet applied."""
        return len(self._pipeline)

    @property
    def bucket_memory_bytes(self) -> int:
        """Bytes of flat bucket sets allocated so far (in flight, applied or free): K x the gradient bytes in a
        width-K pipeline. With ``gradient_as_bucket_view`` they hold ``p.grad`` too; without, add the gradients."""
        return self._sets.allocated * self._sets.set_bytes

    @property
    def lookahead_memory_bytes(self) -> int:
        """Bytes that look-ahead holds beside plain width K (0 without it): a copy of the weights, this rank's
        gradients of the K-1 steps in flight and the replay's copy of the optimizer state
        (``pipesgd.delay.lookahead``), and the coarse averages' bucket sets (``pipesgd.delay.coarse``)."""
        coarse = self._coarse.memory_bytes if self._coarse is not None else 0
        return self._lookahead.memory_bytes + coarse if self._lookahead is not None else 0

    def step(self) -> StepStats:
        """Hand this step's gradients to the ring; apply the averaged gradient of step t-K+1 if due."""
        self._check_usage()
        t, auto_start = self._step, time.perf_counter()
        early = self._auto.begin(t) if self._auto is not None else None
        if early is not None:  # a clearly slow link: this step's own exchange runs the provisional codec (auto)
            self._use_choice(early)
        t_auto = time.perf_counter() - auto_start
        lookahead = self._lookahead
        if lookahead is not None:  # the master weights back before anything is applied to them
            lookahead.begin_step()
        # Step 1: the gradients' bucket set (p.grad no longer points into it once this returns).
        applies = len(self._pipeline) + 1 >= self._pipeline.depth(t)
        if lookahead is not None and applies and len(self._pipeline):  # the due step's stand-in is done with
            lookahead.discard(self._pipeline.entries()[0].step)
        buffers = self._sets.hand_off(keep_local=not applies)
        self._fresh.value = False
        if self._loss_scale is not None:
            self._loss_scale.record(t)
        # Step 2: hand off (under a delayed buffer mode with a snapshot of the buffers, reduced after the buckets).
        job, t_buffers = self._buffer_sync.job(self._exchange, self._channel)
        run, coarse = self._participation.exchange, None
        if lookahead is not None and self._pipeline.depth(t) > 1:  # its stand-in while its average is in flight
            if self._coarse is not None:  # every rank's coarse average first (pipesgd.delay.coarse)
                run, job, coarse = self._coarse.wrap(run, job, self._pipeline.width)
            lookahead.record(t, buffers.slots, self._loss_scale.scale_of(t) if self._loss_scale else None, later=coarse)
        self._pipeline.submit(t, self._channel.submit(run, job, buffers, t))
        # Step 3: buffers, while the ring runs.
        if self._buffer_sync.active and not self._buffer_sync.delayed:
            start = time.perf_counter()
            self._buffer_sync()
            t_buffers = time.perf_counter() - start
        # Step 4: apply the oldest when the pipeline is full (depth 1 during warm-up).
        due = self._pipeline.pop_due(t)
        stats = self._apply(due, t, self._lookahead) if due is not None else StepStats(step=t, applied_step=None)
        stats.t_buffers_s = t_buffers
        if lookahead is not None:
            stats.t_lookahead_s, waited, in_forward = lookahead.end_step()
            stats.t_wait_s += waited  # for coarse stand-ins (pipesgd.delay.coarse), mostly in the last forward pass
            stats.t_standin_wait_s = in_forward if self._coarse is not None else None
        if self._auto is not None:  # the warm-up's end, or a re-check that switches
            auto_start, stats.auto_choice = time.perf_counter(), auto.describe(early) if early is not None else None
            applied = stats.applied_step is not None  # the exchange's and the optimizer's times only then
            choice = self._auto.end(t, stats.t_comm_busy_s if applied else None,
                                    stats.t_wait_s + (stats.t_buffers_s or 0.0), stats.t_update_s if applied else None)
            if choice is not None:
                self._use_choice(choice, stats)
                self._auto.switched()
            stats.t_auto_s = t_auto + time.perf_counter() - auto_start
        self._step += 1
        self.last_stats = stats
        every = self.options.check_replicas_every
        if every and self._step % every == 0:
            # delayed buffers are identical only after a step that applied one (not while the pipeline fills)
            self.check_replicas(buffers=not self._buffer_sync.delayed or stats.applied_step is not None)
        return stats

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``; with ``gradient_as_bucket_view`` a gradient that is a bucket view
        stays one and is zeroed even for ``set_to_none=True`` (so the next backward writes into the bucket)."""
        if self._fresh.value:
            raise RuntimeError(
                "zero_grad() after backward() but before step() would discard this step's gradients; "
                "call step() first (or the inner optimizer's zero_grad() to drop them on purpose)"
            )
        # With views both modes keep them and zero them (pipesgd.grads.bucket_sets): a None would make the next backward
        # allocate fresh gradients that step() copies in again, which measures slower than a zero fill plus an
        # accumulating add (experiments/bench_bucket_views.py).
        self._sets.zero_grad(self.optimizer, set_to_none)

    def flush(self) -> list[StepStats]:
        """Wait for every in-flight step and apply it, oldest first, so no gradient is lost; then sync the module
        buffers (``buffers`` mode's reduction, the ``-delayed`` ones at once), so replicas end bitwise identical.

        Marks this rank's data as ended: a peer that still steps gets ``UnevenInputsError`` naming this rank,
        and so does this rank (every rank must flush after the same number of steps; ``check_uneven``)."""
        alone = self._channel.size == 1
        if self._lookahead is not None:
            self._lookahead.restore()
        # Joins a peer's job of this step with zeros if that peer still trains (then both raise, naming this rank).
        def shadow() -> None:
            job = self._buffer_sync.job(self._exchange, self._channel)[0]
            if self._coarse is not None and self._pipeline.depth(self._step) > 1:  # as the peers' step() sends
                job = self._coarse.wrap(None, job, self._pipeline.width)[1]
            job([b.empty().zero_() for b in self._buckets])

        finished = None if alone else self._channel.submit(self._participation.finish, self._step, shadow)
        applied = [self._apply(entry, self._step, self._lookahead) for entry in self._pipeline.flush()]
        if finished is not None:
            finished.wait()
        # Replicas whole for saving and evaluation: a forward since the last step() (an odd last micro-batch) moved
        # this rank's running statistics; sync them as step() does (once every rank is known to have flushed).
        self._buffer_sync()
        if applied:
            self.last_stats = applied[-1]
        return applied

    def check_replicas(self, buffers: bool = True) -> None:
        """Raise ReplicaDivergenceError if any parameter or (with ``buffers``) synced buffer differs bitwise across
        ranks."""
        synced, names = (self._buffer_sync.buffers, self._buffer_sync.names) if buffers else ([], [])
        params = self._lookahead.master_params() if self._lookahead is not None else self._params
        check_replicas(params + synced, self._names + names, self._step, self._user_group)

    def close(self) -> None:
        """Stop the background worker (after flush: steps still in flight are never applied); the wrapper cannot
        step afterwards. A script that ends without it is closed at exit, with a warning if steps were in flight."""
        if self._closer.detach() is not None:  # not closed yet
            self._background.close(warn=False)
        for hook in self._hooks + self._lookahead_hooks:
            hook.remove()

    def state_dict(self) -> dict:
        """Inner optimizer state, averaged gradients still to be applied, loss scales, and this rank's own state
        (error-feedback residuals, codec random state, look-ahead stand-ins) keyed by rank; after
        ``consolidate_state_dict()`` at the same step, every rank's (``pipesgd.wrapper_state``).

        Waits for in-flight rings. Not a collective: saving on rank 0 alone is fine."""
        state = self._state.state_dict(self._step)
        if self._auto is not None:
            state["auto"] = self._auto.saved  # None until the warm-up chose a codec or its last step chose
        return state

    def consolidate_state_dict(self, to: int = 0) -> None:
        """A collective (every rank of the wrapper's group calls it): gather each rank's own state onto group rank
        ``to``, so that its ``state_dict()`` at this step restores every rank exactly, as torch's
        ``ZeroRedundancyOptimizer.consolidate_state_dict``. Then ``if rank == to: torch.save(opt.state_dict())``."""
        if not isinstance(to, int) or not 0 <= to < self.world_size:
            raise ValueError(f"to must be a rank of the group (0..{self.world_size - 1}), got {to!r}")
        self._state.consolidate(to, self._step)

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()`` saved on any rank; refuses one from another model, width, codec or world
        size. Wrap first, then load (the state is PipeSGD's, not the inner optimizer's)."""
        if self._auto is not None and isinstance(state, dict) and state.get("auto"):
            self._auto.restore(state["auto"])  # the saved choice, not a new measurement
            self._use_choice(self._auto.saved)
        self._step = self._state.load_state_dict(state)

    # ----------------------------------------------------------------------------------------- internals
    def _check_usage(self) -> None:
        current = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        if current != self._param_ids:
            raise RuntimeError("the optimizer's parameter groups changed after wrapping; build a new PipeSGD")
        if not self._fresh.value and self._params:
            raise RuntimeError(
                "step() without a backward() since the last step(): the same gradients would be sent twice"
            )

    def _use_choice(self, choice: dict, stats: StepStats | None = None) -> None:
        """Run ``choice``'s width and codec from the next step on (``pipesgd.auto``): at the warm-up's end, at a
        re-check that switches (what is in flight is applied first, as ``flush()`` does, its waits added to
        ``stats``), at the early look (nothing in flight), or before a resumed run's first step. A provisional codec
        (the warm-up's) changes the exchange alone: the options and a checkpoint's names stay "auto" until the choice."""
        for entry in self._pipeline.flush():
            stats.t_wait_s += self._apply(entry, self._step, self._lookahead).t_wait_s
        if stats is not None:
            stats.auto_choice = auto.describe(choice)
        width = choice.get("width") or self._pipeline.width  # a choice saved before width="auto" existed: none
        # what runs (the re-check interval lives on in self._auto, which keeps choosing)
        runs = replace(self.options, compression=choice["compression"], error_feedback=bool(choice["error_feedback"]),
                       auto_recheck_every=0)
        if not choice.get("provisional"):
            self.options = runs = replace(runs, width=width)
        old = self._exchange
        measured = replace(runs, allreduce=choice.get("allreduce", self.options.allreduce)  # pipesgd.auto
                           if choice["compression"] != "none" else self.options.allreduce)
        self._exchange = measured.build_exchange(self._channel.topology, dist.get_rank(), self._device)
        new = self._exchange
        if old.feedback is not None and new.feedback is not None and old.allreduce == new.allreduce:
            new.feedback.load_residuals_state(old.feedback.residuals_state())  # what is still owed
        if width != self._pipeline.width:
            self._pipeline.width = width
            self._set_lookahead(width)
        self._state.use(self._exchange, self._lookahead, self.options.width, self.options.compression, self._coarse)

    def _set_lookahead(self, width: int) -> None:
        """Look-ahead for a pipeline of ``width`` (none at width 1 or with ``staleness="none"``); nothing in flight."""
        for hook in self._lookahead_hooks:
            hook.remove()
        self._lookahead, self._lookahead_hooks, self._coarse = None, [], None
        if self.options.staleness == "lookahead" and width > 1:
            standin = resolve_lookahead_standin(self.options.lookahead_standin, type(self.optimizer).__mro__)
            if standin != "local" and self._channel.size > 1:  # alone: the own gradient is the average
                self._coarse = CoarseAverage(standin, self._buckets, self._params, self._channel.topology, self._device,
                                             width)
            self._lookahead = Lookahead(self.optimizer, self._params, width, self.options.max_grad_norm,
                                        skip_nonfinite=self.options.nonfinite == "skip",
                                        reach=self.options.lookahead_reach)
            self._lookahead_hooks = self._lookahead.attach(self._model)
