"""PyTorch's DistributedDataParallel behind the trainer's optimizer-wrapper interface: the peer every claim is
measured against.

DDP averages inside ``backward()``, so its wait cannot be told from compute: ``t_wait_s`` is 0 and ``t_compute``
holds all exposed communication. ``bytes_sent`` is the ring-equivalent volume, 2(p-1)/p * M per synced backward
pass, halved by the fp16 hook; PowerSGD's is counted per bucket as its hook sends (``ddp_hooks``)."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pipesgd.accounting import StepStats
from pipesgd.baselines.ddp_hooks import DDP_HOOKS, build_hook, ring_allreduce_bytes
from pipesgd.defaults import BUCKET_MB

__all__ = ["DDPOptimizer", "DDP_HOOKS", "ring_allreduce_bytes"]


def powersgd_bucket_mb(hook: str, bucket_mb: float, grad_bytes: int, process_group=None) -> float:
    """The bucket cap DDP gets: ``bucket_mb``, except PowerSGD on gloo gets one bucket for the whole gradient: PowerSGD
    issues a bucket's P and Q allreduces from callbacks of the first, so with several buckets the issue order varies
    between ranks, and gloo, which matches collectives by issue order, fails. NCCL is left as asked."""
    if hook != "powersgd" or dist.get_backend(process_group) == "nccl":
        return bucket_mb
    return max(bucket_mb, grad_bytes / 2**20 + 1.0)


class DDPOptimizer:
    """``DistributedDataParallel(model)`` plus a plain torch optimizer (``pipesgd.wrapper.OptimizerWrapper``); forward
    through ``.model``. ``powersgd_rank``, ``powersgd_start`` and ``seed`` configure PyTorch's ``PowerSGDState``."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, hook: str = "none",
                 bucket_mb: float = BUCKET_MB, process_group: dist.ProcessGroup | None = None,
                 device_ids: list[int] | None = None, powersgd_rank: int = 2, powersgd_start: int = 2,
                 seed: int = 0) -> None:
        if hook not in DDP_HOOKS:
            raise ValueError(f"unknown DDP hook {hook!r} (valid: {', '.join(DDP_HOOKS)})")
        if powersgd_rank < 1:
            raise ValueError(f"powersgd_rank must be at least 1 (got {powersgd_rank})")
        self.optimizer = optimizer
        self.hook = hook
        raw = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self.bucket_mb = powersgd_bucket_mb(hook, bucket_mb, raw, process_group)
        self.model = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=self.bucket_mb,
                                             process_group=process_group)
        self.world_size = dist.get_world_size(process_group)
        built = build_hook(hook, process_group, self.world_size, powersgd_rank=powersgd_rank,
                           start_iter=powersgd_start, seed=seed)
        self.hook_state, self._counted = built if built is not None else (None, None)
        if self._counted is not None:
            self.model.register_comm_hook(self.hook_state, self._counted)
        self.compression_ratio = 2.0 if hook == "fp16" else 1.0
        self._raw_bytes_per_step = ring_allreduce_bytes(raw, self.world_size)
        self._bytes_per_step = ring_allreduce_bytes(int(raw / self.compression_ratio), self.world_size)
        self._counts_bytes = hook == "powersgd"  # its volume changes at its start iteration: counted per bucket
        # Otherwise per synced backward pass: DDP prepares one allreduce in each forward that will backpropagate
        # with gradient sync on (outside no_sync()), so count those forwards.
        self._synced_passes = 0
        self.model.register_forward_pre_hook(self._count_synced_pass)
        self._step = 0
        self.last_stats = StepStats(step=-1, applied_step=None)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self) -> StepStats:
        """Apply this step's gradient (already averaged by DDP during backward)."""
        start = time.perf_counter()
        self.optimizer.step()
        t_update = time.perf_counter() - start
        sent = self._counted.take_bytes() if self._counts_bytes else self._bytes_per_step * self._synced_passes
        self._synced_passes = 0
        ratio = self._raw_bytes_per_step / sent if self._counts_bytes and sent else self.compression_ratio
        stats = StepStats(step=self._step, applied_step=self._step, t_wait_s=0.0, t_update_s=t_update,
                          bytes_sent=sent, compression_ratio=ratio)
        self._step += 1
        self.last_stats = stats
        return stats

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _count_synced_pass(self, module: DistributedDataParallel, _inputs) -> None:
        if torch.is_grad_enabled() and module.require_backward_grad_sync:
            self._synced_passes += 1

    def flush(self) -> list[StepStats]:
        """Nothing is ever in flight between steps in DDP."""
        return []

    def close(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "step": self._step, "hook": self.hook,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if self.hook == "powersgd":
            # PowerSGD's residuals and warm-start factors are keyed by DDP bucket, and DDP rebuilds its buckets
            # after the first iteration, so a resumed run's first step could meet them with another layout.
            raise ValueError("resuming a DDP run with the powersgd hook is not supported: PowerSGD's error-feedback "
                             "and warm-start state is keyed to DDP's bucket layout, which DDP rebuilds on restart")
        for key, mine in (("hook", self.hook), ("world_size", self.world_size)):
            if state.get(key) != mine:
                raise ValueError(f"DDP state does not match: {key} is {state.get(key)!r}, expected {mine!r}")
        self.optimizer.load_state_dict(state["optimizer"])
        self._step = int(state["step"])
