"""The parts a PipeSGD wrapper is built from, and the mechanics of a step on them: which tensors travel and in which
buckets, the channel and its exchange, the agreement on uneven inputs, module buffers, loss scales, the delayed
apply, the end of background work, and the checkpoint. ``PipeSGD`` (``pipesgd.optimizer``) orders them into the
algorithm.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pipesgd import auto, lifecycle
from pipesgd.accounting import StepStats
from pipesgd.comm.channel import open_private_channel, private_group
from pipesgd.comm.groups import require_group
from pipesgd.comm.uneven import Participation
from pipesgd.delay.apply import DelayedApply
from pipesgd.delay.pipeline import Pipeline
from pipesgd.grads.amp import DelayedLossScale
from pipesgd.grads.bucket_sets import BucketSet, BucketSets
from pipesgd.grads.buckets import build_buckets
from pipesgd.grads.buffers import BufferSync
from pipesgd.init_sync import sync_initial_state
from pipesgd.options import WrapperConfig
from pipesgd.model_snapshot import ModelSnapshotGuard
from pipesgd.params import FreshGradients, UnusedParameters, communicated_params
from pipesgd.wrapper_state import WrapperIdentity, WrapperState


class WrapperParts:
    """Everything a wrapper holds besides its pipeline and its optional phases (``pipesgd.phases``)."""

    def __init__(self, config: WrapperConfig, optimizer: torch.optim.Optimizer, model_or_params,
                 process_group: dist.ProcessGroup | None) -> None:
        options = config.options
        self.user_group = require_group(process_group, "PipeSGD")
        if not isinstance(model_or_params, torch.nn.Module):
            model_or_params = list(model_or_params)  # read more than once: a generator would be used up
        self.model, self.optimizer, self.config = model_or_params, optimizer, config
        # What travels: the optimizer's trainable parameters, packed into flat buckets.
        self.params, self.names = communicated_params(optimizer, model_or_params)
        self._param_ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        self.buckets = build_buckets(self.params, config.bucket_bytes)
        self.sets = BucketSets(self.buckets, self.params, options.gradient_as_bucket_view,
                               keep=auto.MAX_WIDTH if config.width == auto.AUTO else config.width)
        # Every rank starts from rank 0's parameters and buffers, as DDP does when it wraps (on the caller's group,
        # before any background traffic exists); with "auto" its time is the link's first reading.
        self.initial = (sync_initial_state(model_or_params, self.user_group, latency=config.chooses)
                        if options.init_sync else None)
        # How it travels: a private group with its own worker, one codec seeded for this rank.
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.channel = open_private_channel(process_group, self.device, options.timeout_s)
        self.exchange = config.build_exchange(self.channel.topology, dist.get_rank(), self.device)
        agreeing = options.check_uneven and self.channel.size > 1
        self.participation = Participation(
            self.channel.topology, self.device,
            private_group(process_group, options.timeout_s) if agreeing else None, agreeing)
        # Buffers synced where the ranks meet, on the caller's group (pipesgd.grads.buffers); loss scales per step.
        self.buffer_sync = BufferSync(model_or_params, options.buffers, process_group)
        scaler = options.grad_scaler
        self.loss_scale = DelayedLossScale(scaler, optimizer) if scaler is not None and scaler.is_enabled() else None
        self.apply = DelayedApply(optimizer, self.params, self.sets, self.loss_scale,
                                  options.nonfinite, options.max_grad_norm,
                                  UnusedParameters(self.params, self.names, process_group, self.channel.size))
        # Set by backward: the hooks hold this flag, not the wrapper (autograd keeps hooks where the garbage
        # collector cannot see them, so a hook bound to the wrapper would keep it alive as long as the model).
        self.fresh = FreshGradients()
        self.hooks = [p.register_post_accumulate_grad_hook(self.fresh.mark) for p in self.params]

    def start(self, owner: object, pipeline: Pipeline, staleness) -> None:
        """Background work that ends with ``owner`` (``pipesgd.lifecycle``), and the checkpoint's view of the parts."""
        self.background = lifecycle.Background(self.channel, self.participation, pipeline, self.config.options.timeout_s)
        self.closer = lifecycle.close_when_dropped(owner, self.background)
        self.snapshots = ModelSnapshotGuard.at_wrap(pipeline, self.optimizer, self.model, self.hooks)
        config = self.config
        identity = WrapperIdentity(config.width, config.warmup_steps, config.compression, self.channel.size,
                                   dist.get_rank(self.user_group))
        self.state = WrapperState(identity, self.optimizer, self.params, self.buckets, pipeline, self.exchange,
                                  self.loss_scale, staleness.lookahead if staleness is not None else None,
                                  self.user_group, staleness.coarse if staleness is not None else None)

    def build_chooser(self, optimizer: torch.optim.Optimizer, model_or_params) -> auto.AutoConfig:
        """``width``/``compression`` "auto"'s chooser, hooked where step 0's compute begins."""
        config = self.config
        knobs = auto.Knobs.of(config.width, config.compression, config.error_feedback, type(optimizer).__mro__,
                              config.staleness == "lookahead")
        trial = (config.options.allreduce == "auto" and self.channel.size > 1  # where the rule says exchange
                 and not self.channel.topology.stages(self.device))
        chooser = auto.AutoConfig(self.buckets, knobs, config.warmup_steps, self.user_group,
                                  config.options.auto_recheck_every, config.options.compression_options,
                                  trial_allreduce=trial, initial=self.initial)
        self.hooks += chooser.attach(model_or_params)
        return chooser

    # -- a step's mechanics ----------------------------------------------------------------------------------
    def check_usage(self, wrapper: torch.optim.Optimizer) -> None:
        """Refuse a step the wrapper cannot take (and see whether a GradScaler called it)."""
        if self.loss_scale is not None:
            self.loss_scale.begin(wrapper)
        elif getattr(wrapper, "found_inf", None) is not None:
            raise ValueError("scaler.step(opt) on a PipeSGD needs the scaler in PipeSGDOptions(grad_scaler=scaler): "
                             "each applied gradient is unscaled with the scale of its own step")
        current = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        if current != self._param_ids:
            raise RuntimeError("the optimizer's parameter groups changed after wrapping; build a new PipeSGD")
        if not self.fresh.value and self.params:
            raise RuntimeError("step() without a backward() since the last step(): the same gradients would be "
                               "sent twice")

    def begin(self, step: int) -> None:
        """At a step's start: the first step agrees which parameters no rank's backward reaches, later ones refuse a
        gradient for one of them; a model-only snapshot taken with steps in flight is warned of."""
        self.apply.unused.observe(self.fresh, step)
        self.snapshots.check()

    def hand_off(self, step: int, keep_local: bool) -> BucketSet:
        """This step's bucket set (``p.grad`` no longer points into it once this returns), its loss scale noted."""
        buffers = self.sets.hand_off(keep_local=keep_local)
        self.fresh.value = False
        if self.loss_scale is not None:
            self.loss_scale.record(step)
        return buffers


    def zero_grad(self, set_to_none: bool) -> None:
        if self.fresh.value:
            raise RuntimeError("zero_grad() after backward() but before step() would discard this step's gradients; "
                               "call step() first (or the inner optimizer's zero_grad() to drop them on purpose)")
        # Views stay views (pipesgd.grads.bucket_sets): a None would make the next backward allocate gradients that
        # step() copies in again.
        self.sets.zero_grad(self.optimizer, set_to_none)

    def flush(self, pipeline: Pipeline, step: int, lookahead, staleness) -> list[StepStats]:
        """Every in-flight step applied (a peer still training is joined with zeros and told); buffers synced."""
        alone = self.channel.size == 1
        coarse = staleness.coarse if staleness is not None else None

        def shadow() -> None:  # a peer's job of this step, joined with zeros (then both raise, naming this rank)
            job = self.exchange
            if coarse is not None and pipeline.depth(step) > 1:  # as the peers' step() sends
                job = coarse.wrap(None, job)[1]
            job([b.empty().zero_() for b in self.buckets])

        if self.apply.unused.indices is None:  # no step yet: join the peers' first-step agreement (pipesgd.params)
            self.apply.unused.observe(self.fresh, step)
        finished = None if alone else self.channel.submit(self.participation.finish, step, shadow)
        applied = [self.apply(entry, step, lookahead) for entry in pipeline.flush()]
        if finished is not None:
            finished.wait()
        # Replicas whole for saving and evaluation (once every rank is known to have flushed): pipesgd.grads.buffers.
        synced = self.buffer_sync()
        if applied and synced is not None:
            applied[-1].t_buffers_s = synced
        return applied

    def use_exchange(self, config: WrapperConfig, allreduce: str | None) -> None:
        """A new exchange for ``config``'s codec; error-feedback residuals carried over where the codec's all-reduce
        stays the same (what is still owed)."""
        old = self.exchange
        self.exchange = new = config.build_exchange(self.channel.topology, dist.get_rank(), self.device, allreduce)
        if old.feedback is not None and new.feedback is not None and old.allreduce == new.allreduce:
            new.feedback.load_residuals_state(old.feedback.residuals_state())

    def close(self) -> None:
        if self.closer.detach() is not None:  # not closed yet
            self.background.close(warn=False)
        for hook in self.hooks:
            hook.remove()

