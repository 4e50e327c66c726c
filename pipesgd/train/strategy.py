"""Build the optimizer wrapper a training mode uses; the only place the trainer chooses how gradients meet.

Every wrapper offers ``step()``, ``zero_grad()``, ``flush()``, ``last_stats``, ``state_dict()`` and
``load_state_dict()``. ``Strategy`` adds what the loop needs around it: the module to run forward
through (DDP's wrapper in ``ddp`` mode) and this process's role (parameter-server modes may dedicate
ranks to serving; workers shard the data by ``worker_rank`` / ``num_workers``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .config import TrainConfig


@dataclass(slots=True)
class Strategy:
    """The optimizer wrapper plus the role of this process."""

    opt: Any  # PipeSGD, DDPOptimizer or ParameterServer
    forward_model: nn.Module  # what the loop calls for the forward pass
    worker_rank: int  # index among the training workers (data shard)
    num_workers: int  # training workers (world size minus dedicated servers)
    is_server_only: bool  # a dedicated parameter server: serve(), never train

    @property
    def is_leader(self) -> bool:
        """The process that evaluates, prints and writes the config/summary records: worker 0."""
        return not self.is_server_only and self.worker_rank == 0


def build_inner_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def num_workers_for(cfg: TrainConfig, world_size: int) -> int:
    """How many ranks train (and share the data) before any wrapper exists, for validation."""
    return world_size - cfg.servers if cfg.mode.startswith("ps-") else world_size


def build_strategy(cfg: TrainConfig, model: nn.Module, device: torch.device) -> Strategy:
    inner = build_inner_optimizer(cfg, model)
    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.mode in ("pipe", "sync"):
        from pipesgd import PipeSGD

        opt = PipeSGD(inner, model, width=cfg.effective_width, compression=cfg.compression,
                      error_feedback=cfg.error_feedback, bucket_mb=cfg.bucket_mb, warmup_steps=cfg.warmup_steps,
                      check_replicas_every=cfg.check_replicas, timeout_s=cfg.timeout)
        return Strategy(opt, model, rank, world, False)
    if cfg.mode == "ddp":
        from pipesgd.baselines.ddp import DDPOptimizer

        device_ids = [device.index] if device.type == "cuda" else None
        opt = DDPOptimizer(inner, model, hook=cfg.ddp_hook, bucket_mb=cfg.bucket_mb, device_ids=device_ids)
        return Strategy(opt, opt.model, rank, world, False)
    from pipesgd.baselines import ParameterServer  # ps-sync | ps-async

    opt = ParameterServer(inner, model, mode=cfg.mode.removeprefix("ps-"), servers=cfg.servers,
                          push_every=cfg.push_every, pull_every=cfg.pull_every)
    return Strategy(opt, model, opt.worker_rank, opt.num_workers, bool(opt.is_server_only))
