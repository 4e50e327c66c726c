"""Build the optimizer wrapper a training mode uses; the only place the trainer chooses how gradients meet.

``Strategy`` adds what the loop needs around the wrapper: the module to run forward through (DDP's in ``ddp``
mode) and this process's role (parameter-server modes may dedicate ranks to serving). One builder per name of
``modes.MODES``; the inner optimizer comes from ``optimizers``."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from pipesgd.runlog import trace
from pipesgd.baselines.ddp import DDPOptimizer
from pipesgd.baselines.diloco import DiLoCo
from pipesgd.baselines.local_sgd import LocalSGD
from pipesgd.baselines.parameter_server import ParameterServer
from pipesgd.optimizer import PipeSGD
from pipesgd.options import PipeSGDOptions
from pipesgd.wrapper import OptimizerWrapper

from .modes import DDP_MODE, DILOCO_MODE, LOCAL_SGD_MODE, MODES, PS_TRAIN_MODES, RING_MODES
from .optimizers import build_inner_optimizer
from .precision import Precision, build_precision

if TYPE_CHECKING:  # a type only: the config imports modes and optimizers, never this module
    from .config import TrainConfig


@dataclass(slots=True)
class Strategy:
    """The optimizer wrapper plus the role of this process."""

    opt: OptimizerWrapper  # what the loop drives: step, zero_grad, flush, close, state
    forward_model: nn.Module  # what the loop calls for the forward pass
    worker_rank: int | None  # index among the training workers (data shard); None on a dedicated server
    num_workers: int  # training workers (world size minus dedicated servers)
    # A dedicated parameter server's whole part in the run (answer workers until each has flushed, then
    # share the final weights); None on every rank that trains.
    serve: Callable[[], None] | None = None
    precision: Precision = Precision("cpu")  # the autocast and loss scaling of forward/backward (--amp)

    @property
    def is_server_only(self) -> bool:
        return self.serve is not None

    @property
    def is_leader(self) -> bool:
        """The process that evaluates, prints and writes the config/summary records: worker 0."""
        return not self.is_server_only and self.worker_rank == 0


def trace_updates(optimizer: torch.optim.Optimizer) -> None:
    """While tracing, mark each ``optimizer.step()`` as an "update" span on the thread that runs it (torch's
    step pre/post hooks: the wrappers call the inner optimizer, so every mode's update is marked alike)."""
    started: dict[int, int] = {}  # thread id -> start (ns) of the step in progress on that thread

    def pre(*_) -> None:
        started[threading.get_ident()] = time.time_ns()

    def post(*_) -> None:
        start = started.pop(threading.get_ident(), None)
        if start is not None:
            trace.record("update", start, time.time_ns(), "update")

    optimizer.register_step_pre_hook(pre)
    optimizer.register_step_post_hook(post)


# -- the wrappers, by --mode ------------------------------------------------------------------------
def _ring(cfg: TrainConfig, inner: torch.optim.Optimizer, model: nn.Module, device: torch.device,
          precision: Precision) -> Strategy:
    opt = PipeSGD(inner, model, width=cfg.effective_width, compression=cfg.compression,
                  error_feedback=cfg.error_feedback, staleness=cfg.staleness, bucket_mb=cfg.bucket_mb,
                  warmup_steps=cfg.warmup_steps, options=pipesgd_options(cfg, precision))
    return Strategy(opt, model, dist.get_rank(), dist.get_world_size(), precision=precision)


def pipesgd_options(cfg: TrainConfig, precision: Precision) -> PipeSGDOptions:
    """The trainer's flags as PipeSGD's options."""
    return PipeSGDOptions(lookahead_standin=cfg.lookahead_standin, allreduce=cfg.allreduce, timeout_s=cfg.timeout,
                          max_grad_norm=cfg.clip_grad_norm or None, check_replicas_every=cfg.check_replicas,
                          buffers=cfg.buffers, grad_scaler=precision.scaler, auto_recheck_every=cfg.auto_recheck_every,
                          # Every rank runs the same number of steps (equal shards, one step count), so the
                          # per-step agreement on who still trains would only add a collective per step.
                          check_uneven=False)


def _ddp(cfg: TrainConfig, inner: torch.optim.Optimizer, model: nn.Module, device: torch.device,
         precision: Precision) -> Strategy:
    device_ids = [device.index] if device.type == "cuda" else None
    opt = DDPOptimizer(inner, model, hook=cfg.ddp_hook, bucket_mb=cfg.bucket_mb, device_ids=device_ids,
                       powersgd_rank=cfg.powersgd_rank, powersgd_start=cfg.warmup_steps, seed=cfg.seed)
    return Strategy(opt, opt.model, dist.get_rank(), dist.get_world_size(), precision=precision)


def _parameter_server(cfg: TrainConfig, inner: torch.optim.Optimizer, model: nn.Module,
                      device: torch.device, precision: Precision) -> Strategy:
    opt = ParameterServer(inner, model, mode=cfg.mode.removeprefix("ps-"), servers=cfg.servers,
                          push_every=cfg.push_every, pull_every=cfg.pull_every)
    if opt.is_server_only:
        return Strategy(opt, model, None, opt.num_workers, serve=opt.serve)
    return Strategy(opt, model, opt.worker_rank, opt.num_workers, precision=precision)


def _local_sgd(cfg: TrainConfig, inner: torch.optim.Optimizer, model: nn.Module, device: torch.device,
               precision: Precision) -> Strategy:
    device_ids = [device.index] if device.type == "cuda" else None
    opt = LocalSGD(inner, model, sync_every=cfg.sync_every, warmup_steps=cfg.warmup_steps,
                   accumulate=cfg.accumulate, device_ids=device_ids)
    return Strategy(opt, opt.model, dist.get_rank(), dist.get_world_size(), precision=precision)


def _diloco(cfg: TrainConfig, inner: torch.optim.Optimizer, model: nn.Module, device: torch.device,
            precision: Precision) -> Strategy:
    opt = DiLoCo(inner, model, sync_every=cfg.sync_every, outer_lr=cfg.outer_lr, outer_momentum=cfg.outer_momentum,
                 sync_delay=cfg.sync_delay)
    return Strategy(opt, model, dist.get_rank(), dist.get_world_size(), precision=precision)


_BUILDERS: dict[str, Callable[..., Strategy]] = {
    **dict.fromkeys(RING_MODES, _ring), DDP_MODE: _ddp, **dict.fromkeys(PS_TRAIN_MODES, _parameter_server),
    LOCAL_SGD_MODE: _local_sgd, DILOCO_MODE: _diloco,
}
assert tuple(_BUILDERS) == MODES, "a mode without a wrapper, or a wrapper without a mode"


def build_strategy(cfg: TrainConfig, model: nn.Module, device: torch.device) -> Strategy:
    """The wrapper of ``cfg.mode`` around a fresh inner optimizer (a collective: every rank calls it), with the
    run's precision (``--amp``) and, with ``--compile``, the forward compiled (the wrapper stays outside it)."""
    precision = build_precision(cfg.amp, device)
    inner = build_inner_optimizer(cfg.optimizer, model, cfg.lr, cfg.momentum, cfg.weight_decay)
    if trace.enabled():
        trace_updates(inner)
    strategy = _BUILDERS[cfg.mode](cfg, inner, model, device, precision)
    if cfg.compile:
        strategy.forward_model = torch.compile(strategy.forward_model)
    return strategy
