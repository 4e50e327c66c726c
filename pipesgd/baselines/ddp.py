"""PyTorch's DistributedDataParallel behind the trainer's optimizer-wrapper interface: the peer every claim
is measured against.

DDP averages gradients inside ``backward()`` (bucketed allreduce overlapped with the backward pass), so
its communication wait cannot be separated from compute: ``last_stats.t_wait_s`` is 0 and the trainer's
``t_compute`` holds backward plus all exposed communication. ``t_update_s`` is the optimizer step.
``bytes_sent`` is what a ring allreduce sends per rank for one gradient of M bytes, 2(p-1)/p * M,
halved by the fp16 compression hook (the hook's payload is half precision; DDP's backend may use another
algorithm than a ring, so this is the ring-equivalent volume, comparable across modes).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pipesgd.accounting import StepStats
from pipesgd.defaults import BUCKET_MB

DDP_HOOKS = ("none", "fp16")  # the comm hooks this adapter registers (the trainer's --ddp-hook choices)


def ring_allreduce_bytes(n_bytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``n_bytes``: reduce-scatter plus all-gather."""
    return 0 if world_size <= 1 else int(2 * (world_size - 1) * n_bytes / world_size)


class DDPOptimizer:
    """``DistributedDataParallel(model)`` plus a plain torch optimizer behind the trainer's wrapper seam
    (``pipesgd.wrapper.OptimizerWrapper``).

    Forward through ``ddp.model`` (the wrapped module) so that backward averages the gradients.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, hook: str = "none",
                 bucket_mb: float = BUCKET_MB, process_group: dist.ProcessGroup | None = None,
                 device_ids: list[int] | None = None) -> None:
        if hook not in DDP_HOOKS:
            raise ValueError(f"unknown DDP hook {hook!r} (valid: {', '.join(DDP_HOOKS)})")
        self.optimizer = optimizer
        self.hook = hook
        self.model = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_mb,
                                             process_group=process_group)
        if hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

            self.model.register_comm_hook(process_group, fp16_compress_hook)
        self.world_size = dist.get_world_size(process_group)
        raw = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self.compression_ratio = 2.0 if hook == "fp16" else 1.0
        self._bytes_per_step = ring_allreduce_bytes(int(raw / self.compression_ratio), self.world_size)
        self._step = 0
        self.last_stats = StepStats(step=-1, applied_step=None)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self) -> StepStats:
        """Apply this step's gradient (already averaged by DDP during backward)."""
        start = time.perf_counter()
        self.optimizer.step()
        stats = StepStats(step=self._step, applied_step=self._step, t_wait_s=0.0,
                          t_update_s=time.perf_counter() - start, bytes_sent=self._bytes_per_step,
                          compression_ratio=self.compression_ratio)
        self._step += 1
        self.last_stats = stats
        return stats

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def flush(self) -> list[StepStats]:
        """Nothing is ever in flight between steps in DDP."""
        return []

    def close(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "step": self._step, "hook": self.hook,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("hook", self.hook), ("world_size", self.world_size)):
            if state.get(key) != mine:
                raise ValueError(f"DDP state does not match: {key} is {state.get(key)!r}, expected {mine!r}")
        self.optimizer.load_state_dict(state["optimizer"])
        self._step = int(state["step"])
